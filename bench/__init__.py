"""Every benchmark harness of Backstop, in one Django app (bench/apps.py).

- `bench.strategy`: the side-by-side strategy benchmark (`manage.py bench`): the same seeded
  workload and fault schedule under each strategy, checked against ground truth and measured by
  the console's recovery judgement (console/policy/recovery.py).
- `bench.flink_peer`: the same workload and faults on Apache Flink (`manage.py bench --peer
  flink`): the bridge, the PyFlink job and the standalone cluster, run from their own
  `.venv-flink`, and the harness that drives them.
- `bench.loadtest`: the bounded HTTP load test of the console (`manage.py loadtest`).
- `bench.dataplane`: micro-benchmarks of the data plane, run without Django
  (`python -m bench.dataplane.failover`, `.throughput`, `.batch_cost`, `.jvm_options`,
  `.worker_start`, `.cpu_priority`).
- `bench.results`: the one writer of docs/RESULTS.md that all of them use.

Imports: bench may import `console`, `infra` and `spark_runtime`; nothing in `console`,
`workers`, `spark_runtime` or `infra` may import bench. This module imports nothing: Flink's
Python workers import `bench.flink_peer` with neither Django nor PySpark installed.
"""
