"""Fault prediction, live through the controller: a drill schedule that keeps killing one node
raises the predicted fault rate of the stage on it, and through P_eff gives it a standby.

Real parts: the database, Redis, the drill task, fault injection (its kill lands on the node's
Celery queue), the controller's supervision tick and policy cycle, the training task and the
placement page. The node agents and the Spark stages are played at their Redis edge: usage
samples and heartbeats as an agent and a stage publish them, and the exit an agent reports for
each process a kill-node ended. Time runs for real with a 1 s prediction window.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from console.dash.placement import callbacks as placement_callbacks
from console.models import (
    ControlDecision,
    Job,
    MetricSample,
    Operator,
    PredictorTraining,
    Replica,
)
from console.policy.prediction import FEATURE_NAMES
from console.roles import ADMIN
from console.services import controller, prediction
from console.services import policy as policy_service
from console.services.control import cycle, observe
from infra import keys as control_keys
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from tests.agent_edge import publish_usage, queued
from tests.factories import NodeFactory, make_job
from workers import controller as controller_tasks
from workers import tasks

pytestmark = pytest.mark.django_db

NODES = ["fp-node-1", "fp-node-2", "fp-node-3"]
PRIOR = 0.05


@pytest.fixture
def drill_nodes(redis_conn, settings):
    """NODES' queues and usage cleared, and a fault rate limit that lets the drill run."""
    # Six drills a minute would be refused by the default limit; this drill runs one every 2 s.
    settings.FAULT_RATE_LIMIT_PER_MINUTE = 60
    node_keys = [k for n in NODES for k in (node_queue(n), control_keys.node_metrics(n))]
    redis_conn.delete(*node_keys)
    yield
    redis_conn.delete(*node_keys, *(control_keys.node_heartbeat(n) for n in NODES))


def queued_tasks(client, node: str) -> list[str]:
    """Names of the Celery tasks waiting on a node agent's queue."""
    return [name for name, _ in queued(client, node_queue(node))]


class StageHeartbeats:
    """What each live stage process writes every 0.5 s, its heartbeat (running a batch), from a
    thread of its own as the stage processes do: a controller loop slowed by a loaded machine
    must not make the stages look silent (a missed heartbeat is a failure of its own)."""

    def __init__(self, client, job: Job):
        self.client, self.job = client, job
        self.replicas: dict[str, str] = {}  # replica id -> role, as the controller last saw
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def follow(self, supervisor) -> None:
        """Beat for the replicas the supervisor runs now (called between its ticks)."""
        with self.lock:
            self.replicas = {r.id: r.role for r in supervisor.live()}

    def killed(self, replica_ids) -> None:
        with self.lock:
            for replica_id in replica_ids:
                self.replicas.pop(replica_id, None)
                self.client.delete(data_keys.heartbeat(self.job.key, replica_id))

    def _beat(self) -> None:
        while not self.stop.wait(0.5):
            with self.lock:
                for replica_id, role in self.replicas.items():
                    beat = {"state": "running", "role": role, "batches": 3,
                            "started_at": time.time()}  # fmt: skip
                    self.client.set(
                        data_keys.heartbeat(self.job.key, replica_id), json.dumps(beat), ex=3
                    )

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)


def agent_reports_kill_node(client, job: Job, node: str, supervisor, stages) -> list[str]:
    """What the node agent does with the kill-node task waiting on its queue: SIGKILL every
    process of the job on the node, then report each exit on the agents' event stream."""
    assert "backstop.agent.kill_node" in queued_tasks(client, node)
    client.delete(node_queue(node))
    killed = [r.id for r in supervisor.live() if r.spec.node == node]
    stages.killed(killed)
    for replica_id in killed:
        client.xadd(
            control_keys.agent_events(),
            {"job": job.key, "kind": "exit", "replica_id": replica_id, "returncode": "-9",
             "log_tail": ""},
        )  # fmt: skip
    return killed


def run_for(seconds: float, client, job: Job, supervisor, drill_node=None, drill_every=2.0):
    """The controller's loop for `seconds` (ticks, a policy cycle a second), the agents' and
    stages' side of it, and the drill on `drill_node` every `drill_every` seconds."""
    end = time.monotonic() + seconds
    next_drill = time.monotonic() + 0.5
    kills = 0
    with StageHeartbeats(client, job) as stages:
        stages.follow(supervisor)
        while time.monotonic() < end:
            busy = {drill_node: 1.8} if drill_node else {}  # the drilled node also runs hot
            publish_usage(client, NODES, busy)
            observe.update_nodes(client)
            if drill_node and time.monotonic() >= next_drill:
                result = controller_tasks.drill(job.pk, "kill-node", target_node=drill_node)
                assert result.endswith(": injected"), result
                kills += len(agent_reports_kill_node(client, job, drill_node, supervisor, stages))
                # From now, not from the missed time: a loop slowed by a loaded machine must not
                # catch up with kills in a row, which would make the fault rate of the newest
                # windows (held out to judge the model) differ from the ones it trained on.
                next_drill = time.monotonic() + drill_every
            for _ in range(4):
                controller.supervise_tick(job, supervisor, client)
                stages.follow(supervisor)
                time.sleep(0.25)
            cycle.policy_cycle(job, supervisor, client)
    return kills


def test_a_node_killed_again_and_again_raises_its_stages_fr_and_earns_a_standby(
    drill_nodes, redis_conn, users
):
    policy_service.change_policy(
        {
            # count's P is 0.52: passive under 0.55 with the prior (P_eff 0.53), active once
            # fr > 0.15 (P_eff = P + 0.2 * fr).
            "priority_threshold": 0.55,
            "fault_rate_prior": PRIOR,
            "prediction_window_s": 1.0,
            "prediction_min_samples": 10,
            "restart_initial_delay_s": 0.1,
            "restart_max_failures": 1000,
        },
        reason="fault prediction drill",
    )
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(redis_conn, NODES)
    job = make_job(status=Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE)
    plan = controller.launch_job(job)
    (stage,) = plan.stages
    assert stage.standby_node is None  # nothing active at launch: no standby
    killed_node = stage.primary_node
    job.mark_running("test")
    supervisor = observe.load_supervisor(redis_conn, job)

    # Quiet first: no model, every operator on the prior.
    run_for(8, redis_conn, job, supervisor)
    tasks.train_fault_predictor()
    count = Operator.objects.get(job=job, name="count")
    assert count.predicted_fault_rate == PRIOR and count.mode == Operator.Mode.PASSIVE
    assert count.fault_rate_source.startswith("prior")

    # Then the drill keeps killing the stage's node.
    kills = run_for(20, redis_conn, job, supervisor, drill_node=killed_node)
    assert kills >= 6
    failures = job.decisions.filter(kind=ControlDecision.Kind.FAILURE, node=killed_node)
    # Every kill the agent reported was recorded once.
    assert failures.count() == kills, [(d.at, d.replica_id, d.detail) for d in failures]

    result = tasks.train_fault_predictor()
    run = PredictorTraining.objects.latest("trained_at")
    assert result.startswith(f"predictor #{run.pk}: used"), result
    assert run.samples >= 20 and run.failures >= 5 and run.mse < run.prior_mse

    publish_usage(redis_conn, NODES, {killed_node: 1.8})  # the agents' next second
    observe.update_nodes(redis_conn)
    cycle.policy_cycle(job, supervisor, redis_conn)  # the next cycle reads the new model
    count.refresh_from_db()
    assert count.fault_rate_source == f"model #{run.pk} on {killed_node}"
    assert count.predicted_fault_rate > 4 * PRIOR
    assert count.mode == Operator.Mode.ACTIVE
    added = job.decisions.filter(kind=ControlDecision.Kind.ADD_STANDBY, stage=stage.name)
    assert added.exists()
    assert supervisor.has_standby(stage.name)
    standby_node = supervisor.placement_by_stage()[stage.name][1]
    assert standby_node != killed_node
    assert "backstop.agent.start_replica" in queued_tasks(redis_conn, standby_node)

    # The placement page shows the run and that it is in force.
    admin = users[ADMIN]
    *_, predictor_card, _host_reserve = placement_callbacks.refresh(1, user=admin)
    text = json.dumps(predictor_card, default=lambda c: c.to_plotly_json())
    assert f"In force: model #{run.pk}" in text
    assert "held-out MSE" in text


def test_the_policy_cycle_counts_every_jobs_failures_on_the_node_as_training_does():
    # node_fault_rate is "failures of any replica on the node per window": the live features
    # must count another job's failure there too, or the model sees other numbers than it
    # was trained on. A model that is just fr = node_fault_rate shows what was counted.
    node = NodeFactory(name="fp-shared-node")
    mine = make_job(name="mine", status=Job.Status.RUNNING)
    other = make_job(name="other", status=Job.Status.RUNNING)
    Replica.objects.create(job=mine, replica_id=f"{mine.key}/wc-1", stage="wc", node=node,
                           role=Replica.Role.PRIMARY)  # fmt: skip
    now = timezone.now()
    Replica.objects.filter(job=mine).update(started_at=now - timedelta(seconds=60))
    MetricSample.objects.create(
        at=now - timedelta(seconds=1), node=node, name="cpu_util", value=0.5
    )
    ControlDecision.objects.create(job=other, kind=ControlDecision.Kind.FAILURE, stage="x",
                                   node=node.name, at=now - timedelta(seconds=10))  # fmt: skip
    coefficients = dict.fromkeys(FEATURE_NAMES, 0.0) | {"node_fault_rate": 1.0}
    run = PredictorTraining.objects.create(
        window_s=5.0, history_s=600.0, samples=40, failures=4, prior=PRIOR, used=True,
        predictor={"prior": PRIOR, "min_rows": 20, "status": "trained", "intercept": 0.0,
                   "coefficients": coefficients},
    )  # fmt: skip
    config = policy_service.policy_in_force().to_config()
    rates = prediction.predicted_fault_rates(mine, {"split": "wc", "count": "wc"}, config, now)
    # One failure on the node within the last 10 windows: 1 / 10.
    expected = (0.1, f"model #{run.pk} on fp-shared-node")
    assert rates == {"split": expected, "count": expected}
