"""Periodic email reports: the figures of a period, rendered as HTML (with charts) and plain text.

What a report reads:

- RecoveryEpisode rows detected in the period: per job and strategy the number of episodes (and
  how many are still open), mean and worst `recovery_time_s` (over recovered episodes), total
  `downtime_s`, worst `peak_p99_ms`, total `lost` and `duplicates`.
- MetricSample rows with a node and the names below (fractions 0..1 per node): mean and peak
  utilisation per node and over the cluster, and a chart over time.
- Policy versions created in the period, with who made them, why and what they changed.
- JobUpgrade rows under way at some time in the period (asked for before its end, not ended
  before its start): versions, case, status, switch, the audited output gap, lost and
  duplicated results (console/services/upgrade_audit.py), who ended it and why.

The supervision code writes node samples as `MetricSample(node=node, name="cpu_util", value=0.42)`
(and "mem_util"); job-level samples (`throughput_eps`, `latency_p50_ms`, `latency_p99_ms`)
are not read here: the episode's `peak_p99_ms` is the latency figure of a recovery.

The email is multipart/related around multipart/alternative (text/plain, text/html) plus one
image/png part per chart, referenced from the HTML as `cid:`.
"""

from __future__ import annotations

import io
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.mime.image import MIMEImage

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db.models import Avg, Count, Max, Q, Sum
from django.template.loader import render_to_string
from django.utils import timezone

from console.models import (
    JobUpgrade,
    MetricSample,
    Policy,
    RecoveryEpisode,
    ReportSubscription,
)

logger = logging.getLogger(__name__)

CPU_UTIL_METRIC = "cpu_util"
MEM_UTIL_METRIC = "mem_util"
UTIL_METRICS = (CPU_UTIL_METRIC, MEM_UTIL_METRIC)
# A utilisation chart has at most this many points per series: enough to see the shape of a day
# without shipping every sample.
CHART_POINTS = 200


@dataclass(frozen=True)
class EpisodeFigures:
    """The recoveries of one job under one strategy in the period."""

    job_id: int
    job_name: str
    strategy: str
    episodes: int
    open_episodes: int
    mean_recovery_s: float | None
    worst_recovery_s: float | None
    downtime_s: float | None
    peak_p99_ms: float | None
    lost: int | None
    duplicates: int | None


@dataclass(frozen=True)
class Utilisation:
    """Mean and peak CPU and memory utilisation (fractions 0..1) of a node or the cluster."""

    name: str
    cpu_mean: float | None
    cpu_max: float | None
    mem_mean: float | None
    mem_max: float | None

    # Percent strings for the templates ("42.5%", or "-" when there were no samples).
    @property
    def cpu_mean_pct(self) -> str:
        return percent(self.cpu_mean)

    @property
    def cpu_max_pct(self) -> str:
        return percent(self.cpu_max)

    @property
    def mem_mean_pct(self) -> str:
        return percent(self.mem_mean)

    @property
    def mem_max_pct(self) -> str:
        return percent(self.mem_max)


def percent(fraction: float | None) -> str:
    """0.425 -> "42.5%"; None -> "-"."""
    return "-" if fraction is None else f"{100.0 * fraction:.1f}%"


@dataclass(frozen=True)
class PolicyChange:
    """One policy version written in the period."""

    version: int
    at: datetime
    by: str
    reason: str
    changes: dict[str, list]


@dataclass(frozen=True)
class UpgradeRow:
    """One upgrade of a job in the period (figures None until audited)."""

    upgrade_id: int
    job_name: str
    from_topology: str
    to_topology: str
    to_params: str  # the operator parameters asked for, "OP.KEY=value, ..."
    strategy_change: str  # "adaptive -> active-all" for a strategy change, else ""
    case: str
    status: str
    switched_at: datetime | None
    gap_s: float | None
    lost: int | None
    duplicates: int | None
    ended_by: str
    outcome: str


@dataclass(frozen=True)
class Chart:
    """A PNG chart and the Content-ID the HTML refers to it by (`cid:<cid>`)."""

    name: str
    title: str
    cid: str
    png: bytes


@dataclass
class Report:
    """Everything a report says about one period; the templates only format it."""

    title: str
    start: datetime
    end: datetime
    episodes: list[EpisodeFigures]
    cluster: Utilisation | None
    nodes: list[Utilisation]
    policy_changes: list[PolicyChange]
    upgrades: list[UpgradeRow] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)

    @property
    def total_episodes(self) -> int:
        return sum(row.episodes for row in self.episodes)


def build_report(start: datetime, end: datetime, *, jobs=None, title: str = "Backstop") -> Report:
    """The figures of [start, end) for `jobs` (a queryset or list; None means every job)."""
    return Report(
        title=title,
        start=start,
        end=end,
        episodes=episode_figures(start, end, jobs=jobs),
        cluster=next(iter(_utilisation(start, end, per_node=False)), None),
        nodes=_utilisation(start, end, per_node=True),
        policy_changes=policy_changes(start, end),
        upgrades=upgrade_rows(start, end, jobs=jobs),
    )


def episode_figures(start: datetime, end: datetime, *, jobs=None) -> list[EpisodeFigures]:
    """Per job and strategy: counts, mean/worst recovery, downtime, peak p99, lost, duplicates.

    Mean and worst recovery time are over recovered episodes (open ones have no recovery time
    yet); sums and maxima ignore unknown (NULL) values, and are None when every value is unknown.
    """
    episodes = RecoveryEpisode.objects.filter(detected_at__gte=start, detected_at__lt=end)
    if jobs is not None:
        episodes = episodes.filter(job__in=jobs)
    rows = (
        episodes.values("job_id", "job__name", "strategy")
        .annotate(
            episodes=Count("id"),
            open_episodes=Count("id", filter=Q(watched_s__isnull=True)),
            mean_recovery_s=Avg("recovery_time_s"),
            worst_recovery_s=Max("recovery_time_s"),
            downtime_s=Sum("downtime_s"),
            peak_p99_ms=Max("peak_p99_ms"),
            lost=Sum("lost"),
            duplicates=Sum("duplicates"),
        )
        .order_by("job__name", "job_id", "strategy")
    )
    return [
        EpisodeFigures(
            job_id=row["job_id"],
            job_name=row["job__name"],
            strategy=row["strategy"],
            episodes=row["episodes"],
            open_episodes=row["open_episodes"],
            mean_recovery_s=row["mean_recovery_s"],
            worst_recovery_s=row["worst_recovery_s"],
            downtime_s=row["downtime_s"],
            peak_p99_ms=row["peak_p99_ms"],
            lost=row["lost"],
            duplicates=row["duplicates"],
        )
        for row in rows
    ]


def _util_samples(start: datetime, end: datetime):
    return MetricSample.objects.filter(
        node__isnull=False, name__in=UTIL_METRICS, at__gte=start, at__lt=end
    )


def _utilisation(start: datetime, end: datetime, *, per_node: bool) -> list[Utilisation]:
    """Mean and max of cpu_util and mem_util, per node (sorted by name) or over all nodes."""
    group = ["node__name", "name"] if per_node else ["name"]
    rows = _util_samples(start, end).values(*group).annotate(mean=Avg("value"), peak=Max("value"))
    by_name: dict[str, dict] = {}
    for row in rows.order_by(*group):
        key = row["node__name"] if per_node else "cluster"
        by_name.setdefault(key, {})[row["name"]] = (row["mean"], row["peak"])
    result = []
    for name, metrics in sorted(by_name.items()):
        cpu = metrics.get(CPU_UTIL_METRIC, (None, None))
        mem = metrics.get(MEM_UTIL_METRIC, (None, None))
        result.append(Utilisation(name, cpu[0], cpu[1], mem[0], mem[1]))
    return result


def policy_changes(start: datetime, end: datetime) -> list[PolicyChange]:
    """Policy versions created in [start, end), oldest first, with author, reason and diff
    (two queries: the versions, and the one before the first to diff it with)."""
    versions = list(
        Policy.objects.filter(created_at__gte=start, created_at__lt=end)
        .select_related("created_by")
        .order_by("version")
    )
    previous = versions[0].previous() if versions else None
    changes = []
    for policy in versions:
        changes.append(
            PolicyChange(
                version=policy.version,
                at=policy.created_at,
                by=policy.created_by.get_username() if policy.created_by else "system",
                reason=policy.reason,
                changes=Policy.diff(previous, policy),
            )
        )
        previous = policy
    return changes


def upgrade_rows(start: datetime, end: datetime, *, jobs=None) -> list[UpgradeRow]:
    """The upgrades under way at some time in [start, end) (asked for before `end`, not ended
    before `start`), oldest first. `ended_by`: who confirmed or rolled back by hand, "the
    controller" for any other end, "" while under way."""
    upgrades = (
        JobUpgrade.objects.filter(requested_at__lt=end)
        .exclude(ended_at__lt=start)
        .select_related("job", "ended_by")
        .order_by("requested_at", "pk")
    )
    if jobs is not None:
        upgrades = upgrades.filter(job__in=jobs)
    rows = []
    for upgrade in upgrades:
        if upgrade.ended_at is None:
            ended_by = ""
        elif upgrade.ended_by is not None:
            ended_by = upgrade.ended_by.get_username()
        else:
            ended_by = "the controller"
        rows.append(
            UpgradeRow(
                upgrade_id=upgrade.pk,
                job_name=upgrade.job.name,
                from_topology=upgrade.from_topology,
                to_topology=upgrade.to_topology,
                to_params=", ".join(f"{k}={v}" for k, v in sorted(upgrade.to_params.items())),
                strategy_change=(
                    f"{upgrade.from_strategy} -> {upgrade.to_strategy}"
                    if upgrade.changes_strategy
                    else ""
                ),
                case=upgrade.case,
                status=upgrade.get_status_display(),
                switched_at=upgrade.switched_at,
                gap_s=upgrade.gap_s,
                lost=upgrade.lost,
                duplicates=upgrade.duplicates,
                ended_by=ended_by,
                outcome=upgrade.outcome,
            )
        )
    return rows


def _new_figure(width: float, height: float):
    """A matplotlib Figure: Figure and the Agg canvas directly, never pyplot (no display is
    needed on servers and workers, and no global state is shared between concurrent tasks)."""
    # Imported here, not at the top: matplotlib is half a second of CPU to import, and every
    # Celery worker (controller and node agents too) imports this module; a controller
    # restarted on a busy machine resumed supervision tens of seconds later for it.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def _png(figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


def recovery_chart_png(rows: list[EpisodeFigures]) -> bytes | None:
    """Horizontal bars of mean and worst recovery time per job and strategy; None without data."""
    rows = [row for row in rows if row.worst_recovery_s is not None]
    if not rows:
        return None
    labels = [f"{row.job_name} · {row.strategy}" for row in rows]
    positions = range(len(rows))
    figure = _new_figure(7, 0.6 * len(rows) + 1.4)
    axes = figure.add_subplot()
    axes.barh([p + 0.2 for p in positions], [r.worst_recovery_s for r in rows], 0.4, label="worst")
    axes.barh([p - 0.2 for p in positions], [r.mean_recovery_s for r in rows], 0.4, label="mean")
    axes.set_yticks(list(positions), labels)
    axes.invert_yaxis()
    axes.set_xlabel("recovery time (s)")
    # Above the plot, so it never hides a bar.
    axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    figure.tight_layout()
    return _png(figure)


def utilisation_chart_png(start: datetime, end: datetime) -> bytes | None:
    """CPU and memory utilisation (%) per node over the period; None without samples."""
    samples = _util_samples(start, end).values_list("node__name", "name", "at", "value")
    bucket_s = max((end - start).total_seconds() / CHART_POINTS, 1.0)
    # (node, metric) -> bucket index -> [sum, count]: averaging into buckets bounds the points.
    buckets: dict[tuple[str, str], dict[int, list[float]]] = {}
    for node, name, at, value in samples.iterator():
        index = int((at - start).total_seconds() // bucket_s)
        cell = buckets.setdefault((node, name), {}).setdefault(index, [0.0, 0])
        cell[0] += value
        cell[1] += 1
    if not buckets:
        return None
    figure = _new_figure(7, 3.2)
    axes = figure.add_subplot()
    for (node, name), cells in sorted(buckets.items()):
        xs = [start + timedelta(seconds=(index + 0.5) * bucket_s) for index in sorted(cells)]
        ys = [100.0 * cells[i][0] / cells[i][1] for i in sorted(cells)]
        style = "-" if name == CPU_UTIL_METRIC else "--"
        # Markers keep a series of one or two points visible.
        marker = "o" if len(xs) < 20 else None
        label = f"{node} {name.removesuffix('_util')}"
        axes.plot(xs, ys, style, marker=marker, markersize=3, label=label)
    axes.set_xlim(start, end)
    from matplotlib.dates import DateFormatter

    axes.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M"))
    axes.set_ylim(0, 100)
    axes.set_ylabel("utilisation (%)")
    axes.legend(loc="upper left", fontsize="small", ncol=2)
    figure.autofmt_xdate()
    figure.tight_layout()
    return _png(figure)


def make_charts(report: Report) -> list[Chart]:
    """The report's charts, each with a fresh Content-ID."""
    candidates = [
        (
            "recovery-times",
            "Recovery time per job and strategy",
            recovery_chart_png(report.episodes),
        ),
        ("utilisation", "Node utilisation", utilisation_chart_png(report.start, report.end)),
    ]
    return [
        Chart(name=name, title=title, cid=f"{name}.{uuid.uuid4().hex}@backstop", png=png)
        for name, title, png in candidates
        if png is not None
    ]


def render_report_email(report: Report, recipients: list[str], connection=None):
    """The report as an email: text and HTML alternatives, charts inline as image/png parts."""
    report.charts = make_charts(report)
    context = {"report": report, "console_url": settings.CONSOLE_BASE_URL}
    subject = (
        f"{settings.EMAIL_SUBJECT_PREFIX}{report.title}: "
        f"{report.start:%Y-%m-%d %H:%M} to {report.end:%Y-%m-%d %H:%M} UTC"
    )
    message = EmailMultiAlternatives(
        subject=subject,
        body=render_to_string("email/report.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=recipients,
        connection=connection,
    )
    message.attach_alternative(render_to_string("email/report.html", context), "text/html")
    if report.charts:
        # multipart/related makes the images part of the HTML rather than attachments.
        message.mixed_subtype = "related"
        for chart in report.charts:
            image = MIMEImage(chart.png, "png")
            image.add_header("Content-ID", f"<{chart.cid}>")
            image.add_header("Content-Disposition", "inline", filename=f"{chart.name}.png")
            message.attach(image)
    return message


def report_for_subscription(subscription: ReportSubscription, *, now=None) -> Report:
    """The report a subscription receives at `now`: its last `period_hours` hours, its jobs."""
    end = now or timezone.now()
    start = end - timedelta(hours=subscription.period_hours)
    jobs = (
        None if subscription.scope == ReportSubscription.Scope.ALL else subscription.job_queryset()
    )
    return build_report(start, end, jobs=jobs, title=f"Report '{subscription.name}'")


def send_report(subscription: ReportSubscription, *, now=None, connection=None):
    """Build, render and send a subscription's report now; record when; return the message.

    SMTP failures propagate (the Celery task retries the transient ones).
    """
    report = report_for_subscription(subscription, now=now)
    message = render_report_email(report, subscription.recipient_list(), connection=connection)
    message.send(fail_silently=False)
    sent_at = timezone.now()
    # update(), not save(): saving would rewrite the beat entry for no reason.
    ReportSubscription.objects.filter(pk=subscription.pk).update(last_sent_at=sent_at)
    subscription.last_sent_at = sent_at
    logger.info(
        "report %r sent to %s (%d episodes)",
        subscription.name,
        ", ".join(subscription.recipient_list()),
        report.total_episodes,
    )
    return message
