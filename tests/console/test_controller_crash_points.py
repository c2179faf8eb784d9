"""A controller killed between two steps of a launch loses nothing: the next cycle repairs the
difference between what the saved state wants and what runs.

Real database and Redis, the controller's own functions; the node agents are played at their
Redis edge (heartbeats and usage samples in, Celery messages on their queues out).
"""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from console.models import Job
from console.services import controller
from console.services.control import act, observe
from spark_runtime import keys as data_keys
from tests.agent_edge import publish_usage, queued
from tests.factories import NodeFactory, make_job
from workers import keys as control_keys
from workers.queues import node_queue

pytestmark = pytest.mark.django_db

NODES = ["cp-node-1", "cp-node-2", "cp-node-3"]
NODE_QUEUES = [node_queue(n) for n in NODES]


@pytest.fixture
def client():
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.delete(*NODE_QUEUES)
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(client, NODES, ttl_s=30)
    yield client
    client.delete(*NODE_QUEUES, *(control_keys.node_heartbeat(n) for n in NODES))
    client.delete(*(control_keys.node_metrics(n) for n in NODES))


def asked(client, task: str) -> list[tuple[str, list]]:
    """(node, args) of every `task` message waiting on the nodes' queues."""
    return [
        (node, args)
        for node, queue in zip(NODES, NODE_QUEUES, strict=True)
        for name, args in queued(client, queue)
        if name == task
    ]


def test_a_launch_killed_before_its_replicas_were_asked_to_start_is_repaired(client):
    job = make_job(status=Job.Status.CREATED, strategy="local-restart")
    controller.launch_job(job)
    wanted = sorted(args[2] for _, args in asked(client, "backstop.agent.start_replica"))
    assert wanted  # the launch asked for its replicas
    # The controller died after saving its state and before the start messages went out: none
    # is on any queue, and no replica ever heartbeats.
    client.delete(*NODE_QUEUES)
    sup = observe.load_supervisor(client, job)
    assert sorted(r.id for r in sup.live()) == wanted
    # A new controller picks the saved state up once the replicas' start-up grace is over.
    for replica in sup.live():
        replica.since -= sup.startup_grace + 1
    for _ in range(len(wanted)):  # one event is acted on per tick
        controller.supervise_tick(job, sup, client)
    restarted = sorted(args[2] for _, args in asked(client, "backstop.agent.start_replica"))
    assert restarted == wanted


def test_the_input_is_asked_for_every_cycle_until_it_is_all_in(client):
    # A controller killed between marking the job running and starting its input: the next
    # cycle asks again (the agent leaves a running generator alone, a new one resumes).
    job = make_job(status=Job.Status.CREATED, strategy="local-restart")
    job.params = {"rate": 10, "count": 5}
    job.save(update_fields=["params"])
    controller.launch_job(job)
    sup = observe.load_supervisor(client, job)
    act.ensure_generator(job, sup, client)
    assert asked(client, "backstop.agent.start_generator") == []  # not before the job runs
    job.mark_running("test")
    act.ensure_generator(job, sup, client)
    act.ensure_generator(job, sup, client)
    asks = asked(client, "backstop.agent.start_generator")
    assert len(asks) == 2 and asks[0] == asks[1]
    node, args = asks[0]
    assert node == sup.placement_by_stage()[sup.stages[0]][0]
    assert args[:2] == [job.key, job.topology]
    client.delete(*NODE_QUEUES)
    for i in range(5):
        client.xadd(data_keys.input_stream(job.key), {"text": f"line {i}"})
    act.ensure_generator(job, sup, client)
    assert asked(client, "backstop.agent.start_generator") == []  # all the input is in
    client.delete(data_keys.input_stream(job.key), control_keys.generator_node(job.key))
