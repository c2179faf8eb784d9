"""The work of a node agent (workers/agent.py holds only its Celery tasks and signal hooks).

Lowest first, each module importing only modules listed before it:
`identity` (which node this is, what it has), `children` (the processes this agent started:
their registry, lookup, kill and exit reports), `spares` (warm spare keeping and handing),
`replicas` (a replica's start: running, restarted, warm or cold), `faults` (node faults: kill
node, pause, stress hogs, Spark process kills) and `loops` (the heartbeat, metrics and exit
loops).
"""
