"""The soak test (`manage.py soak`, issue 44): three jobs for a long run under a seeded schedule of
every fault kind and restarts of the control plane, on a cluster of the run's own.

- `schedule`: the seeded event schedule (pure);
- `processes`: the kind of each process of the run, from its command line (pure);
- `report`: soak.json's derived figures, the goals, the RESULTS.md text (pure);
- `run`: the run itself (services, cluster, jobs, events, audits, samples, teardown).
"""
