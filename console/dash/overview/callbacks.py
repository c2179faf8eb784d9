"""Overview callbacks: thin glue from data queries to tables and figures, plus job controls.

Each function is a Dash callback (wired in overview/app.py) and can be called directly in tests;
`user` is the Django user django-plotly-dash passes in.
"""

from __future__ import annotations

from datetime import timedelta

from dash import html
from dash.exceptions import PreventUpdate
from django.utils import timezone

from console.dash import controls, data
from console.dash.common import (
    MAX_POINTS,
    badge,
    can_view,
    fmt_num,
    fmt_pct,
    fmt_time,
    message,
    recovered_cell,
    recovery_time_cell,
    table,
)
from console.dash.overview import figures
from console.dash.overview.layout import controls as controls_layout
from console.models import Policy
from console.roles import OPERATOR, has_role
from console.services.topologies import topology_names


def _kpi(label: str, value: str, tile_id: str):
    return html.Div(
        [
            html.Div(value, className="kpi-value", id=tile_id),
            html.Div(label, className="kpi-label"),
        ],
        className="kpi",
    )


def _job_table(jobs: list[dict]):
    rows = [
        [
            html.A(job["name"], href=f"/console/jobs/{job['id']}/"),
            job["topology"],
            job["strategy"],
            badge(job["status"], job["status"]),
            html.Span(fmt_num(job["throughput_eps"], 0), className="num"),
            html.Span(fmt_num(job["latency_p99_ms"], 0), className="num"),
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


def refresh(n_intervals, window_s, user=None):
    """Every 2 s: KPI tiles, jobs, episodes, nodes and both charts."""
    if not can_view(user):
        raise PreventUpdate
    window_s = window_s or 900
    jobs = data.job_rows()
    nodes = data.node_rows()
    episodes = data.episode_rows(since=_hour_ago(), limit=20)
    utilisation = data.cluster_utilisation(window_s, MAX_POINTS)
    throughput = data.metric_series(
        ("throughput_eps",),
        window_s,
        max_points=MAX_POINTS,
        job_ids=[j["id"] for j in jobs if j["is_live"]],
        stage=data.JOB_SCOPE,
    )
    live_names = {j["id"]: j["name"] for j in jobs if j["is_live"]}
    last = utilisation.dropna().iloc[-1] if not utilisation.dropna().empty else None
    kpis = [
        _kpi("running jobs", str(sum(1 for j in jobs if j["status"] == "running")), "kpi-running"),
        _kpi("open episodes", str(sum(j["open_episodes"] for j in jobs)), "kpi-open"),
        _kpi(
            "nodes up", f"{sum(1 for n in nodes if n['state'] == 'up')}/{len(nodes)}", "kpi-nodes"
        ),
        _kpi("cluster CPU", fmt_pct(None if last is None else last["cpu"]), "kpi-cpu"),
        _kpi("cluster memory", fmt_pct(None if last is None else last["mem"]), "kpi-mem"),
    ]
    return (
        kpis,
        _job_table(jobs),
        _episode_table(episodes),
        _node_table(nodes),
        figures.utilisation_figure(utilisation, Policy.current().resource_reserve),
        figures.throughput_figure(throughput, live_names),
    )


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
    return data.live_job_choices()


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


def start_clicked(n_clicks, name, topology, strategy, rate, user=None):
    """Create a job through the job service; the controller picks it up and starts it."""
    if not n_clicks:
        raise PreventUpdate
    try:
        job = controls.start_job(user, name=name, topology=topology, strategy=strategy, rate=rate)
    except controls.ActionRefused as exc:
        return message(f"Not started: {exc}", ok=False)
    return message(f"Created job {job.name} (#{job.pk}); the controller starts it.", ok=True)
