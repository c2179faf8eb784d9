"""`manage.py density`: jobs of mixed topologies at once per job count, with faults (run.py),
and density.json's figures (report.py)."""
