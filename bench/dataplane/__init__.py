"""Micro-benchmarks of the data plane, run without Django against a Redis of their own choosing
(`--redis-url`), each `python -m bench.dataplane.<name> --help`:

- `failover`: output gap and recovery after SIGKILL of a stage primary, restart from checkpoint
  against hot-standby promotion (judged by console/policy/recovery.py, as the console does);
- `throughput`: the highest sustained input rate per topology with p99 under 5 s;
- `batch_cost`: a stage's CPU at batch intervals of 1, 2, 3 or 6 s;
- `jvm_options`: a stage's CPU and memory with the JVM's default options and Backstop's;
- `worker_start`: what a fresh Spark Python worker costs before it connects back;
- `cpu_priority`: what a lower nice level (and autogroup) gives a stage process here.

Those that record figures write them to docs/RESULTS.md, section "Data plane" (util.py,
through bench/results.py).
"""
