"""The side-by-side strategy benchmark (`manage.py bench`).

- `run`: runs every strategy (and the Flink peer, bench/flink_peer/peer.py) on a cluster it
  starts, writes bench.json, bench.md and bench.png, and the RESULTS.md tables;
- `harness`: what Backstop's runs and the peer's share (settings, resource sampler, comparison
  with the ground truth of console/policy/truth.py, measurement of a run's progress);
- `measure` (steady figures, fault schedule) and `report` (bench.md, bench.png): pure Python, no
  Django imports.

Faults are judged by the console's own measurement, console/policy/recovery.py.
"""
