"""The placement page's host reserve: each host's measured free shares against the reserve, and
the standbys the reserve downgraded with why, from what agents and policy cycles publish in
Redis (real Redis and database; the agents and the cycle are played at their Redis edge)."""

from __future__ import annotations

import json
import re
import time

import pytest

from console.dash.placement import callbacks as placement_callbacks
from console.models import Policy
from console.policy.reserve import StandbyClaim
from console.roles import VIEWER
from infra import keys
from tests.dash.components import text_of
from tests.dash.seed import seed_console

pytestmark = pytest.mark.django_db

NODES = ("node-a", "node-b", "node-c")


@pytest.fixture
def agents_and_claims(redis_conn):
    """The seeded nodes' agents, two on one 4-core machine, a third on its own; cleared after."""
    published = [keys.reserve_claims(), *(keys.node_heartbeat(n) for n in NODES),
                 *(keys.node_metrics(n) for n in NODES)]  # fmt: skip
    redis_conn.delete(*published)
    yield
    redis_conn.delete(*published)


def publish(client, name: str, host: str, cpu_used: float, mem_used: float) -> None:
    usage = {"at": time.time(), "cpu_total": 4.0, "cpu_used": cpu_used, "mem_total": 8192.0,
             "mem_used": mem_used, "disk_throughput": 0.0, "disk_max_throughput": 200.0,
             "bw_used": 0.0, "bw_total": 1000.0, "processes": 1, "spares": 0,
             "host": host}  # fmt: skip
    client.set(keys.node_heartbeat(name), json.dumps(usage), ex=30)
    client.xadd(keys.node_metrics(name), {"sample": json.dumps(usage)})


def test_the_placement_page_shows_each_hosts_measured_reserve_and_the_downgraded_standbys(
    redis_conn, users, agents_and_claims
):
    seeded = seed_console(minutes=5)
    # node-a and node-b share machine "m1": 2.0 + 1.6 of its 4 cores (10% free), memory
    # 2048 + 2048 of 8192 (50% free). node-c alone on "m2": 1 core (75% free), 1024 MiB (88%).
    publish(redis_conn, "node-a", "m1", 2.0, 2048.0)
    publish(redis_conn, "node-b", "m1", 1.6, 2048.0)
    publish(redis_conn, "node-c", "m2", 1.0, 1024.0)
    reason = "reserve: host m1: cpu 10% / mem 50% free (measured) vs reserve 20%; ..."
    now = time.time()
    downgraded = StandbyClaim(
        f"{seeded.adaptive.key}:count", 0.62, "node-b", None, 0.5, 600.0, now, now - 42, reason
    )
    protected = StandbyClaim(
        f"{seeded.adaptive.key}:split", 0.5, "node-a", "node-c", 0.2, 300.0, now
    )
    unknown = StandbyClaim("job-gone:count", 0.9, "node-a", None, 0.5, 600.0, now, now, reason)
    redis_conn.hset(
        keys.reserve_claims(),
        mapping={c.key: json.dumps(c.to_dict()) for c in (downgraded, protected, unknown)},
    )

    *_, panel = placement_callbacks.refresh(1, user=users[VIEWER])
    _note, hosts, stages = panel
    _head, body = hosts.children.children  # the table in its scrolling wrapper
    rows = [text_of(row) for row in body.children]
    reserve = Policy.current().resource_reserve
    assert reserve == 0.2
    assert rows == [
        "m1 node-a, node-b 4.0 8,192 10% 50% 20% crossed",
        "m2 node-c 4.0 8,192 75% 88% 20% kept",
    ]
    text = text_of(stages)
    # Only the downgraded stage of a job in the database, with its priority, age and why.
    assert "wc-adaptive/count" in text and "0.620" in text
    age = int(re.search(r"(\d+) s ago", text).group(1))
    assert 42 <= age <= 42 + (time.time() - now) + 1  # downgraded 42 s before `now`
    assert reason in text
    assert "wc-adaptive/split" not in text and "job-gone" not in text
