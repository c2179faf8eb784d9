"""The node agents, played at their Redis edge by tests that run the controller's functions
without agent processes: what an agent publishes about its node, and the Celery messages the
controller leaves on an agent's queue."""

from __future__ import annotations

import base64
import json
import time

from infra import keys as control_keys


def publish_usage(
    client,
    nodes,
    cpu_used: dict[str, float] | None = None,
    ttl_s=5,
    idle_spares: dict[str, int] | None = None,
    hosts: dict[str, str] | None = None,
    mem_used: float = 1024.0,
) -> None:
    """What each node agent publishes every second: a heartbeat and a usage sample (2 cores,
    4 GB; CPU used 0.2 cores unless `cpu_used` says otherwise; no idle spare unless
    `idle_spares` says otherwise; each node a host of its own unless `hosts` says otherwise;
    `mem_used` MiB each)."""
    for name in nodes:
        usage = {
            "at": time.time(),
            "cpu_total": 2.0,
            "cpu_used": (cpu_used or {}).get(name, 0.2),
            "mem_total": 4096.0,
            "mem_used": mem_used,
            "disk_throughput": 5.0,
            "disk_max_throughput": 200.0,
            "bw_used": 10.0,
            "bw_total": 1000.0,
            "processes": 1,
            "spares": (idle_spares or {}).get(name, 0),
            "host": (hosts or {}).get(name, f"host-of-{name}"),
        }
        payload = json.dumps(usage)
        client.set(control_keys.node_heartbeat(name), payload, ex=ttl_s)
        client.xadd(control_keys.node_metrics(name), {"sample": payload})


def queued(client, queue: str) -> list[tuple[str, list]]:
    """(task name, args) of the Celery messages waiting in `queue`, oldest first."""
    messages = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        messages.append((message["headers"]["task"], args))
    return messages


def task_args(client, queues: list[str], task: str) -> list[list]:
    """The args of every `task` message waiting on `queues`, queue by queue, oldest first."""
    return [args for queue in queues for name, args in queued(client, queue) if name == task]
