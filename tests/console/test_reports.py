"""Reports and alerts: exact figures from factory data, rendering, scheduling, sending, alerts.

Expected figures are worked out by hand from the factory data below, never by calling the code
under test.
"""

import json
from datetime import timedelta

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from console.models import Job, JobUpgrade, Policy, ReportSubscription, SentAlert
from console.roles import ADMIN, OPERATOR
from console.services import alerts, reports
from console.services.policy import change_policy
from tests.factories import (
    EpisodeFactory,
    MetricFactory,
    NodeFactory,
    ReportSubscriptionFactory,
    UserFactory,
    make_job,
)
from workers import reporting

pytestmark = pytest.mark.django_db

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def period_data(users):
    """Two jobs in scope, one out of scope, node samples and a policy change, all in the last day.

    Hand-computed figures for the 24 hours before `now`:
      wc / adaptive: recoveries 2, 4, 9 s -> 3 episodes, mean 5.0, worst 9.0; downtime
        1.0 + 1.5 + 3.5 = 6.0 s; peak p99 max(120, 480, 300) = 480 ms; lost 0+2+1 = 3;
        duplicates 1+0+0 = 1. (An episode 30 hours ago is outside the period.)
      wc / restart-all: one recovery of 30 s, downtime 25 s, p99 2000 ms, lost 0, dup 7.
      clicks / local-restart: one recovered in 12.5 s (downtime 10, p99 250, lost 4, dup 0) and
        one still open (no figures) -> 2 episodes, 1 open, mean = worst = 12.5, lost 4, dup 0.
      policy: v1 (baseline) sets priority_threshold 0.3, v2 by ada sets it to 0.5.
      node-1 cpu 0.2, 0.6 (mean 0.4, max 0.6), mem 0.5, 0.5; node-2 cpu 0.7, mem 0.8;
        cluster cpu mean (0.2 + 0.6 + 0.7) / 3 = 0.5, max 0.7; mem mean (0.5+0.5+0.8)/3 = 0.6,
        max 0.8.
    """
    now = timezone.now()
    wc = make_job(name="wc", status=Job.Status.RUNNING)
    clicks = make_job(name="clicks", topology="wordcount", status=Job.Status.RUNNING)
    other = make_job(name="other", status=Job.Status.RUNNING)

    def episode(job, hours_ago, strategy=Job.Strategy.ADAPTIVE, **figures):
        detected = now - timedelta(hours=hours_ago)
        recovered = (
            detected + timedelta(seconds=figures["recovery_time_s"])
            if figures.get("recovery_time_s") is not None
            else None
        )
        return EpisodeFactory(
            job=job, strategy=strategy, detected_at=detected, recovered_at=recovered, **figures
        )

    episode(wc, 1, recovery_time_s=2.0, downtime_s=1.0, peak_p99_ms=120, lost=0, duplicates=1)
    episode(wc, 2, recovery_time_s=4.0, downtime_s=1.5, peak_p99_ms=480, lost=2, duplicates=0)
    episode(wc, 3, recovery_time_s=9.0, downtime_s=3.5, peak_p99_ms=300, lost=1, duplicates=0)
    episode(wc, 30, recovery_time_s=99.0, downtime_s=50, peak_p99_ms=9999, lost=50, duplicates=5)
    episode(
        wc,
        4,
        strategy=Job.Strategy.RESTART_ALL,
        recovery_time_s=30.0,
        downtime_s=25.0,
        peak_p99_ms=2000,
        lost=0,
        duplicates=7,
    )
    episode(
        clicks,
        5,
        strategy=Job.Strategy.LOCAL_RESTART,
        recovery_time_s=12.5,
        downtime_s=10.0,
        peak_p99_ms=250,
        lost=4,
        duplicates=0,
    )
    episode(clicks, 0.5, strategy=Job.Strategy.LOCAL_RESTART)  # still open
    episode(other, 1, recovery_time_s=500.0, downtime_s=400, peak_p99_ms=1, lost=1, duplicates=1)

    node1, node2 = NodeFactory(name="node-1"), NodeFactory(name="node-2")
    for node, name, value, hours_ago in [
        (node1, "cpu_util", 0.2, 1),
        (node1, "cpu_util", 0.6, 2),
        (node1, "mem_util", 0.5, 1),
        (node1, "mem_util", 0.5, 2),
        (node2, "cpu_util", 0.7, 1),
        (node2, "mem_util", 0.8, 1),
        (node2, "cpu_util", 1.0, 30),  # outside the period
    ]:
        MetricFactory(node=node, name=name, value=value, at=now - timedelta(hours=hours_ago))
    MetricFactory(job=wc, name="throughput_eps", value=5000.0)  # a job metric: not utilisation

    Policy(priority_threshold=0.3, reason="baseline").save()  # v1, written by no one
    change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="fewer standbys")
    subscription = ReportSubscriptionFactory(
        name="daily ops",
        recipients="ops@example.org, lead@example.org",
        scope=ReportSubscription.Scope.SELECTED,
        jobs=[wc, clicks],
    )
    # The report is sent a minute after the data was written.
    return {"subscription": subscription, "now": timezone.now() + timedelta(minutes=1)}


def test_report_figures_per_job_and_strategy(period_data):
    report = reports.report_for_subscription(period_data["subscription"], now=period_data["now"])
    rows = [
        (
            r.job_name,
            r.strategy,
            r.episodes,
            r.open_episodes,
            r.mean_recovery_s,
            r.worst_recovery_s,
            r.downtime_s,
            r.peak_p99_ms,
            r.lost,
            r.duplicates,
        )
        for r in report.episodes
    ]
    assert rows == [
        ("clicks", "local-restart", 2, 1, 12.5, 12.5, 10.0, 250.0, 4, 0),
        ("wc", "adaptive", 3, 0, pytest.approx(5.0), 9.0, pytest.approx(6.0), 480.0, 3, 1),
        ("wc", "restart-all", 1, 0, 30.0, 30.0, 25.0, 2000.0, 0, 7),
    ]
    assert report.total_episodes == 6


def test_report_utilisation_and_policy_changes(period_data):
    report = reports.report_for_subscription(period_data["subscription"], now=period_data["now"])
    cluster = report.cluster
    assert (cluster.cpu_mean, cluster.cpu_max) == (pytest.approx(0.5), 0.7)
    assert (cluster.mem_mean, cluster.mem_max) == (pytest.approx(0.6), 0.8)
    assert [(n.name, n.cpu_mean, n.cpu_max, n.mem_mean, n.mem_max) for n in report.nodes] == [
        ("node-1", pytest.approx(0.4), 0.6, 0.5, 0.5),
        ("node-2", 0.7, 0.7, 0.8, 0.8),
    ]
    assert [(c.version, c.by, c.reason, c.changes) for c in report.policy_changes] == [
        (1, "system", "baseline", {}),
        (2, "ada", "fewer standbys", {"priority_threshold": [0.3, 0.5]}),
    ]


def test_report_text_and_html_show_the_figures(period_data):
    report = reports.report_for_subscription(period_data["subscription"], now=period_data["now"])
    message = reports.render_report_email(report, ["ops@example.org"])
    text = message.body
    assert "wc (adaptive): 3 episodes" in text
    assert "recovery time: mean 5.00 s, worst 9.00 s" in text
    assert "downtime: 6.00 s; peak p99: 480 ms" in text
    assert "lost: 3; duplicates: 1" in text
    assert "clicks (local-restart): 2 episodes, 1 still open" in text
    assert "cluster: cpu 50.0% / 70.0%, memory 60.0% / 80.0%" in text
    assert "node-1: cpu 40.0% / 60.0%, memory 50.0% / 50.0%" in text
    assert "by ada: fewer standbys" in text
    assert "priority_threshold: 0.3 -> 0.5" in text
    assert "other" not in text  # out of the subscription's scope

    html, mimetype = message.alternatives[0]
    assert mimetype == "text/html"
    assert '<td class="mean-recovery">5.00</td>' in html
    assert '<td class="worst-recovery">9.00</td>' in html
    assert '<td class="peak-p99">480</td>' in html
    assert [c.name for c in report.charts] == ["recovery-times", "utilisation"]
    for chart in report.charts:
        assert f'src="cid:{chart.cid}"' in html
        assert chart.png.startswith(PNG_SIGNATURE)


def test_empty_period_says_so_and_has_no_charts(users):
    subscription = ReportSubscriptionFactory()
    report = reports.report_for_subscription(subscription)
    message = reports.render_report_email(report, subscription.recipient_list())
    assert "No recovery episodes in this period." in message.body
    assert "No utilisation samples in this period." in message.body
    assert report.charts == []
    assert message.attachments == []


def test_send_report_emails_the_recipients_and_records_when(period_data):
    subscription = period_data["subscription"]
    reports.send_report(subscription, now=period_data["now"])
    assert len(mail.outbox) == 1
    sent = mail.outbox[0]
    assert sent.to == ["ops@example.org", "lead@example.org"]
    assert sent.subject.startswith("[Backstop] Report 'daily ops': ")
    assert [part.get_content_type() for part in sent.attachments] == ["image/png", "image/png"]
    subscription.refresh_from_db()
    assert subscription.last_sent_at is not None


def test_saving_a_subscription_schedules_it_with_beat():
    subscription = ReportSubscriptionFactory(name="weekly")
    task = PeriodicTask.objects.get(pk=subscription.periodic_task_id)
    assert task.task == "backstop.send_report"
    assert json.loads(task.kwargs) == {"subscription_id": subscription.pk}
    assert task.queue == "control"
    assert (task.crontab.minute, task.crontab.hour) == ("0", "7")
    assert task.enabled

    mondays = CrontabSchedule.objects.create(minute="30", hour="6", day_of_week="1")
    subscription.crontab = mondays
    subscription.enabled = False
    subscription.save()
    task.refresh_from_db()
    assert task.crontab == mondays
    assert not task.enabled
    assert PeriodicTask.objects.filter(task="backstop.send_report").count() == 1

    subscription.delete()
    assert not PeriodicTask.objects.filter(pk=task.pk).exists()


def test_recipients_are_validated_naming_the_bad_address():
    subscription = ReportSubscription(name="x", recipients="ops@example.org, not-an-address")
    with pytest.raises(ValidationError) as info:
        subscription.full_clean()
    assert "'not-an-address' is not a valid email address" in str(info.value.message_dict)


def test_recipients_are_normalised_on_save():
    subscription = ReportSubscriptionFactory(recipients=" a@example.org ,b@example.org,, ")
    assert subscription.recipients == "a@example.org, b@example.org"
    assert subscription.recipient_list() == ["a@example.org", "b@example.org"]


def test_send_now_admin_action(client, users):
    operator = UserFactory(username="olga", role=OPERATOR)
    operator.is_staff = True
    operator.save()
    subscription = ReportSubscriptionFactory(name="now please")
    client.force_login(operator)
    response = client.post(
        "/admin/console/reportsubscription/",
        {"action": "send_now", "_selected_action": [subscription.pk]},
        follow=True,
    )
    assert response.status_code == 200
    # The admin capitalises messages.
    assert "Now please: report sent to ops@example.org." in response.content.decode()
    assert len(mail.outbox) == 1


def test_report_task_sends_and_skips_disabled_subscriptions():
    subscription = ReportSubscriptionFactory()
    assert reporting.send_report.apply(args=(subscription.pk,)).get() == "sent"
    assert len(mail.outbox) == 1
    ReportSubscription.objects.filter(pk=subscription.pk).update(enabled=False)
    assert reporting.send_report.apply(args=(subscription.pk,)).get() == "skipped"
    assert reporting.send_report.apply(args=(999999,)).get() == "skipped"
    assert len(mail.outbox) == 1


def test_report_task_options_are_explicit():
    from web.celery import app

    task = reporting.send_report
    # Routed by the app's default queue, not a per-task option (deprecated in Celery 5.7).
    assert app.amqp.router.route({}, task.name)["queue"].name == "control"
    assert task.acks_late is False  # sending email is not idempotent
    assert task.max_retries == 4
    assert task.time_limit == 180


# Alerts -------------------------------------------------------------------------------------


def test_slow_recovery_alerts_once_per_subscription(users):
    job = make_job(name="wc", status=Job.Status.RUNNING)
    ReportSubscriptionFactory(
        name="strict", recipients="pager@example.org", alert_recovery_over_s=30
    )
    ReportSubscriptionFactory(name="lenient", alert_recovery_over_s=60)
    ReportSubscriptionFactory(name="no alerts")
    episode = EpisodeFactory(job=job, recovery_time_s=45.0, recovered_at=timezone.now())

    assert alerts.check_alerts_for_episode(episode) == 1
    assert alerts.check_alerts_for_episode(episode) == 0  # already alerted
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["pager@example.org"]
    assert mail.outbox[0].subject == "[Backstop] Slow recovery: wc took 45.0 s (limit 30 s)"
    assert "Recovery time: 45.0 s" in mail.outbox[0].body
    assert SentAlert.objects.get().key == f"recovery:{episode.pk}"


def test_open_recovery_alerts_when_it_passes_the_limit(users):
    job = make_job(status=Job.Status.RUNNING)
    ReportSubscriptionFactory(alert_recovery_over_s=30)
    detected = timezone.now() - timedelta(seconds=20)
    episode = EpisodeFactory(job=job, detected_at=detected)
    assert alerts.check_alerts_for_episode(episode, now=detected + timedelta(seconds=20)) == 0
    assert alerts.check_alerts_for_episode(episode, now=detected + timedelta(seconds=40)) == 1
    assert "still recovering after 40.0 s" in mail.outbox[0].subject


def test_a_recovery_never_back_to_normal_alerts_with_its_watched_time(users):
    job = make_job(name="wc", status=Job.Status.RUNNING)
    ReportSubscriptionFactory(alert_recovery_over_s=30)
    detected = timezone.now() - timedelta(hours=1)
    episode = EpisodeFactory(job=job, detected_at=detected, watched_s=600.0)
    assert alerts.check_alerts_for_episode(episode) == 1
    assert mail.outbox[0].subject == (
        "[Backstop] Slow recovery: wc not back to normal within 600.0 s (limit 30 s)"
    )


def test_alerts_respect_the_subscription_scope(users):
    watched = make_job(name="watched", status=Job.Status.RUNNING)
    ignored = make_job(name="ignored", status=Job.Status.RUNNING)
    ReportSubscriptionFactory(
        scope=ReportSubscription.Scope.SELECTED, jobs=[watched], alert_recovery_over_s=1
    )
    assert alerts.check_alerts_for_episode(EpisodeFactory(job=ignored, recovery_time_s=5)) == 0
    assert alerts.check_alerts_for_episode(EpisodeFactory(job=watched, recovery_time_s=5)) == 1


def test_job_failure_alert(users):
    job = make_job(name="wc", status=Job.Status.RUNNING)
    ReportSubscriptionFactory(name="failures", alert_on_job_failure=True)
    ReportSubscriptionFactory(name="quiet")
    assert alerts.alert_job_failed(job) == 0  # not failed
    job.mark_failed("gave up after 3 restarts")
    assert alerts.alert_job_failed(job) == 1
    assert alerts.alert_job_failed(job) == 0
    assert mail.outbox[0].subject == "[Backstop] Job failed: wc"
    assert "Reason: gave up after 3 restarts" in mail.outbox[0].body


def test_alert_tasks_call_the_services(users):
    job = make_job(status=Job.Status.RUNNING)
    ReportSubscriptionFactory(alert_recovery_over_s=10, alert_on_job_failure=True)
    episode = EpisodeFactory(job=job, recovery_time_s=11.0)
    assert reporting.alert_recovery.apply(args=(episode.pk,)).get() == 1
    job.mark_failed("boom")
    assert reporting.alert_job_failed.apply(args=(job.pk,)).get() == 1
    assert len(mail.outbox) == 2


def test_failed_send_rolls_back_the_alert_record(users, settings):
    # Port 1 on localhost refuses connections: the send fails, so nothing counts as alerted.
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 1, 2
    job = make_job(status=Job.Status.RUNNING)
    ReportSubscriptionFactory(alert_recovery_over_s=1)
    with pytest.raises(OSError):
        alerts.check_alerts_for_episode(EpisodeFactory(job=job, recovery_time_s=5))
    assert not SentAlert.objects.exists()


# Upgrades ------------------------------------------------------------------------------------


def test_report_lists_the_upgrades_of_its_period(users):
    """Upgrades under way at some time in the last 24 hours, of the subscription's jobs: one
    confirmed by hand and audited, one refused by the state check (no switch, no figures); one
    that ended 30 hours ago and one of a job out of scope are left out."""
    now = timezone.now()
    wc = make_job(name="wc", status=Job.Status.RUNNING)
    other = make_job(name="other", status=Job.Status.RUNNING)

    def upgrade(job, hours_ago, **fields):
        requested = now - timedelta(hours=hours_ago)
        row = JobUpgrade.objects.create(job=job, from_topology="wordcount", **fields)
        JobUpgrade.objects.filter(pk=row.pk).update(requested_at=requested)
        return row

    switched = now - timedelta(hours=2)
    confirmed = upgrade(
        wc, 3, to_topology="wordcount", to_params={"count.x": "2"},
        case=JobUpgrade.Case.SEEDED, status=JobUpgrade.Status.CONFIRMED,
        switched_at=switched,
        ended_at=switched + timedelta(minutes=1), ended_by=users[OPERATOR],
        outcome="confirmed by otto", gap_s=1.25, lost=0, duplicates=2,
    )  # fmt: skip
    refused = upgrade(
        wc, 1, to_topology="wordcount@2", case=JobUpgrade.Case.REFUSED,
        status=JobUpgrade.Status.REFUSED, ended_at=now - timedelta(minutes=50),
        outcome="Spark refuses the new version: boom",
    )  # fmt: skip
    upgrade(
        wc, 31, to_topology="wordcount@2", status=JobUpgrade.Status.CONFIRMED,
        ended_at=now - timedelta(hours=30),
    )  # fmt: skip
    upgrade(other, 1, to_topology="wordcount@2", status=JobUpgrade.Status.REQUESTED)
    subscription = ReportSubscriptionFactory(
        name="upgrades", scope=ReportSubscription.Scope.SELECTED, jobs=[wc]
    )

    report = reports.report_for_subscription(subscription, now=now + timedelta(minutes=1))
    assert [
        (r.upgrade_id, r.from_topology, r.to_topology, r.case, r.status, r.gap_s, r.lost,
         r.duplicates, r.ended_by)
        for r in report.upgrades
    ] == [
        (confirmed.pk, "wordcount", "wordcount", "seeded", "confirmed", 1.25, 0, 2, "otto"),
        (refused.pk, "wordcount", "wordcount@2", "refused", "refused", None, None, None,
         "the controller"),
    ]  # fmt: skip

    reports.send_report(subscription, now=now + timedelta(minutes=1))
    text = mail.outbox[0].body
    assert (
        f"- wc: wordcount -> wordcount (count.x=2), upgrade {confirmed.pk}, seeded: confirmed\n"
        f"  switched: {switched:%Y-%m-%d %H:%M:%S}; output gap: 1.25 s; lost: 0; duplicates: 2\n"
        "  ended by otto: confirmed by otto\n"
    ) in text
    assert (
        f"- wc: wordcount -> wordcount@2, upgrade {refused.pk}, refused: refused\n"
        "  switched: -; output gap: -; lost: -; duplicates: -\n"
        "  ended by the controller: Spark refuses the new version: boom\n"
    ) in text
    assert "other" not in text
    html, _ = mail.outbox[0].alternatives[0]
    assert '<td class="versions">wordcount &rarr; wordcount (count.x=2)</td>' in html
    assert '<td class="gap">1.25</td>' in html
    assert '<td class="ended-by">otto</td>' in html


def test_a_period_without_upgrades_says_so():
    subscription = ReportSubscriptionFactory()
    reports.send_report(subscription)
    assert "UPGRADES\nNo upgrades in this period.\n" in mail.outbox[0].body
    assert "<p>No upgrades in this period.</p>" in mail.outbox[0].alternatives[0][0]
