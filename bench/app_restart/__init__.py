"""An existing app's restart, warm (Backstop) against cold (a `spark-submit` loop): `manage.py
bench --topology NAME@VERSION --strategies cold-restart,restart-all` (run.py)."""
