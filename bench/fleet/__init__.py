"""The fleet simulator (`manage.py fleet_sim`): the real controller processes, beat, PostgreSQL
and Redis supervising hundreds of simulated jobs on tens of simulated nodes.

Real: the Celery controller workers consuming the `control` queue (started as
infra.launcher.controller_argv starts them), beat, the database and Redis. Simulated at their
Redis edge: the node agents (heartbeats, usage samples, exit events; they pop their Celery
messages from their queue lists themselves) and the stage processes (heartbeats, replica entries,
progress records, control commands, fencing epochs).

- `services`: a private PostgreSQL (with pg_stat_statements) and Redis, and pointing this
  process's Django at them;
- `sim`: the simulated agents and stages, one process, a few threads, pipelined writes;
- `schedule`: the seeded fault schedule (process kills, node kills, one controller kill);
- `chaos`: the chaos run of the control plane (controllers paused, controllers killed in the
  middle of upgrades, operators' stops, rollbacks and confirms);
- `measure`: what is measured, and how (lease samples, fencing epochs, failure-to-action,
  controller CPU and memory, database and Redis load, table growth, page times);
- `run`: one size of the fleet from start to teardown, and a curve of sizes;
- `report`: fleet.json, the plot and the "Fleet scale" section of docs/RESULTS.md.
"""
