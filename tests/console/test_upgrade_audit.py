"""The product's audit of an upgrade across its switch (console/services/upgrade_audit.py and the
controller task `audit_upgrade`): the output gap and the lost and duplicated results written on
the JobUpgrade, once, with a decision saying so; enqueued at the end and caught up by the
watchdog.

Real PostgreSQL/SQLite and Redis: the job's input, results and progress records are written as
the data plane writes them, built by hand so every figure is known.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from console.models import ControlDecision, Job, JobUpgrade, Policy
from console.policy.recovery import RecoverySettings, measure_switch
from console.roles import OPERATOR
from console.services import upgrade_audit, upgrade_control, upgrades
from infra import keys, tasks
from spark_runtime import keys as data_keys
from spark_runtime.progress import publish_progress
from spark_runtime.replicas import HeartbeatSeen
from spark_runtime.supervision import Supervisor
from tests.factories import make_job, progress_record
from workers import controller

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_flushed")]

SWITCH_S = 60.0  # seconds after the input started


@pytest.fixture
def sent(monkeypatch) -> list:
    """The tasks sent, instead of sending them to a broker."""
    calls = []
    monkeypatch.setattr(tasks, "send", lambda task, *args, **kw: calls.append((task, args)))
    return calls


def at(t0: float, seconds: float) -> datetime:
    return datetime.fromtimestamp(t0 + seconds, tz=UTC)


def bench_policy() -> None:
    """The settings the known answers below are worked out with (the benchmark test's)."""
    Policy(
        reason="test", recovery_stable_window_s=10.0, reference_window_s=30.0, warmup_s=30.0
    ).save()


def write_job_data(redis_conn, job: Job, t0: float) -> None:
    """Input from T0, results with one key missing and one too many, and one output batch a
    second for 125 s with none in [60, 64): the last output before the switch at 59.5 s, the
    first after it at 64.5 s."""
    first_id, second_id = f"{int(t0 * 1000)}-0", f"{int(t0 * 1000) + 500}-0"
    for entry_id, (uid, text) in ((first_id, ("u1", "a b")), (second_id, ("u2", "b c"))):
        fields = {"id": uid, "ts": str(int(t0 * 1000)), "text": text}
        redis_conn.xadd(data_keys.input_stream(job.key), fields, id=entry_id)
    position = int(t0 * 1000 + 500) * 1_000_000  # the second line's (see redis_source.entry_pos)
    redis_conn.hset(data_keys.results(job.key), mapping={"a": "1", "b": "3"})
    redis_conn.hset(
        data_keys.result_versions(job.key),
        mapping={"a": f"{position - 500 * 1_000_000:020d}{0:06d}", "b": f"{position:020d}{0:06d}"},
    )
    for second in range(125):
        if 60 <= second < 64:
            continue
        record = progress_record(
            at=t0 + second + 0.5, written=5, input_rows=100, latency_p50=0.5, latency_p90=0.8,
            latency_p99=1.0,
        )  # fmt: skip
        publish_progress(redis_conn, job.key, record)


def ended_upgrade(job: Job, t0: float, *, switched: bool = True, **fields) -> JobUpgrade:
    """A seeded upgrade of `job` confirmed 30 s after its switch at SWITCH_S (or never
    switched)."""
    values = {
        "job": job,
        "from_topology": job.topology,
        "to_topology": job.topology,
        "to_params": {"count.x": "1"},
        "case": JobUpgrade.Case.SEEDED,
        "stage": "count",
        "status": JobUpgrade.Status.CONFIRMED,
        "switched_at": at(t0, SWITCH_S) if switched else None,
        "ended_at": at(t0, SWITCH_S + 30),
        "outcome": "confirmed by otto",
        **fields,
    }
    return JobUpgrade.objects.create(**values)


def audit_decisions(job: Job) -> list[str]:
    return list(
        ControlDecision.objects.filter(job=job, detail__has_key=upgrade_audit.AUDITED)
        .order_by("at")
        .values_list("reason", flat=True)
    )


def test_the_task_writes_the_gap_and_the_lost_and_duplicated_results_once(redis_conn, users):
    bench_policy()
    job = make_job(status=Job.Status.RUNNING)  # wordcount: count reads the input
    t0 = float(int(time.time()) - 400)
    write_job_data(redis_conn, job, t0)
    upgrade = ended_upgrade(job, t0, ended_by=users[OPERATOR])

    result = controller.audit_upgrade.apply(args=(upgrade.pk,)).get()

    upgrade.refresh_from_db()
    # By hand: the output stopped after the batch at 59.5 s and came back at 64.5 s: a 5 s gap.
    # The input "a b", "b c" makes a=1, b=2, c=1; the results hold b=3 (one duplicated) and no
    # c (one lost), of 3 result cells.
    assert (upgrade.gap_s, upgrade.lost, upgrade.duplicates) == (5.0, 1, 1)
    expected = (
        f"upgrade {upgrade.pk} audited: gap 5 s, 1 lost, 1 duplicated of 3 results against "
        "wordcount's reference"
    )
    assert result == expected
    assert audit_decisions(job) == [expected]

    # Twice: nothing changes, even with other results meanwhile.
    redis_conn.hset(data_keys.results(job.key), "c", "1")
    again = controller.audit_upgrade.apply(args=(upgrade.pk,)).get()
    assert again == f"upgrade {upgrade.pk} is audited already"
    upgrade.refresh_from_db()
    assert (upgrade.gap_s, upgrade.lost, upgrade.duplicates) == (5.0, 1, 1)
    assert audit_decisions(job) == [expected]


def test_a_rolled_back_upgrade_is_audited_against_the_version_back_in_force(redis_conn):
    bench_policy()
    job = make_job(status=Job.Status.STOPPED)
    t0 = float(int(time.time()) - 400)
    write_job_data(redis_conn, job, t0)
    upgrade = ended_upgrade(
        job, t0, status=JobUpgrade.Status.ROLLED_BACK, outcome="rolled back by otto"
    )
    assert "audited: gap 5 s, 1 lost, 1 duplicated" in upgrade_audit.audit_upgrade(
        upgrade.pk, redis_conn
    )


def test_an_upgrade_without_a_switch_is_not_audited(redis_conn):
    bench_policy()
    job = make_job(status=Job.Status.RUNNING)
    t0 = float(int(time.time()) - 400)
    write_job_data(redis_conn, job, t0)
    never = ended_upgrade(
        job, t0, switched=False, status=JobUpgrade.Status.ROLLED_BACK, outcome="rolled back"
    )
    refused = ended_upgrade(
        job, t0, switched=False, status=JobUpgrade.Status.REFUSED, case=JobUpgrade.Case.REFUSED
    )
    for upgrade in (never, refused):
        assert "never switched or not ended" in upgrade_audit.audit_upgrade(upgrade.pk, redis_conn)
        upgrade.refresh_from_db()
        assert (upgrade.gap_s, upgrade.lost, upgrade.duplicates) == (None, None, None)
    assert audit_decisions(job) == []


def test_the_gap_is_recorded_only_once_its_measurement_is_final(redis_conn):
    """Judged 20 s after the switch, the output has not been back to normal for the stable
    window (10 s) and its smoothing (5 s) with 6 s of records still in flight: not audited yet;
    later it is."""
    bench_policy()
    job = make_job(status=Job.Status.RUNNING)
    t0 = float(int(time.time()) - 400)
    write_job_data(redis_conn, job, t0)
    upgrade = ended_upgrade(job, t0)
    early = upgrade_audit.audit_upgrade(upgrade.pk, redis_conn, now=t0 + SWITCH_S + 20)
    assert early == f"upgrade {upgrade.pk}: the output after the switch is not judged yet"
    assert audit_decisions(job) == []
    upgrade_audit.audit_upgrade(upgrade.pk, redis_conn, now=t0 + SWITCH_S + 40)
    upgrade.refresh_from_db()
    assert upgrade.gap_s == 5.0


def test_a_gap_is_unknown_once_the_records_before_the_switch_are_gone():
    records = [progress_record(at=100.0 + s + 0.5, written=5, input_rows=100) for s in range(60)]
    settings = RecoverySettings(band=0.15, stable_window_s=10.0, reference_window_s=30.0,
                                warmup_s=0.0)  # fmt: skip
    measured = measure_switch(
        records, 90.0, input_started_at=0.0, end=200.0, watch_ended=True, settings=settings
    )
    assert measured.final and measured.downtime_s is None
    assert measured.note == "the progress records from before the switch are gone"


def test_the_end_of_a_switched_upgrade_enqueues_its_audit(
    users, settings, sent, django_capture_on_commit_callbacks
):
    settings.CONTROLLER_DISPATCH = True
    job = make_job(Job.Status.RUNNING, topology="topn", name="tn")
    Policy.objects.create(upgrade_validation_s=30, reason="test")
    with django_capture_on_commit_callbacks(execute=True):
        upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    sup = Supervisor(job.key, "topn", {"topn": ("window_count", "topn")}, "local-restart",
                     ["node-1", "node-2"])  # fmt: skip
    sup.start(0.0)
    sup.handle(HeartbeatSeen("topn-1", 1.0, {"role": "primary", "state": "running"}))
    with django_capture_on_commit_callbacks(execute=True):
        upgrade_control.reconcile_upgrade(job, sup, 10.0)
        # Green caught up (no lag behind blue) takes over.
        for replica, role in (("topn-2", "standby"), ("topn-1", "standby"), ("topn-2", "primary")):
            sup.handle(
                HeartbeatSeen(
                    replica, 11.0, {"role": role, "state": "running", "lag_s": 0, "batches": 1}
                )
            )
        upgrade_control.reconcile_upgrade(job, sup, 11.0)
    assert [task for task, _ in sent] == [tasks.CHECK_UPGRADE]  # switched, not ended: no audit
    with django_capture_on_commit_callbacks(execute=True):
        # Green ran a batch as the primary, and the window is over: confirmed.
        beat = {"role": "primary", "state": "running", "batches": 2}
        sup.handle(HeartbeatSeen("topn-2", sup.upgrade.switched_at + 30, beat))
        upgrade_control.reconcile_upgrade(job, sup, sup.upgrade.switched_at + 31)
    upgrade.refresh_from_db()
    assert upgrade.status == JobUpgrade.Status.CONFIRMED
    assert sent[-1] == (tasks.AUDIT_UPGRADE, (upgrade.pk,))
    # The trail in the job's decisions: the request, green started, the switch, the end.
    reasons = list(
        ControlDecision.objects.filter(job=job, kind=ControlDecision.Kind.UPGRADE)
        .order_by("at", "pk")
        .values_list("reason", flat=True)
    )
    n = upgrade.pk
    assert reasons == [
        f"upgrade {n} requested by otto: topn -> topn with topn.n=3 (blue/green)",
        f"upgrade {n}: topn starts as topn-2 beside topn-1 (seeded)",
        f"upgrade {n}: new version starting and catching up",
        f"upgrade {n}: new version writes; the old one stands by",
        f"upgrade {n}: confirmed (the new version wrote for 30 s without a failure)",
    ]


def test_the_watchdog_catches_up_ended_upgrades_not_audited(redis_conn, sent):
    job = make_job(status=Job.Status.RUNNING)
    now = timezone.now()
    t0 = now.timestamp() - 400

    def ended(seconds_ago: float, **fields) -> JobUpgrade:
        upgrade = ended_upgrade(job, t0, **fields)
        JobUpgrade.objects.filter(pk=upgrade.pk).update(
            ended_at=now - timedelta(seconds=seconds_ago)
        )
        return upgrade

    lost = ended(60)  # its end's task was lost, or came before the gap was final
    recent = ended(10)  # its end's own task may still run
    ended(2 * 3600)  # long ago: its progress is trimmed
    ended(60, switched=False, status=JobUpgrade.Status.ROLLED_BACK)
    done = ended(60)
    ControlDecision.objects.create(
        job=job, kind=ControlDecision.Kind.UPGRADE, reason="audited",
        detail={upgrade_audit.AUDITED: done.pk},
    )  # fmt: skip

    assert upgrade_audit.enqueue_unaudited(redis_conn, now=now) == [lost.pk]
    assert sent == [(tasks.AUDIT_UPGRADE, (lost.pk,))]
    # Asked again only once CATCH_UP_EVERY_S has passed (the watchdog runs every 5 s).
    assert upgrade_audit.enqueue_unaudited(redis_conn, now=now + timedelta(seconds=5)) == []
    # 30 s later its request expired, and the recent one ended long enough ago.
    redis_conn.delete(keys.upgrade_audit_asked(job.key, lost.pk))
    later = now + timedelta(seconds=35)
    assert upgrade_audit.enqueue_unaudited(redis_conn, now=later) == [lost.pk, recent.pk]
