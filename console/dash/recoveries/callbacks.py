"""Recovery timeline callbacks: thin glue from data queries to figures and tables.

Each function is a Dash callback (wired in recoveries/app.py) and can be called directly in
tests; `user` is the Django user django-plotly-dash passes in.
"""

from __future__ import annotations

from datetime import timedelta

from dash import html
from dash.exceptions import PreventUpdate
from django.utils import timezone

from console.dash import data
from console.dash.common import (
    DEFAULT_WINDOW_S,
    MAX_POINTS,
    can_view,
    fmt_num,
    fmt_time,
    recovered_cell,
    recovery_time_cell,
    table,
)
from console.dash.recoveries import figures
from console.services import queries
from console.services.teams import jobs_visible_to

# More columns than this make each timeline too narrow to read.
MAX_COMPARED = 4


def job_options(n_intervals, user=None):
    """Every job, newest first, for the picker."""
    if not can_view(user):
        raise PreventUpdate
    return data.job_choices(jobs=jobs_visible_to(user))


def _episode_table(episodes: list[dict]):
    rows = [
        [
            html.A(e["job"], href=f"/console/jobs/{e['job_id']}/"),
            e["strategy"],
            e["stage"] or "—",
            f"{e['fault_kind']} on {e['fault_target']}" if e["fault_kind"] else "detected",
            fmt_time(e["detected_at"]),
            recovered_cell(e),
            fmt_num(e["downtime_s"], 1),
            recovery_time_cell(e),
            fmt_num(e["peak_p99_ms"], 0),
            fmt_num(e["reprotect_s"], 1),
            fmt_num(e["lost"], 0),
            fmt_num(e["duplicates"], 0),
            e["action"],
        ]
        for e in episodes
    ]
    return table(
        [
            "Job",
            "Strategy",
            "Stage",
            "Cause",
            "Detected",
            "Recovered",
            "Downtime (s)",
            "Recovery (s)",
            "Peak p99 (ms)",
            "Re-protect (s)",
            "Lost",
            "Duplicates",
            "Action",
        ],
        rows,
        "No recovery episodes for these jobs in this window.",
        table_id="episodes",
    )


def _strategy_table(rows: list[dict]):
    return table(
        [
            "Strategy",
            "Episodes",
            "Downtime (s)",
            "Recovery (s)",
            "Peak p99 (ms)",
            "Lost",
            "Duplicates",
        ],
        [
            [
                r["strategy"],
                str(r["episodes"]),
                fmt_num(r["downtime_s"], 1),
                fmt_num(r["recovery_time_s"], 1),
                fmt_num(r["peak_p99_ms"], 0),
                fmt_num(r["lost"], 0),
                fmt_num(r["duplicates"], 0),
            ]
            for r in rows
        ],
        "No recovered episodes yet.",
        table_id="strategy-rows",
    )


def refresh(n_intervals, job_ids, window_s, user=None):
    """Every 2 s: the timelines of the chosen jobs (or the newest ones), the phases of their
    episodes, the episodes, strategies."""
    if not can_view(user):
        raise PreventUpdate
    window_s = window_s or DEFAULT_WINDOW_S
    now = timezone.now()
    since = now - timedelta(seconds=window_s)
    visible = jobs_visible_to(user)
    choices = data.job_choices(jobs=visible)
    chosen = list(job_ids or [c["value"] for c in choices])[:MAX_COMPARED]
    # One query for the jobs compared, not one per job; a forged id of another team's job is
    # left out like one that does not exist.
    jobs = data.job_details(chosen, jobs=visible)
    ids = [j["id"] for j in jobs]
    series = data.metric_series(
        data.JOB_METRICS,
        window_s,
        max_points=MAX_POINTS,
        job_ids=ids,
        stage=queries.JOB_SCOPE,
        end=now,
    )
    episodes = data.episode_rows(job_ids=ids, since=since)
    faults = data.fault_rows(job_ids=ids, since=since)
    comparison = data.strategy_comparison(visible)
    return (
        figures.timeline_figure(jobs, series, episodes, faults, now),
        figures.phase_figure(episodes),
        _episode_table(episodes),
        figures.strategy_figure(comparison),
        _strategy_table(comparison),
    )
