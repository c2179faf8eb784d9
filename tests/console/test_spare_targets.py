"""The warm-spare targets the controller publishes to the node agents, on a real Redis: a job
re-protecting a stage holds refills back for every job, until its hold expires."""

import pytest

from console.policy.config import PolicyConfig
from console.services.control.act import REFILL_HOLD_S, keep_warm_spares
from spark_runtime import keys as data_keys
from tests.agent_edge import publish_usage
from tests.factories import NodeFactory
from workers import keys as control_keys
from workers.redis_client import redis_client

pytestmark = pytest.mark.django_db

NODES = ["wt-node-1", "wt-node-2"]


@pytest.fixture
def client():
    client = redis_client()
    yield client
    client.delete(
        control_keys.spare_refill_hold(),
        *(k for n in NODES for k in (control_keys.node_heartbeat(n), control_keys.node_metrics(n),
                                     data_keys.spares_wanted(n))),
    )  # fmt: skip


def targets(client) -> dict[str, int]:
    return {n: int(client.get(data_keys.spares_wanted(n)) or 0) for n in NODES}


def test_a_re_protecting_job_holds_spare_refills_for_all_jobs(client):
    client.delete(control_keys.spare_refill_hold())
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(client, NODES)  # two idle nodes with no spares yet
    config = PolicyConfig(warm_spares_per_node=1)
    keep_warm_spares(client, config, reprotecting=True)
    assert targets(client) == {"wt-node-1": 0, "wt-node-2": 0}
    assert 0 < client.ttl(control_keys.spare_refill_hold()) <= REFILL_HOLD_S
    # Another job's cycle while the hold lasts starts no spare either.
    keep_warm_spares(client, config)
    assert targets(client) == {"wt-node-1": 0, "wt-node-2": 0}
    # Once no cycle has renewed it (the stage is protected again), spares are refilled.
    client.delete(control_keys.spare_refill_hold())
    keep_warm_spares(client, config)
    assert targets(client) == {"wt-node-1": 1, "wt-node-2": 1}
