"""A Kafka job's lag and source cause, as the controller alerts on them: the policy's bound
(`kafka_lag_alert_records`, audited like every field), the lag of the stages' primaries only,
an alert once per condition however long it lasts, again when it comes back.

The lag entries and the stats fields are written into the real Redis the way the data plane
writes them (spark_runtime/kafka_source.py); the alerts go through the Celery task to
Django's test mailbox. Expected lags are computed here by hand."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.models import Alert, AlertRoute, Job, Policy, SentAlert
from console.policy.config import PolicyConfig
from console.redis import redis_client
from console.roles import ADMIN
from console.services import alert_routing, controller, kafka_status
from console.services.control import observe
from console.services.control.record import watch_kafka
from console.services.fleet import JobSlot, read_fleet_view
from console.services.policy import change_policy
from infra import keys as control_keys
from infra import tasks
from spark_runtime import keys as data_keys
from tests.agent_edge import publish_usage
from tests.console.test_reconcile_queries import CYCLE_QUERIES_MAX, stages_report
from tests.factories import NodeFactory, ReportSubscriptionFactory, make_job
from workers import reporting

pytestmark = pytest.mark.django_db

# Resolving one alert: lock its row, mark it resolved, find the routes that got its trigger,
# queue their resolves, the savepoint around it.
ALERT_CLEAR_QUERIES = 6
BROKER_DOWN = "broker 127.0.0.1:9092 does not answer: KafkaError{code=_TRANSPORT}"
TOPIC_GONE = "topic clicks does not exist on 127.0.0.1:9092"


def lag_entry(stage: str, partitions: dict[int, tuple[int, int]], at: float | None = None):
    """A lag entry as KafkaPlanReader._publish_lag writes it."""
    return json.dumps(
        {
            "stage": stage,
            "topic": "clicks",
            "at": time.time() if at is None else at,
            "partitions": {str(p): [read, end] for p, (read, end) in partitions.items()},
        }
    )


@pytest.fixture
def redis_keys():
    """The Redis client, and the job keys whose keys the test removes at its end."""
    conn = redis_client()
    keys_of = []
    yield conn, keys_of
    for key in keys_of:
        data_keys.delete_job_keys(conn, key)


@pytest.fixture
def kafka_job(redis_keys):
    conn, keys_of = redis_keys
    job = make_job(Job.Status.RUNNING, name="clicks-wc")
    Job.objects.filter(pk=job.pk).update(
        source={"kind": "kafka", "topic": "clicks"},
        sink={"kind": "kafka", "topic": "counts"},
        started_at=timezone.now() - timedelta(minutes=5),
    )
    job.refresh_from_db()
    keys_of.append(job.key)
    return job


@pytest.fixture
def sent(monkeypatch):
    """Alert tasks run at once through the worker's task, with JSON-encoded arguments as a
    broker would carry them; returns the (kind, since) of each task sent."""
    calls = []
    send_on = tasks.send

    def send(task, *args, **kwargs):
        if task != tasks.ALERT_KAFKA:
            return send_on(task, *args, **kwargs)  # the agents' tasks of a launch
        args = json.loads(json.dumps(args))
        calls.append((args[1], args[2]))
        return reporting.alert_kafka.apply(args=args).get()

    monkeypatch.setattr(tasks, "send", send)
    return calls


def config(limit: int) -> PolicyConfig:
    return replace(PolicyConfig(), kafka_lag_alert_records=limit)


# --- pure parts -------------------------------------------------------------------------------


def test_only_the_primaries_entries_count_and_the_lag_is_end_minus_read():
    entries = {
        "split-1": lag_entry("split", {0: (100, 900), 1: (50, 450)}, at=100.0),
        # The standby, paced behind on purpose, and an ended primary: not counted.
        "split-2": lag_entry("split", {0: (0, 900), 1: (0, 450)}, at=100.0),
        "split-0": lag_entry("split", {0: (0, 10), 1: (0, 10)}, at=50.0),
        "broken": "{not json",
    }
    (lag,) = kafka_status.primary_lags(entries, ["split-1", "broken"])
    assert lag.replica == "split-1" and lag.stage == "split" and lag.topic == "clicks"
    assert [(p.partition, p.read, p.end, p.lag) for p in lag.partitions] == [
        (0, 100, 900, 800),
        (1, 50, 450, 400),
    ]
    assert kafka_status.total_lag([lag]) == 800 + 400
    assert kafka_status.total_lag([]) is None
    # Two primaries of one stage for a moment (a promotion): the newer entry is the stage's.
    entries["split-3"] = lag_entry("split", {0: (890, 900), 1: (450, 450)}, at=101.0)
    (lag,) = kafka_status.primary_lags(entries, ["split-1", "split-3"])
    assert lag.replica == "split-3" and lag.total == 10
    # A read offset past the end it was compared with is no lag, not a negative one.
    (lag,) = kafka_status.primary_lags({"a": lag_entry("s", {0: (12, 10)})}, ["a"])
    assert lag.total == 0


def test_the_stats_hash_gives_dead_letters_per_stage_skipped_offsets_and_the_cause():
    stats = {"dead:split": "3", "dead:count": "1", "kafka:skipped": "40", "generated": "7"}
    assert kafka_status.dead_letters(stats) == {"count": 1, "split": 3}
    assert kafka_status.skipped_offsets(stats) == 40
    assert kafka_status.source_cause(stats) == ""
    assert kafka_status.source_cause({"kafka:source": TOPIC_GONE}) == TOPIC_GONE


def test_conditions_start_persist_and_clear_one_cycle_at_a_time():
    lag_over = kafka_status.conditions_now("", 1200, 1000)
    assert lag_over == {"lag": {"total": 1200, "limit": 1000}}
    assert kafka_status.conditions_now("", 1000, 1000) == {}  # at the bound is not over it
    assert kafka_status.conditions_now("", 10**9, 0) == {}  # 0: the lag alert is off
    assert kafka_status.conditions_now("", None, 1) == {}  # nothing published yet
    # First cycle over the bound: remembered, not alerted.
    start, gone, due = kafka_status.track({}, lag_over, 1000.0)
    assert (start, gone, due) == ({"lag": "1000.000"}, [], [])
    # The next cycle still over it: alerted, named by when it began.
    start, gone, due = kafka_status.track({"lag": "1000.000"}, lag_over, 1005.0)
    assert start == {} and gone == []
    assert [(a.kind, a.since, a.detail) for a in due] == [("lag", "1000.000", lag_over["lag"])]
    # A source that cannot read is alerted at its first cycle; the lag back under clears.
    source = kafka_status.conditions_now(BROKER_DOWN, 10, 1000)
    start, gone, due = kafka_status.track({"lag": "1000.000"}, source, 1010.0)
    assert start == {"source": "1010.000"} and gone == ["lag"]
    assert [(a.kind, a.since) for a in due] == [("source", "1010.000")]
    # A condition remembered from before the job's current run started begins again.
    start, gone, due = kafka_status.track({"lag": "1000.000"}, lag_over, 1020.0, 1015.0)
    assert (start, due) == ({"lag": "1020.000"}, [])


# --- the controller's step, real Redis and database ------------------------------------------


def test_a_lag_over_the_bound_for_two_cycles_alerts_once_and_again_when_it_comes_back(
    redis_keys, kafka_job, sent
):
    conn, _ = redis_keys
    ReportSubscriptionFactory(
        name="pager", recipients="pager@example.org", alert_on_job_failure=True
    )
    ReportSubscriptionFactory(name="reports only")  # asks for no alert: hears nothing
    lag_key = data_keys.kafka_lag(kafka_job.key)
    conn.hset(lag_key, "split-1", lag_entry("split", {0: (100, 900), 1: (50, 450)}))
    conn.hset(lag_key, "split-2", lag_entry("split", {0: (0, 900), 1: (0, 450)}))  # standby
    conditions = control_keys.kafka_conditions(kafka_job.key)

    assert watch_kafka(kafka_job, conn, config(1000), ["split-1"]) == []  # first cycle over
    since = conn.hget(conditions, "lag")
    assert since is not None and mail.outbox == []
    (due,) = watch_kafka(kafka_job, conn, config(1000), ["split-1"])
    assert (due.kind, due.since, due.detail["total"]) == ("lag", since, 1200)
    (email,) = mail.outbox
    assert email.to == ["pager@example.org"]
    assert email.subject == (
        "[Backstop] Kafka lag: clicks-wc is 1,200 records behind clicks (limit 1,000)"
    )
    assert "Lag: 1,200 records" in email.body
    assert "Stage split (split-1): 1,200 records: partition 0 800 (read 100, end 900), " \
        "partition 1 400 (read 50, end 450)" in email.body  # fmt: skip
    assert f"/console/jobs/{kafka_job.pk}/" in email.body

    # Still over (more so) for more cycles: the same condition, no second email.
    conn.hset(lag_key, "split-1", lag_entry("split", {0: (100, 1900), 1: (50, 450)}))
    for _ in range(3):
        watch_kafka(kafka_job, conn, config(1000), ["split-1"])
    assert len(mail.outbox) == 1 and sent == [("lag", since)] * 4
    # Caught up: the condition ends; over again later is a new one (two cycles, one email).
    conn.hset(lag_key, "split-1", lag_entry("split", {0: (800, 900), 1: (400, 450)}))
    watch_kafka(kafka_job, conn, config(1000), ["split-1"])
    assert conn.hget(conditions, "lag") is None
    conn.hset(lag_key, "split-1", lag_entry("split", {0: (0, 900), 1: (0, 450)}))
    watch_kafka(kafka_job, conn, config(1000), ["split-1"])
    watch_kafka(kafka_job, conn, config(1000), ["split-1"])
    assert len(mail.outbox) == 2 and "1,350 records behind" in mail.outbox[1].subject
    assert SentAlert.objects.filter(key__startswith=f"kafka-lag:{kafka_job.pk}:").count() == 2
    # The bound at 0 turns the alert off, however far behind.
    assert watch_kafka(kafka_job, conn, config(0), ["split-1"]) == []
    assert conn.hget(conditions, "lag") is None


def test_a_source_that_cannot_read_alerts_at_once_with_its_cause_once_per_outage(
    redis_keys, kafka_job, sent
):
    conn, _ = redis_keys
    ReportSubscriptionFactory(alert_recovery_over_s=30)
    stats = data_keys.stats(kafka_job.key)
    conn.hset(stats, mapping={"kafka:source": BROKER_DOWN, "dead:split": "2"})
    (due,) = watch_kafka(kafka_job, conn, config(0), [])
    assert due.kind == "source" and due.detail == {"cause": BROKER_DOWN}
    (email,) = mail.outbox
    assert email.subject == f"[Backstop] Kafka source not reading: clicks-wc: {BROKER_DOWN}"
    assert f"Cause: {BROKER_DOWN}" in email.body and "Topic: clicks" in email.body
    # The cause changes while the source still cannot read: the same outage, no new email.
    conn.hset(stats, "kafka:source", TOPIC_GONE)
    watch_kafka(kafka_job, conn, config(0), [])
    assert len(mail.outbox) == 1
    # It reads again (the source deletes the field), then the topic goes: a new alert.
    conn.hdel(stats, "kafka:source")
    assert watch_kafka(kafka_job, conn, config(0), []) == []
    assert conn.hgetall(control_keys.kafka_conditions(kafka_job.key)) == {}
    conn.hset(stats, "kafka:source", TOPIC_GONE)
    watch_kafka(kafka_job, conn, config(0), [])
    assert len(mail.outbox) == 2 and mail.outbox[1].subject.endswith(TOPIC_GONE)
    assert [kind for kind, _ in sent] == ["source"] * 3


def test_a_restarted_job_is_alerted_again_and_nothing_is_sent_when_nobody_asks(
    redis_keys, kafka_job, sent
):
    conn, _ = redis_keys
    stats = data_keys.stats(kafka_job.key)
    conn.hset(stats, "kafka:source", BROKER_DOWN)
    # Nobody asks for alerts: the condition is remembered, no task is sent.
    assert len(watch_kafka(kafka_job, conn, config(0), [])) == 1
    assert sent == [] and mail.outbox == []
    ReportSubscriptionFactory(alert_on_job_failure=True)
    watch_kafka(kafka_job, conn, config(0), [])
    assert len(mail.outbox) == 1
    # The job ran again since (started later than the condition began): a new outage.
    Job.objects.filter(pk=kafka_job.pk).update(started_at=timezone.now())
    kafka_job.refresh_from_db()
    watch_kafka(kafka_job, conn, config(0), [])
    assert len(mail.outbox) == 2


def test_a_job_without_kafka_is_not_watched(redis_keys, sent):
    conn, keys_of = redis_keys
    job = make_job(Job.Status.RUNNING, name="plain")
    keys_of.append(job.key)
    conn.hset(data_keys.stats(job.key), "kafka:source", BROKER_DOWN)  # not its to read
    assert watch_kafka(job, conn, config(1), ["split-1"]) == []
    assert not conn.exists(control_keys.kafka_conditions(job.key)) and sent == []


def test_the_policy_cycle_of_a_kafka_job_watches_its_primaries(redis_keys, sent):
    """Through the controller's reconcile: the supervisor's primaries are the ones counted,
    and a settled Kafka job's cycle stays within the query budget of any job's (watching
    costs no query until an alert is due)."""
    conn, keys_of = redis_keys
    nodes = ["kq-node-1", "kq-node-2"]
    for name in nodes:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(conn, nodes, ttl_s=60)
    job = make_job(Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE, params={"rate": 0})
    keys_of.append(job.key)
    controller.launch_job(job)
    job.mark_running("every primary is running")
    # The Kafka source is set after the launch: launching one would create its topics.
    Job.objects.filter(pk=job.pk).update(source={"kind": "kafka", "topic": "clicks"})
    job.refresh_from_db()
    change_policy({"kafka_lag_alert_records": 100}, reason="kafka lag test")
    supervisor = observe.load_supervisor(conn, job)
    first_stage = supervisor.stages[0]
    readers = [r for r in supervisor.live() if r.spec.stage == first_stage]
    for replica in readers:
        read = 0 if replica.role == "primary" else 900  # only the primary is behind
        conn.hset(
            data_keys.kafka_lag(job.key),
            replica.id,
            lag_entry(first_stage, {0: (read, 1000)}),
        )
    ReportSubscriptionFactory(alert_on_job_failure=True)
    slot = JobSlot(job=job, supervisor=supervisor)
    view = read_fleet_view(conn)
    for _ in range(2):
        stages_report(conn, job, supervisor)
        slot.next_cycle = 0.0
        assert controller.reconcile_job(job, supervisor, conn, view, slot)
    (email,) = mail.outbox
    assert "is 1,000 records behind clicks (limit 100)" in email.subject
    primary = next(r.id for r in readers if r.role == "primary")
    assert f"Stage {first_stage} ({primary}): 1,000 records" in email.body
    # Caught up: the next cycle ends the condition, within the cycle's query budget.
    conn.hset(data_keys.kafka_lag(job.key), primary, lag_entry(first_stage, {0: (990, 1000)}))
    stages_report(conn, job, supervisor)
    slot.next_cycle = 0.0
    with CaptureQueriesContext(connection) as queries:
        assert controller.reconcile_job(job, supervisor, conn, view, slot)
    statements = [q["sql"] for q in queries.captured_queries]
    # The cycle that ends a condition also resolves its alert (console.services.alert_routing
    # .clear_alert, in a savepoint); a cycle that changes no alert makes none of these.
    alerting = [sql for sql in statements if "console_alert" in sql or "SAVEPOINT" in sql]
    assert len(alerting) <= ALERT_CLEAR_QUERIES, alerting
    assert len(statements) - len(alerting) <= CYCLE_QUERIES_MAX, statements
    assert not conn.exists(control_keys.kafka_conditions(job.key))


# --- the policy field -------------------------------------------------------------------------


def test_the_bound_is_a_policy_field_checked_and_audited_in_the_api(api_as):
    api = api_as(ADMIN)
    assert api.get("/api/policy/").json()["kafka_lag_alert_records"] == 0
    for value, words in (
        (-1, "greater than or equal to 0"),  # the model field's own check comes first
        (10_000_001, "kafka_lag_alert_records: must be between 0 and 10000000"),
        (2.5, "A valid integer is required"),
        (True, "kafka_lag_alert_records: must be a number, not a boolean"),
    ):
        response = api.patch(
            "/api/policy/", {"kafka_lag_alert_records": value, "reason": "try"}, format="json"
        )
        assert response.status_code == 400, response.content
        detail = response.json()["error"]["detail"]
        assert words in detail["kafka_lag_alert_records"][0]
    response = api.patch(
        "/api/policy/", {"kafka_lag_alert_records": 50_000, "reason": "page on lag"}, format="json"
    )
    assert response.status_code == 201, response.content
    assert Policy.current().kafka_lag_alert_records == 50_000
    newest = api.get("/api/policy/history/").json()[0]
    assert (newest["reason"], newest["created_by"]) == ("page on lag", "ada")
    assert newest["changes"] == {"kafka_lag_alert_records": [0, 50_000]}


def test_the_bound_is_on_the_admin_form(client, users):
    admin = users[ADMIN]
    admin.is_staff = True
    admin.save()
    client.force_login(admin)
    data = {name: getattr(Policy.current(), name) for name in Policy.threshold_field_names()}
    response = client.post(
        "/admin/console/policy/add/",
        {**data, "kafka_lag_alert_records": 20_000_000, "reason": "too far"},
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["kafka_lag_alert_records"] == [
        "kafka_lag_alert_records: must be between 0 and 10000000"
    ]
    response = client.post(
        "/admin/console/policy/add/", {**data, "kafka_lag_alert_records": 5000, "reason": "ok"}
    )
    assert response.status_code == 302
    assert Policy.current().kafka_lag_alert_records == 5000
    assert Policy.current().changes_from_previous() == {"kafka_lag_alert_records": [0, 5000]}


def test_a_source_that_cannot_read_is_raised_between_cycles_and_the_lag_waits(
    redis_keys, kafka_job, monkeypatch
):
    """The controller's look between policy cycles (controller.watch_between_cycles) raises a
    Kafka source that cannot read at once; a lag over the bound is left to the cycles (it
    counts once over at two of them). No email from the look: the subscriptions' emails are
    the cycle's."""
    conn, _ = redis_keys
    monkeypatch.setattr(alert_routing, "enqueue", lambda ids: None)  # no worker here
    AlertRoute.objects.create(name="all", channel="webhook", target="http://127.0.0.1:9/")
    machine = type("Machine", (), {"active_stages": set(), "unprotected_since": {}, "failures": {}})
    slot = type("Slot", (), {"progress_seen": None})()
    lag_key = data_keys.kafka_lag(kafka_job.key)
    conn.hset(lag_key, "split-1", lag_entry("split", {0: (0, 90_000)}))
    config = replace(PolicyConfig(), kafka_lag_alert_records=10)
    controller.watch_between_cycles(kafka_job, machine, conn, config, slot)
    assert Alert.objects.count() == 0  # only a lag: the cycles' to decide
    conn.hset(data_keys.stats(kafka_job.key), "kafka:source", BROKER_DOWN)
    controller.watch_between_cycles(kafka_job, machine, conn, config, slot)
    controller.watch_between_cycles(kafka_job, machine, conn, config, slot)
    alert = Alert.objects.get()
    assert (alert.key, alert.state, alert.seen) == (f"kafka-source:{kafka_job.key}", "open", 1)
    assert alert.details == {"cause": BROKER_DOWN} and mail.outbox == []
