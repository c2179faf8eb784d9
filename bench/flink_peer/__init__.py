"""The Flink peer of the strategy benchmark (`manage.py bench --peer flink`).

Two environments: `job.py` and `functions.py` run in Flink's Python workers (the interpreter of
`.venv-flink`, env.py; no Django, no PySpark), with the project root on PYTHONPATH; `bridge.py`,
`cluster.py`, `env.py` and `peer.py` (the harness, which needs Django) run in the project's.
This package module imports nothing, so the job's imports stay within the first set.
"""
