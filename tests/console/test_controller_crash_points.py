"""A controller killed between two steps (of a launch, of handling a failure) loses nothing and
repeats nothing harmful: the next one repairs the difference between what the saved state wants
and what runs, and records each failure once.

Real database and Redis, the controller's own functions; the node agents are played at their
Redis edge (heartbeats and usage samples in, Celery messages on their queues out).
"""

from __future__ import annotations

import base64
import json
import time

import pytest

from console.models import ControlDecision, Job, RecoveryEpisode
from console.services import controller
from console.services.control import act, observe
from console.services.control.fence import acting_under
from infra import keys as control_keys
from infra import leases
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import RELEASED_PREFIX, judge, tenure_of
from spark_runtime.supervision import RestartPolicy, Supervisor, execute
from tests.agent_edge import publish_usage, queued
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db

NODES = ["cp-node-1", "cp-node-2", "cp-node-3"]
NODE_QUEUES = [node_queue(n) for n in NODES]


@pytest.fixture
def nodes_up(redis_conn):
    """NODES in the database, alive in Redis with a usage sample; their queues empty."""
    redis_conn.delete(*NODE_QUEUES)
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(redis_conn, NODES, ttl_s=30)
    yield
    redis_conn.delete(*NODE_QUEUES, *(control_keys.node_heartbeat(n) for n in NODES))
    redis_conn.delete(*(control_keys.node_metrics(n) for n in NODES))


def asked(client, task: str) -> list[tuple[str, list]]:
    """(node, args) of every `task` message waiting on the nodes' queues."""
    return [
        (node, args)
        for node, queue in zip(NODES, NODE_QUEUES, strict=True)
        for name, args in queued(client, queue)
        if name == task
    ]


def kills_asked(client) -> list[tuple[str, str | None]]:
    """(replica id, job key) of every kill_replica message waiting on the nodes' queues: a
    replica id names a process only with its job (ids repeat across jobs)."""
    found = []
    for queue in NODE_QUEUES:
        for raw in client.lrange(queue, 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] == "backstop.agent.kill_replica":
                args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
                found.append((args[0], kwargs.get("job_key")))
    return found


def test_a_launch_killed_before_its_replicas_were_asked_to_start_is_repaired(nodes_up, redis_conn):
    job = make_job(status=Job.Status.CREATED, strategy="local-restart")
    controller.launch_job(job)
    wanted = sorted(args[2] for _, args in asked(redis_conn, "backstop.agent.start_replica"))
    assert wanted  # the launch asked for its replicas
    # The controller died after saving its state and before the start messages went out: none
    # is on any queue, and no replica ever heartbeats.
    redis_conn.delete(*NODE_QUEUES)
    sup = observe.load_supervisor(redis_conn, job)
    assert sorted(r.id for r in sup.live()) == wanted
    # A new controller picks the saved state up once the replicas' start-up grace is over.
    for replica in sup.live():
        replica.since -= sup.startup_grace + 1
    for _ in range(len(wanted)):  # one event is acted on per tick
        controller.supervise_tick(job, sup, redis_conn)
    restarted = sorted(args[2] for _, args in asked(redis_conn, "backstop.agent.start_replica"))
    assert restarted == wanted


def test_the_input_is_asked_for_every_cycle_until_it_is_all_in(nodes_up, redis_conn):
    # A controller killed between marking the job running and starting its input: the next
    # cycle asks again (the agent leaves a running generator alone, a new one resumes).
    job = make_job(status=Job.Status.CREATED, strategy="local-restart")
    job.params = {"rate": 10, "count": 5}
    job.save(update_fields=["params"])
    controller.launch_job(job)
    sup = observe.load_supervisor(redis_conn, job)
    act.ensure_generator(job, sup, redis_conn)
    assert asked(redis_conn, "backstop.agent.start_generator") == []  # not before the job runs
    job.mark_running("test")
    act.ensure_generator(job, sup, redis_conn)
    act.ensure_generator(job, sup, redis_conn)
    asks = asked(redis_conn, "backstop.agent.start_generator")
    assert len(asks) == 2 and asks[0] == asks[1]
    node, args = asks[0]
    assert node == sup.placement_by_stage()[sup.stages[0]][0]
    assert args[:2] == [job.key, job.topology]
    redis_conn.delete(*NODE_QUEUES)
    for i in range(5):
        redis_conn.xadd(data_keys.input_stream(job.key), {"text": f"line {i}"})
    act.ensure_generator(job, sup, redis_conn)
    assert asked(redis_conn, "backstop.agent.start_generator") == []  # all the input is in
    redis_conn.delete(data_keys.input_stream(job.key), control_keys.generator_node(job.key))


def heartbeat(client, job: Job, replica_id: str, role: str) -> None:
    """What a running stage process writes every 0.5 s."""
    beat = {"state": "running", "role": role, "batches": 3, "started_at": time.time()}
    client.set(data_keys.heartbeat(job.key, replica_id), json.dumps(beat), ex=5)


def running_adaptive_job(client) -> tuple[Job, Supervisor]:
    """An adaptive job whose stage wc runs a primary (wc-1) and a standby (wc-2), as the
    controller saw them, with its state saved."""
    job = make_job(status=Job.Status.RUNNING, strategy="adaptive")
    sup = Supervisor(job.key, job.topology, {"wc": ("split", "count")}, job.strategy, NODES,
                     active_stages={"wc"})  # fmt: skip
    execute(sup.start(time.time()), act.AgentLauncher(job, client), lambda *a: None)
    heartbeat(client, job, "wc-1", "primary")
    heartbeat(client, job, "wc-2", "standby")
    for _ in range(2):
        controller.supervise_tick(job, sup, client)  # both replicas seen running
    observe.save_supervisor(client, job, sup)
    client.delete(*NODE_QUEUES)
    return job, sup


def test_a_controller_killed_after_acting_on_a_failure_records_it_once(nodes_up, redis_conn):
    # The tick carries out the promotion, then the controller dies before it saves its state:
    # the next controller loads the state from before the failure and sees the same exit again.
    job, sup = running_adaptive_job(redis_conn)
    redis_conn.delete(data_keys.heartbeat(job.key, "wc-1"))
    redis_conn.hset(control_keys.exits(job.key), "wc-1", json.dumps({"returncode": "-9"}))
    controller.supervise_tick(job, sup, redis_conn)  # promotes wc-2; killed before the save
    again = observe.load_supervisor(redis_conn, job)
    controller.supervise_tick(job, again, redis_conn)  # the next controller acts again

    failures = job.decisions.filter(kind=ControlDecision.Kind.FAILURE, replica_id="wc-1")
    assert failures.count() == 1
    assert RecoveryEpisode.objects.filter(job=job).count() == 1
    # Acting again is harmless: a standby that is primary already answers "promote" with its
    # epoch (StageRuntime's gate).
    promotes = [json.loads(c) for c in redis_conn.lrange(data_keys.control(job.key, "wc-2"), 0, -1)]
    assert promotes == [{"cmd": "promote"}, {"cmd": "promote"}]
    # The new controller goes on: wc-2 reports itself primary, and a new standby is asked for.
    heartbeat(redis_conn, job, "wc-2", "primary")
    controller.supervise_tick(job, again, redis_conn)
    assert [args[2] for _, args in asked(redis_conn, "backstop.agent.start_replica")] == ["wc-3"]


def test_a_controller_killed_while_a_job_stops_finishes_the_stop(nodes_up, redis_conn):
    job, sup = running_adaptive_job(redis_conn)
    job.request_stop("by the operator")
    # Killed after asking every replica and the generator to stop, before marking the job
    # stopped: the next controller finishes the stop instead of calling the state lost.
    act.stop_everything(job, sup, redis_conn)
    killed = {args[0] for _, args in asked(redis_conn, "backstop.agent.kill_replica")}
    assert killed == {"wc-1", "wc-2", f"generator-{job.key}"}
    assert {job_key for _, job_key in kills_asked(redis_conn)} == {job.key}
    # The next controller to hold the job finds no supervision state.
    assert observe.load_supervisor(redis_conn, job) is None
    controller.without_state(job, redis_conn)
    job.refresh_from_db()
    assert job.status == Job.Status.STOPPED
    assert job.status_reason == "by the operator"


def test_a_stop_whose_kills_were_refused_is_finished_by_the_next_holder(nodes_up, redis_conn):
    # Seen in the 200-job chaos run: a controller stopped a job and released its lease; another
    # took the lease before the agents read the kills, so they refused them (the lease was no
    # longer the sender's, released or not), and two processes outlived the stopped job.
    job, sup = running_adaptive_job(redis_conn)
    job.request_stop("by the operator")
    act.stop_everything(job, sup, redis_conn)
    job.mark_stopped("by the operator")
    redis_conn.delete(*NODE_QUEUES)  # refused by the agents: nothing was killed
    ended = dict(job.replicas.values_list("replica_id", "ended_at"))
    # The next controller takes the job and finds no supervision state.
    assert observe.load_supervisor(redis_conn, job) is None
    controller.without_state(job, redis_conn)
    killed = {args[0] for _, args in asked(redis_conn, "backstop.agent.kill_replica")}
    assert killed == {"wc-1", "wc-2", f"generator-{job.key}"}
    # Only the kills are repeated: the replicas' rows keep when they ended.
    assert dict(job.replicas.values_list("replica_id", "ended_at")) == ended
    job.refresh_from_db()
    assert job.status == Job.Status.STOPPED


def test_a_controller_killed_during_a_restart_backoff_restarts_the_replica_once(
    nodes_up, redis_conn
):
    job, sup = running_adaptive_job(redis_conn)
    sup.restart_policy = RestartPolicy(initial_delay_s=1.0, max_delay_s=1.0)

    def standby_exits() -> None:
        redis_conn.delete(data_keys.heartbeat(job.key, "wc-2"))
        redis_conn.hset(control_keys.exits(job.key), "wc-2", json.dumps({"returncode": "1"}))

    standby_exits()
    controller.supervise_tick(job, sup, redis_conn)  # the first failure in a row: restarted at once
    assert [args[2] for _, args in asked(redis_conn, "backstop.agent.start_replica")] == ["wc-2"]
    redis_conn.delete(*NODE_QUEUES)
    # The restarted standby fails again before a batch: its restart waits out the backoff. The
    # state is saved, then the controller dies before the backoff is over.
    standby_exits()
    controller.supervise_tick(job, sup, redis_conn)
    observe.save_supervisor(redis_conn, job, sup)
    assert asked(redis_conn, "backstop.agent.start_replica") == []
    again = observe.load_supervisor(redis_conn, job)
    time.sleep(1.1)
    controller.supervise_tick(job, again, redis_conn)  # the next controller: the backoff is over
    controller.supervise_tick(job, again, redis_conn)
    assert [args[2] for _, args in asked(redis_conn, "backstop.agent.start_replica")] == ["wc-2"]
    failures = job.decisions.filter(kind=ControlDecision.Kind.FAILURE, replica_id="wc-2")
    assert failures.count() == 2  # one per run of the replica


def test_a_controller_killed_as_a_promotion_completes_asks_for_the_same_new_standby(
    nodes_up, redis_conn
):
    # The new standby is in the saved state before its start is sent: a controller killed (or
    # paused past its lease) before its end-of-reconcile save leaves its successor a state that
    # names it, not an older one that gives its id out again. Seen in the fleet simulator's
    # chaos run before: the successor started window_count-3 a second time, on another node.
    job, sup = running_adaptive_job(redis_conn)
    redis_conn.delete(data_keys.heartbeat(job.key, "wc-1"))
    redis_conn.hset(control_keys.exits(job.key), "wc-1", json.dumps({"returncode": "-9"}))
    controller.supervise_tick(job, sup, redis_conn)  # promotes wc-2
    observe.save_supervisor(redis_conn, job, sup)
    heartbeat(redis_conn, job, "wc-2", "primary")  # the promotion completed
    controller.supervise_tick(job, sup, redis_conn)  # a new standby; killed before the save
    [(node, args)] = asked(redis_conn, "backstop.agent.start_replica")
    assert args[2] == "wc-3"
    again = observe.load_supervisor(redis_conn, job)
    assert again.replicas["wc-3"].spec.node == node
    assert controller.reissue_pending(job, again, redis_conn) == 1  # the next controller
    controller.supervise_tick(job, again, redis_conn)
    asks = [(n, a[2]) for n, a in asked(redis_conn, "backstop.agent.start_replica")]
    # The same replica on the same node both times: the agent leaves a running one alone.
    assert asks == [(node, "wc-3"), (node, "wc-3")]
    assert RecoveryEpisode.objects.filter(job=job).count() == 1


def start_messages(client) -> list[tuple[str, str, dict]]:
    """(node, replica id, kwargs) of every start_replica message waiting on the nodes' queues."""
    found = []
    for node, queue in zip(NODES, NODE_QUEUES, strict=True):
        for raw in client.lrange(queue, 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] == "backstop.agent.start_replica":
                args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
                found.append((node, args[2], kwargs))
    return found


def test_a_launch_acts_under_a_lease_and_a_controller_taking_over_sends_its_starts_again(
    nodes_up,
    redis_conn,
):
    job = make_job(status=Job.Status.CREATED, strategy="local-restart")
    controller.launch_job(job)
    launched = start_messages(redis_conn)
    [launch_token] = {kwargs["lease"] for _, _, kwargs in launched}
    assert launch_token.startswith("launch:") and tenure_of(launch_token) > 0
    # Given up for a controller to take: its starts count until one does.
    lease_key = control_keys.controller_lease(job.key)
    assert redis_conn.get(lease_key) == RELEASED_PREFIX + launch_token
    assert judge(launch_token, redis_conn.get(lease_key)).accepted

    # A controller takes the job before an agent got to the starts: they are refused now, and
    # its first reconcile of the job sends them again under its own lease.
    redis_conn.delete(*NODE_QUEUES)
    taker = leases.Leases(redis_conn, "ctl-taker", ttl_s=30)
    token = taker.try_acquire(job.key)
    assert not judge(launch_token, redis_conn.get(lease_key)).accepted
    supervisor = observe.load_supervisor(redis_conn, job)
    with acting_under(token):
        assert controller.reissue_pending(job, supervisor, redis_conn) == len(launched)
    again = start_messages(redis_conn)
    assert sorted((n, r) for n, r, _ in again) == sorted((n, r) for n, r, _ in launched)
    assert {kwargs["lease"] for _, _, kwargs in again} == {token}


def test_a_launch_waits_while_another_holds_the_jobs_lease(nodes_up, redis_conn):
    job = make_job(status=Job.Status.CREATED, strategy="local-restart")
    leases.Leases(redis_conn, "ctl-stopping-it", ttl_s=30).try_acquire(job.key)
    with pytest.raises(controller.LaunchBusy, match="ctl-stopping-it"):
        controller.launch_job(job)
    assert start_messages(redis_conn) == []
    assert not redis_conn.exists(control_keys.controller_state(job.key))
    job.refresh_from_db()
    assert job.status == Job.Status.CREATED
