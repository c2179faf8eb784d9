"""Recovery charts: throughput and latency per job with faults and recovery windows, and the
per-strategy comparison."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from console.dash.common import BASE_LAYOUT, FAULT, GRID, RECOVERY
from console.policy import recovery_phases

THROUGHPUT_COLOUR = "#2457d6"
P50_COLOUR = "#12b5cb"
P99_COLOUR = "#9334e6"


def episode_windows(episode: dict, now: datetime) -> tuple[tuple, tuple | None]:
    """(downtime window, recovery window) of an episode as (start, end) pairs.

    Downtime runs from detection for `downtime_s` (until now while the output is still gone);
    recovery is the catch-up after it, until `recovered_at` (or detection + recovery_time_s, or
    now while open). None when there is no catch-up phase.
    """
    start = episode["detected_at"]
    if episode["downtime_s"] is not None:
        down_end = start + timedelta(seconds=episode["downtime_s"])
    else:
        down_end = episode["recovered_at"] or now
    if episode["recovered_at"] is not None:
        rec_end = episode["recovered_at"]
    elif episode["recovery_time_s"] is not None:
        rec_end = start + timedelta(seconds=episode["recovery_time_s"])
    else:
        rec_end = now
    recovery = (down_end, rec_end) if rec_end > down_end else None
    return (start, down_end), recovery


def timeline_figure(
    jobs: list[dict], series: pd.DataFrame, episodes: list[dict], faults: list[dict], now: datetime
) -> go.Figure:
    """One column per job (side by side): throughput on top, latency p50/p99 below.

    Downtime windows are shaded red and recovery windows amber on both panels; faults are red
    vertical lines with a marker on the throughput panel. `series` has at, job_id, name, value.
    """
    columns = max(1, len(jobs))
    fig = make_subplots(
        rows=2,
        cols=columns,
        shared_xaxes=True,
        vertical_spacing=0.1,
        horizontal_spacing=0.06,
        subplot_titles=[f"{j['name']} · {j['strategy']}" for j in jobs] or ["no job selected"],
    )
    for col, job in enumerate(jobs, start=1):
        rows = series[series["job_id"] == job["id"]]
        for metric, label, colour, row in (
            ("throughput_eps", "throughput (ev/s)", THROUGHPUT_COLOUR, 1),
            ("latency_p50_ms", "latency p50 (ms)", P50_COLOUR, 2),
            ("latency_p99_ms", "latency p99 (ms)", P99_COLOUR, 2),
        ):
            points = rows[rows["name"] == metric]
            fig.add_trace(
                go.Scatter(
                    x=points["at"],
                    y=points["value"],
                    name=label,
                    legendgroup=metric,
                    showlegend=col == 1,
                    mode="lines",
                    line={"color": colour, "width": 2},
                ),
                row=row,
                col=col,
            )
        for episode in (e for e in episodes if e["job_id"] == job["id"]):
            downtime, recovery = episode_windows(episode, now)
            for row in (1, 2):
                fig.add_vrect(
                    x0=downtime[0],
                    x1=downtime[1],
                    fillcolor=FAULT,
                    opacity=0.18,
                    line_width=0,
                    layer="below",
                    row=row,
                    col=col,
                    name=f"downtime-{episode['id']}",
                )
                if recovery is not None:
                    fig.add_vrect(
                        x0=recovery[0],
                        x1=recovery[1],
                        fillcolor=RECOVERY,
                        opacity=0.15,
                        line_width=0,
                        layer="below",
                        row=row,
                        col=col,
                        name=f"recovery-{episode['id']}",
                    )
        job_faults = [f for f in faults if f["job_id"] == job["id"]]
        for fault in job_faults:
            for row in (1, 2):
                fig.add_vline(
                    x=fault["at"],
                    line={"color": FAULT, "width": 1.5, "dash": "dot"},
                    row=row,
                    col=col,
                    name=f"fault-{fault['id']}",
                )
        top = rows.loc[rows["name"] == "throughput_eps", "value"].max() if not rows.empty else 0
        fig.add_trace(
            go.Scatter(
                x=[f["at"] for f in job_faults],
                y=[top if pd.notna(top) else 0] * len(job_faults),
                mode="markers",
                name="fault",
                legendgroup="fault",
                showlegend=col == 1,
                marker={"color": FAULT, "symbol": "x", "size": 11},
                hovertext=[f"{f['kind']} on {f['target']} ({f['outcome']})" for f in job_faults],
                hoverinfo="text",
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(
            title_text="ev/s" if col == 1 else None, rangemode="tozero", row=1, col=col
        )
        fig.update_yaxes(title_text="ms" if col == 1 else None, rangemode="tozero", row=2, col=col)
    fig.update_xaxes(**GRID)
    fig.update_yaxes(**GRID)
    fig.update_layout(
        **{**BASE_LAYOUT, "legend": {"orientation": "h", "y": -0.12}, "hovermode": "x"},
        uirevision="timelines",
        height=560,
    )
    return fig


def strategy_figure(rows: list[dict]) -> go.Figure:
    """Mean downtime and recovery time per strategy, grouped bars (seconds)."""
    strategies = [r["strategy"] for r in rows]
    fig = go.Figure()
    for index, (key, label) in enumerate(
        (("downtime_s", "mean downtime (s)"), ("recovery_time_s", "mean recovery time (s)"))
    ):
        fig.add_trace(
            go.Bar(
                x=strategies,
                y=[r[key] for r in rows],
                name=label,
                marker_color=FAULT if index == 0 else RECOVERY,
                text=[f"{r[key]:.1f}" if r[key] is not None else "" for r in rows],
                textposition="outside",
            )
        )
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest"},
        title={"text": "Strategies compared (recovered episodes)", "x": 0.01},
        barmode="group",
        yaxis={"title": "s", "rangemode": "tozero", **GRID},
        uirevision="strategies",
        height=320,
    )
    return fig


# One colour per phase (recovery_phases.PHASES order): the controller's steps in greys and
# blues, the stage's in greens, the output last in amber.
PHASE_COLOURS = ("#9aa0a6", "#5f6368", "#2457d6", "#12b5cb", "#188038", "#81c995", "#f29900")


def phase_figure(episodes: list[dict]) -> go.Figure:
    """One horizontal bar per episode, split into its phases (seconds from the fault): where
    each recovery's time went. Episodes without any phase seen are left out."""
    fig = go.Figure()
    shown = []
    for episode in episodes:
        phases = recovery_phases.phases_of(episode.get("phases") or {})
        if any(p.seconds is not None for p in phases):
            shown.append((episode, phases))
    labels = [f"{e['job']} · {e['stage'] or '-'} · {e['action']} #{e['id']}" for e, _ in shown]
    for index, (name, _mark) in enumerate(recovery_phases.PHASES):
        seconds = [phases[index].seconds or 0.0 for _, phases in shown]
        fig.add_trace(
            go.Bar(
                y=labels,
                x=seconds,
                orientation="h",
                name=name,
                marker_color=PHASE_COLOURS[index],
                hovertemplate=f"{name}: %{{x:.2f}} s<extra>%{{y}}</extra>",
            )
        )
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest", "legend": {"orientation": "h", "y": -0.2}},
        title={"text": "Phases of each recovery (s from the fault)", "x": 0.01},
        barmode="stack",
        xaxis={"title": "s", "rangemode": "tozero", **GRID},
        yaxis={"autorange": "reversed"},
        uirevision="phases",
        height=max(220, 90 + 28 * len(shown)),
    )
    return fig
