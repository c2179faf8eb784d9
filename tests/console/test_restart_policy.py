"""The controller's side of the restart policy, against the real Redis (state, exits, the Celery
queues the agents read) and the database: a crash-looping stage backs off, then fails the job with
its cause and log lines and asks for the alert; a restart resumes the same replica's checkpoint."""

from __future__ import annotations

import base64
import json
import shutil
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core import mail
from django.core.management import call_command

from console.models import ControlDecision, Job, MetricSample, Policy, SentAlert
from console.roles import OPERATOR
from console.services import alerts, controller
from console.services.control import act, observe
from console.services.fleet import JobSlot, read_fleet_view
from console.services.policy import change_policy
from infra import keys as control_keys
from infra.queues import CONTROL_QUEUE, node_queue
from spark_runtime import keys as data_keys
from spark_runtime.generators import generator_replica_id
from spark_runtime.supervision import RestartPolicy, Supervisor, execute
from tests.agent_edge import publish_usage, queued, task_args
from tests.factories import NodeFactory, ReportSubscriptionFactory, make_job

pytestmark = pytest.mark.django_db

# Node names of this module only: their queues are emptied between steps, and a cluster of
# another test run on the same Redis never reads or writes them.
NODES = ["rp-node-1", "rp-node-2", "rp-node-3"]
NODE_QUEUES = [node_queue(n) for n in NODES]


@pytest.fixture(autouse=True)
def node_queues_cleared(redis_conn):
    redis_conn.delete(*NODE_QUEUES)
    yield
    redis_conn.delete(*NODE_QUEUES)


def started_replicas(client) -> list[str]:
    return [args[2] for args in task_args(client, NODE_QUEUES, "backstop.agent.start_replica")]


def kills_on(client, queue: str) -> list[tuple[str, str | None]]:
    """(replica id, job key) of the kill_replica messages waiting in `queue`."""
    found = []
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == "backstop.agent.kill_replica":
            args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            found.append((args[0], kwargs.get("job_key")))
    return found


def fail(client, job: Job, replica_id: str, log_tail: str) -> None:
    """What an agent reports when the replica's process exits with code 1."""
    client.hset(control_keys.exits(job.key), replica_id, json.dumps({"returncode": 1}))
    client.hset(control_keys.exit_tails(job.key), replica_id, log_tail)


def launch(client, job: Job, policy: RestartPolicy) -> Supervisor:
    for name in NODES:
        NodeFactory(name=name)
    sup = Supervisor(job.key, job.topology, {"wc": ("split", "count")}, job.strategy, NODES,
                     restart_policy=policy)  # fmt: skip
    execute(sup.start(time.time()), act.AgentLauncher(job, client), lambda *a: None)
    client.delete(*NODE_QUEUES)
    return sup


def test_a_crash_loop_backs_off_then_fails_the_job_with_its_cause_and_alerts(redis_conn):
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    policy = RestartPolicy(initial_delay_s=0.2, max_failures=3, failure_window_s=60)
    sup = launch(redis_conn, job, policy)
    tail = "Traceback (most recent call last):\nPython worker failed to connect back"

    fail(redis_conn, job, "wc-1", tail)
    controller.supervise_tick(job, sup, redis_conn)  # the first failure restarts at once
    assert started_replicas(redis_conn) == ["wc-1"]
    redis_conn.delete(*NODE_QUEUES)

    fail(redis_conn, job, "wc-1", tail)
    controller.supervise_tick(job, sup, redis_conn)  # again before any batch: wait 0.2 s
    assert started_replicas(redis_conn) == []
    decision = job.decisions.filter(kind=ControlDecision.Kind.RESTART_STAGE).latest("at")
    assert "restart wc-1 in 0.2 s (backoff" in decision.reason
    time.sleep(0.3)
    controller.supervise_tick(job, sup, redis_conn)
    assert started_replicas(redis_conn) == ["wc-1"]
    assert job.decisions.filter(reason__startswith="backoff over: restart wc-1").exists()

    alert = ("backstop.alert_job_failed", [job.pk])
    alerts_before = queued(redis_conn, CONTROL_QUEUE).count(alert)  # the queue is shared: count
    fail(redis_conn, job, "wc-1", tail)
    controller.supervise_tick(job, sup, redis_conn)  # the third failure within 60 s: give up
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    cause, _, log_lines = job.status_reason.partition("\n")
    assert cause == "gave up: wc: 3 primary failures within 60 s (last: wc-1, process exited (1))"
    assert log_lines.strip().endswith("Python worker failed to connect back")
    assert job.decisions.filter(kind=ControlDecision.Kind.GIVE_UP).count() == 1
    assert queued(redis_conn, CONTROL_QUEUE).count(alert) == alerts_before + 1
    generator = generator_replica_id(job.key)
    for name in NODES:
        assert (generator, job.key) in kills_on(redis_conn, node_queue(name))
    assert set(job.replicas.values_list("state", flat=True)) == {"failed"}
    # The verdict is kept with the state for a relaunch; supervision stops.
    observe.save_supervisor(redis_conn, job, sup)
    assert observe.load_supervisor(redis_conn, job).gave_up.startswith("wc: 3 primary failures")


def report_failure(client, job: Job, sup: Supervisor, replica_id: str, cause: str) -> None:
    """What a stage whose query failed writes into its own entry before it exits (its process
    started when it was asked for)."""
    started_at, now = sup.replicas[replica_id].launched_at, time.time()
    entry = {"replica": replica_id, "state": "failed", "error": cause, "started_at": started_at,
             "failed_at": now, "updated": now}  # fmt: skip
    client.hset(data_keys.replicas(job.key), replica_id, json.dumps(entry))


def test_a_stage_failing_with_the_same_cause_fails_the_job_saying_why_and_alerts(redis_conn):
    """The issue's case: a stage whose Python workers cannot import pyarrow fails each start
    the same way. The policy's same_cause_failures_limit (3) ends it at the third failure in
    a row, long before the failure rate (8 within 600 s) would, with the cause on the job."""
    Policy(reason="fast backoff for the test", restart_initial_delay_s=0.1).save()
    config = Policy.current().to_config()
    assert (config.same_cause_failures_limit, config.restart_max_failures) == (3, 8)
    job = make_job(name="wc", status=Job.Status.RUNNING, strategy="local-restart")
    sup = launch(redis_conn, job, controller.restart_policy_of(config))
    subscription = ReportSubscriptionFactory(alert_on_job_failure=True)
    cause = "ModuleNotFoundError: No module named 'pyarrow'"
    tail = (
        "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'pyarrow'"
    )

    # First failure: the stage wrote its cause and deleted its heartbeat, its exit is not
    # reported yet. Within its start-up grace, but it said it failed: restarted at once.
    report_failure(redis_conn, job, sup, "wc-1", cause)
    controller.supervise_tick(job, sup, redis_conn)
    assert started_replicas(redis_conn) == ["wc-1"]
    redis_conn.delete(*NODE_QUEUES)
    # Second: it exits with code 1 (the agent's report) after writing the same cause: backoff.
    report_failure(redis_conn, job, sup, "wc-1", cause)
    fail(redis_conn, job, "wc-1", tail)
    controller.supervise_tick(job, sup, redis_conn)
    assert started_replicas(redis_conn) == []
    time.sleep(0.2)
    controller.supervise_tick(job, sup, redis_conn)
    assert started_replicas(redis_conn) == ["wc-1"]
    redis_conn.delete(*NODE_QUEUES)

    alert = ("backstop.alert_job_failed", [job.pk])
    alerts_before = queued(redis_conn, CONTROL_QUEUE).count(alert)
    report_failure(redis_conn, job, sup, "wc-1", cause)
    fail(redis_conn, job, "wc-1", tail)
    controller.supervise_tick(job, sup, redis_conn)  # the third in a row: failed for good
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    verdict, _, log_lines = job.status_reason.partition("\n")
    assert verdict == (
        "gave up: wc: primary failed 3 times in a row with the same cause: ModuleNotFoundError: "
        "No module named 'pyarrow'; not restarting (policy same_cause_failures_limit=3)"
    )
    assert "last log lines of wc-1:" in log_lines
    assert log_lines.strip().endswith(cause)
    failures = job.decisions.filter(kind=ControlDecision.Kind.FAILURE).order_by("at")
    assert [d.reason for d in failures] == [
        f"wc-1: query failed: {cause}",
        f"wc-1: exited with code 1 (query failed): {cause}",
        f"wc-1: exited with code 1 (query failed): {cause}",
    ]
    assert job.decisions.filter(kind=ControlDecision.Kind.GIVE_UP).count() == 1
    assert set(job.replicas.values_list("state", flat=True)) == {"failed"}
    # The alert is asked for, and what the alert task sends names the cause.
    assert queued(redis_conn, CONTROL_QUEUE).count(alert) == alerts_before + 1
    assert alerts.alert_job_failed(job) == 1
    (email,) = mail.outbox
    assert email.subject == "[Backstop] Job failed: wc"
    assert "failed 3 times in a row with the same cause: ModuleNotFoundError" in email.body
    assert SentAlert.objects.filter(subscription=subscription).count() == 1


def test_restarting_a_failed_job_resumes_its_replicas_checkpoints(redis_conn, api_as):
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    sup = launch(redis_conn, job, RestartPolicy(max_failures=2, failure_window_s=60))
    for _ in range(2):
        fail(redis_conn, job, "wc-1", "boom")
        controller.supervise_tick(job, sup, redis_conn)
    observe.save_supervisor(redis_conn, job, sup)
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    redis_conn.delete(*NODE_QUEUES)

    operator = api_as(OPERATOR)
    response = operator.post(f"/api/jobs/{job.pk}/restart/")
    assert response.status_code == 202, response.content
    # What the launch task does with it (tests do not dispatch tasks):
    controller.launch_job(job)
    job.refresh_from_db()
    assert job.status == Job.Status.STARTING
    (start,) = [
        args for q in NODE_QUEUES for name, args in queued(redis_conn, q) if "start_replica" in name
    ]
    argv = start[1]
    assert argv[argv.index("--checkpoint-dir") + 1].endswith(f"{job.key}/wc/wc-1")
    assert observe.load_supervisor(redis_conn, job).gave_up is None

    # A live job cannot be restarted: a JSON 409 naming why.
    response = operator.post(f"/api/jobs/{job.pk}/restart/")
    assert response.status_code == 409
    assert "only a failed or stopped job can be restarted" in response.json()["error"]["detail"]


def test_the_restart_policy_in_force_comes_from_the_audited_policy():
    config = Policy.current().to_config()
    assert controller.restart_policy_of(config) == RestartPolicy(
        initial_delay_s=config.restart_initial_delay_s,
        max_delay_s=config.restart_max_delay_s,
        max_failures=config.restart_max_failures,
        failure_window_s=config.restart_failure_window_s,
        same_cause_failures_limit=config.same_cause_failures_limit,
    )


def test_spares_are_released_when_no_live_job_can_use_them(redis_conn):
    for name in NODES:
        NodeFactory(name=name)
        redis_conn.set(data_keys.spares_wanted(name), 2)  # left by an adaptive job that ended
    adaptive = make_job(status=Job.Status.RUNNING, strategy="adaptive")
    make_job(status=Job.Status.RUNNING, strategy="restart-all")
    assert not act.release_unused_spares(redis_conn)  # the adaptive job may take them over
    assert {redis_conn.get(data_keys.spares_wanted(n)) for n in NODES} == {"2"}
    Job.objects.filter(pk=adaptive.pk).update(status=Job.Status.STOPPED)
    assert act.release_unused_spares(redis_conn)  # only the plain-Spark baseline runs
    assert {redis_conn.get(data_keys.spares_wanted(n)) for n in NODES} == {"0"}
    redis_conn.delete(*(data_keys.spares_wanted(n) for n in NODES))


def test_spares_are_kept_while_an_app_runs_under_restart_all(redis_conn, tmp_path, monkeypatch):
    # An existing app's restart takes over a warm spare (SupervisorState.takes_warm_spares).
    jobs = tmp_path / "jobs"
    shutil.copytree(Path(__file__).resolve().parents[2] / "jobs" / "apps", jobs / "apps")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(jobs))
    call_command(
        "register_topology", app="apps/window_counts.py", name="windows", stdout=StringIO()
    )
    for name in NODES:
        NodeFactory(name=name)
        redis_conn.set(data_keys.spares_wanted(name), 1)
    app = make_job(status=Job.Status.RUNNING, topology="windows@1", strategy="restart-all")
    assert not act.release_unused_spares(redis_conn)
    assert {redis_conn.get(data_keys.spares_wanted(n)) for n in NODES} == {"1"}
    Job.objects.filter(pk=app.pk).update(status=Job.Status.STOPPED)
    assert act.release_unused_spares(redis_conn)
    redis_conn.delete(*(data_keys.spares_wanted(n) for n in NODES))


def test_a_reconcile_that_gives_up_starts_nothing_more(redis_conn):
    # Seen in the demo: the tick gave up on the job, then the same round's policy cycle found a
    # stage without standby and started one for the failed job.
    job = make_job(status=Job.Status.RUNNING, strategy="adaptive")
    sup = launch(redis_conn, job, RestartPolicy(max_failures=2, failure_window_s=60))
    publish_usage(redis_conn, NODES, ttl_s=30)  # live agents: a policy cycle would place standbys
    fail(redis_conn, job, "wc-1", "boom")
    controller.supervise_tick(job, sup, redis_conn)
    observe.save_supervisor(redis_conn, job, sup)
    redis_conn.delete(*NODE_QUEUES)
    fail(redis_conn, job, "wc-1", "boom")  # the reconcile's tick gives up

    # One reconcile of the fleet supervision, with the policy cycle due.
    view = read_fleet_view(redis_conn)
    live = controller.reconcile_job(job, sup, redis_conn, view, JobSlot(job=job, supervisor=sup))
    assert live is False
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert started_replicas(redis_conn) == []
    assert not job.decisions.filter(kind=ControlDecision.Kind.ADD_STANDBY).exists()
    assert not MetricSample.objects.filter(job=job, name="priority").exists()  # no policy cycle
    redis_conn.delete(*(control_keys.node_heartbeat(n) for n in NODES))


def test_a_replica_starts_with_the_light_input_wait_of_the_policy_in_force(redis_conn):
    """The controller's start command carries the audited policy's light_input_wait_s; at 0
    it carries none (the stage's default: input never held)."""
    for name in NODES:
        NodeFactory(name=name)

    def started_with(wait_s: float) -> list[str]:
        change_policy({"light_input_wait_s": wait_s}, reason="idle replicas")
        job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
        sup = Supervisor(job.key, job.topology, {"wc": ("split", "count")}, job.strategy, NODES)
        execute(sup.start(time.time()), act.AgentLauncher(job, redis_conn), lambda *a: None)
        (args,) = [args for queue in NODE_QUEUES for _, args in queued(redis_conn, queue)]
        redis_conn.delete(*NODE_QUEUES)
        return args[1]  # start_replica(module, stage args, replica id, job)

    held = started_with(3.5)
    assert held[held.index("--light-input-wait-s") + 1] == "3.5"
    assert "--light-input-wait-s" not in started_with(0.0)
