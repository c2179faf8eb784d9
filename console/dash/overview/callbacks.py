"""Overview callbacks: thin glue from data queries to tables and figures, plus job controls.

Each function is a Dash callback (wired in overview/app.py) and can be called directly in tests;
`user` is the Django user django-plotly-dash passes in.
"""

from __future__ import annotations

from datetime import timedelta

from dash import html
from dash.exceptions import PreventUpdate
from django.utils import timezone

from console.dash import controls, data, kafka_data
from console.dash.common import (
    MAX_POINTS,
    badge,
    can_view,
    choice_values,
    count_of,
    fmt_num,
    fmt_pct,
    fmt_time,
    message,
    one_choice,
    page_number,
    recovered_cell,
    recovery_time_cell,
    scroll_box,
    table,
    text_value,
)
from console.dash.overview import figures
from console.dash.overview.layout import OPEN_ONLY, PAGE_SIZE
from console.dash.overview.layout import controls as controls_layout
from console.models import Job, Node, Policy
from console.roles import OPERATOR, has_role
from console.services import queries
from console.services.teams import jobs_visible_to
from console.services.topologies import topology_names

STATUSES = {value for value, _ in Job.Status.choices}
STRATEGIES = {value for value, _ in Job.Strategy.choices}
# The throughput chart draws the first this many live jobs of the page, each with at least
# MIN_POINTS points (MAX_POINTS for up to 4 jobs).
THROUGHPUT_LINES = 10
MIN_POINTS = 120


def _kpi(label: str, value: str, tile_id: str, detail: str = ""):
    parts = [
        html.Div(value, className="kpi-value", id=tile_id),
        html.Div(label, className="kpi-label"),
    ]
    if detail:
        parts.append(html.Div(detail, className="kpi-detail"))
    return html.Div(parts, className="kpi")


def job_filter(search, status, strategy, topology, node, open_only) -> queries.JobFilter:
    """The job list's filter from the inputs as sent (checked: a forged request gets a filter
    that matches what it can, never an error)."""
    return queries.JobFilter(
        status=choice_values(status, STATUSES),
        strategy=choice_values(strategy, STRATEGIES),
        topology=choice_values(topology, max_length=48),
        node=text_value(node, 64),
        open_recovery=True if OPEN_ONLY in choice_values(open_only) else None,
        search=text_value(search),
    )


def _lag_cell(job: dict, lags: dict[int, int | None]) -> str:
    """A Kafka job's total lag (records its primaries are behind the topic; a dash before any
    is published); blank for a job that does not read Kafka."""
    return fmt_num(lags.get(job["id"]), 0) if job["reads_kafka"] else ""


def _job_table(jobs: list[dict], lags: dict[int, int | None] | None = None):
    lags = lags or {}
    rows = [
        [
            html.A(job["name"], href=f"/console/jobs/{job['id']}/"),
            job["topology"],
            job["strategy"],
            badge(job["status"], job["status"]),
            html.Span(fmt_num(job["throughput_eps"], 0), className="num"),
            html.Span(fmt_num(job["latency_p99_ms"], 0), className="num"),
            html.Span(_lag_cell(job, lags), className="num"),
            html.Span(
                str(job["open_episodes"]), className="num bad" if job["open_episodes"] else "num"
            ),
            html.Span(str(job["recent_episodes"]), className="num"),
        ]
        for job in jobs
    ]
    return table(
        [
            "Job",
            "Topology",
            "Strategy",
            "Status",
            "Throughput (ev/s)",
            "p99 (ms)",
            "Kafka lag",
            "Open episodes",
            "Episodes (1 h)",
        ],
        rows,
        "No jobs yet.",
        table_id="jobs",
    )


def _episode_table(episodes: list[dict]):
    rows = [
        [
            html.A(e["job"], href=f"/console/jobs/{e['job_id']}/"),
            e["stage"] or "—",
            f"{e['fault_kind']} on {e['fault_target']}" if e["fault_kind"] else "detected",
            fmt_time(e["detected_at"]),
            recovered_cell(e),
            fmt_num(e["downtime_s"], 1),
            recovery_time_cell(e),
            e["action"],
        ]
        for e in episodes
    ]
    return table(
        [
            "Job",
            "Stage",
            "Cause",
            "Detected",
            "Recovered",
            "Downtime (s)",
            "Recovery (s)",
            "Action",
        ],
        rows,
        "No recovery episodes in the last hour.",
        table_id="episodes",
    )


def _node_table(nodes: list[dict]):
    # At fleet size the nodes that need a look come first; the table scrolls in its card.
    nodes = sorted(nodes, key=lambda n: (n["state"] == Node.State.UP, n["name"]))
    rows = [
        [
            n["name"],
            badge(n["state"], n["state"]),
            fmt_time(n["last_heartbeat"]),
            fmt_pct(n["cpu_util"]),
            fmt_pct(n["mem_util"]),
            fmt_num(n["q_score"], 2),
            str(len(n["primaries"])),
            str(len(n["standbys"])),
        ]
        for n in nodes
    ]
    return table(
        ["Node", "State", "Heartbeat", "CPU", "Memory", "Q", "Primaries", "Standbys"],
        rows,
        "No nodes registered.",
        table_id="nodes",
    )


def _position(page: data.JobPage, flt: queries.JobFilter, total: int) -> str:
    filtered = flt != queries.JobFilter()
    matching = (
        f"{page.matching} of {count_of(total, 'job')} match" if filtered else count_of(total, "job")
    )
    first = (page.page - 1) * PAGE_SIZE + 1 if page.rows else 0
    shown = f"{first}-{first + len(page.rows) - 1}" if page.rows else "none"
    return f"{matching}; showing {shown} (page {page.page} of {page.pages})"


def _kpis(totals: dict, utilisation) -> list:
    jobs, nodes, replicas = totals["jobs"], totals["nodes"], totals["replicas"]
    by_status = jobs["by_status"]
    breakdown = " · ".join(f"{n} {status}" for status, n in by_status.items() if n)
    last = utilisation.dropna().iloc[-1] if not utilisation.dropna().empty else None
    return [
        _kpi("jobs", str(jobs["total"]), "kpi-jobs", breakdown),
        _kpi("running jobs", str(by_status["running"]), "kpi-running",
             f"{jobs['live']} live, {by_status['failed']} failed"),
        _kpi("replicas", str(replicas["total"]), "kpi-replicas",
             f"{count_of(replicas['primary'], 'primary', 'primaries')}, "
             f"{count_of(replicas['standby'], 'standby', 'standbys')}"),
        _kpi("nodes up", f"{nodes['up']}/{nodes['total']}", "kpi-nodes",
             f"{nodes['down']} not up" if nodes["down"] else "all up"),
        _kpi("open episodes", str(totals["open_recoveries"]), "kpi-open",
             f"in {totals['jobs_with_open_recoveries']} jobs"),
        _kpi("cluster CPU", fmt_pct(None if last is None else last["cpu"]), "kpi-cpu"),
        _kpi("cluster memory", fmt_pct(None if last is None else last["mem"]), "kpi-mem"),
    ]  # fmt: skip


def refresh(
    n_intervals,
    window_s,
    search=None,
    status=None,
    strategy=None,
    topology=None,
    node=None,
    open_only=None,
    sort=None,
    page=None,
    user=None,
):
    """Every 2 s: fleet totals, one page of the (filtered, sorted) jobs, episodes, nodes and
    both charts. A constant number of queries whatever the size of the fleet."""
    if not can_view(user):
        raise PreventUpdate
    window_s = window_s or 900
    flt = job_filter(search, status, strategy, topology, node, open_only)
    sort = one_choice(sort, queries.JOB_SORTS, queries.DEFAULT_JOB_SORT)
    visible = jobs_visible_to(user)
    jobs = data.job_page(flt, sort, page_number(page), PAGE_SIZE, jobs=visible)
    totals = queries.fleet_totals(visible)
    nodes = data.node_rows(visible)
    episodes = data.episode_rows(since=_hour_ago(), limit=20, jobs=visible)
    utilisation = data.cluster_utilisation(window_s, MAX_POINTS)
    # The first live jobs of the page shown: a chart of 200 lines says nothing.
    live = [j for j in jobs.rows if j["is_live"]][:THROUGHPUT_LINES]
    live_names = {j["id"]: j["name"] for j in live}
    throughput = data.metric_series(
        ("throughput_eps",),
        window_s,
        # A half-width chart shows no more: 25 lines of 600 points were 0.5 MB per refresh.
        max_points=max(MIN_POINTS, MAX_POINTS * 4 // max(4, len(live_names))),
        job_ids=list(live_names),
        stage=queries.JOB_SCOPE,
    )
    return (
        _kpis(totals, utilisation),
        [
            html.P(_position(jobs, flt, totals["jobs"]["total"]), className="muted small",
                   id="jobs-position"),
            _job_table(jobs.rows, kafka_data.lag_totals(jobs.rows)),
        ],
        _episode_table(episodes),
        scroll_box(_node_table(nodes)),
        figures.utilisation_figure(utilisation, Policy.current().resource_reserve),
        figures.throughput_figure(throughput, live_names),
    )  # fmt: skip


def filter_options(pathname, user=None):
    """The topologies jobs run and the nodes, for the job list's filters."""
    if not can_view(user):
        raise PreventUpdate
    topologies = (
        jobs_visible_to(user).order_by("topology").values_list("topology", flat=True).distinct()
    )
    nodes = Node.objects.order_by("name").values_list("name", flat=True)
    return list(topologies), list(nodes)


def turn_page(
    prev_clicks,
    next_clicks,
    search,
    status,
    strategy,
    topology,
    node,
    open_only,
    sort,
    page,
    user=None,
    callback_context=None,
):
    """The page of the job list: back or on with the buttons (within the pages there are),
    back to the first page when a filter or the order changes."""
    if not can_view(user):
        raise PreventUpdate
    triggered = [t.get("prop_id", "") for t in getattr(callback_context, "triggered", None) or []]
    page = page_number(page)
    if any(t.startswith("jobs-prev.") for t in triggered):
        return max(1, page - 1)
    if any(t.startswith("jobs-next.") for t in triggered):
        flt = job_filter(search, status, strategy, topology, node, open_only)
        matching = queries.job_queryset(flt, jobs=jobs_visible_to(user)).count()
        return page_number(page + 1, max(1, -(-matching // PAGE_SIZE)))
    return 1


def _hour_ago():
    return timezone.now() - timedelta(hours=1)


def render_controls(pathname, user=None):
    """The controls card for operators and admins; nothing at all for viewers."""
    if not has_role(user, OPERATOR):
        return None
    return controls_layout(topology_names())


def stop_options(n_intervals, user=None):
    """Jobs that can be stopped, refreshed with the page (only fires when the controls exist)."""
    if not has_role(user, OPERATOR):
        raise PreventUpdate
    return data.live_job_choices(jobs_visible_to(user))


def ask_stop(n_clicks, job_id):
    """First step of stopping: show the confirm dialog naming the job."""
    if not n_clicks or not job_id:
        raise PreventUpdate
    return True, f"Stop job #{job_id}? Its replicas will be shut down."


def stop_confirmed(submit_n_clicks, job_id, user=None):
    """Second step: the user confirmed; stop the job through the job service."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        job = controls.stop_job(user, job_id)
    except controls.ActionRefused as exc:
        return message(f"Not stopped: {exc}", ok=False)
    return message(f"Job {job.name} is {job.status}.", ok=True)


def start_clicked(
    n_clicks, name, topology, strategy, rate, source_topic=None, sink_topic=None, user=None
):
    """Create a job through the job service; the controller picks it up and starts it. With
    topics given, the job reads the Kafka `source_topic` and writes its results to `sink_topic`
    too."""
    if not n_clicks:
        raise PreventUpdate
    try:
        job = controls.start_job(
            user,
            name=name,
            topology=topology,
            strategy=strategy,
            rate=rate,
            source_topic=source_topic,
            sink_topic=sink_topic,
        )
    except controls.ActionRefused as exc:
        return message(f"Not started: {exc}", ok=False)
    return message(f"Created job {job.name} (#{job.pk}); the controller starts it.", ok=True)
