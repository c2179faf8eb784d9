"""The placement page's host reserve: each host's measured use against the reserve, and the
standbys the reserve downgraded to checkpoint-only with why (what the controllers' policy
cycles publish: console/services/control/reserve.py)."""

from __future__ import annotations

import time

from django.db.models import QuerySet

from console.models import Job
from console.policy.reserve import fresh_claims
from console.redis import redis_client
from console.services.control.observe import alive_nodes, node_history
from console.services.control.reserve import current_loads, read_claims


def host_reserve(jobs: QuerySet | None = None) -> dict:
    """{"hosts": one row per host with its nodes, cores, memory and measured free shares,
    "downgraded": one row per stage of `jobs` (every job by default) whose standby the reserve
    took, with its priority, since when and why}."""
    client = redis_client()
    beats = alive_nodes(client)
    loads = current_loads(node_history(client, beats), beats)
    hosts = []
    for load in sorted(loads.values(), key=lambda load: load.host):
        cpu_free, mem_free = load.free_shares()
        hosts.append({**load.to_dict(), "cpu_free": cpu_free, "mem_free": mem_free})
    now = time.time()
    downgraded = [c for c in fresh_claims(read_claims(client), now) if c.downgraded_at]
    visible = Job.objects.all() if jobs is None else jobs
    names = dict(
        visible.filter(key__in={c.key.split(":", 1)[0] for c in downgraded}).values_list(
            "key", "pk"
        )
    )
    job_names = dict(Job.objects.filter(pk__in=names.values()).values_list("pk", "name"))
    rows = []
    for claim in sorted(downgraded, key=lambda c: (-c.priority, c.key)):
        job_key, stage = claim.key.split(":", 1)
        if job_key in names:
            rows.append(
                {
                    "job_id": names[job_key],
                    "job": job_names[names[job_key]],
                    "stage": stage,
                    "priority": claim.priority,
                    "since_s": now - claim.downgraded_at,
                    "reason": claim.reason,
                }
            )
    return {"hosts": hosts, "downgraded": rows}
