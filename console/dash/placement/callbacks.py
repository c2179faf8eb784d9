"""Placement callbacks: thin glue from data queries to figures and node cards, plus the admin's
threshold control.

Each function is a Dash callback (wired in placement/app.py) and can be called directly in tests;
`user` is the Django user django-plotly-dash passes in.
"""

from __future__ import annotations

from dash import html
from dash.exceptions import PreventUpdate

from console.dash import controls, data, reserve_data
from console.dash.common import (
    badge,
    can_view,
    cpu_priority_label,
    fmt_num,
    fmt_pct,
    fmt_time,
    message,
    one_choice,
    scroll_box,
    table,
    text_value,
)
from console.dash.placement import figures
from console.dash.placement.layout import NODE_SHOW_OPTIONS
from console.dash.placement.layout import controls as controls_layout
from console.policy.config import PolicyConfig
from console.policy.resources import q_scale
from console.roles import ADMIN, has_role
from console.services.teams import jobs_visible_to

# Chips shown per role on a node card; the rest fold into "+N more".
CHIPS_SHOWN = 8
NODE_SHOW = {option["value"] for option in NODE_SHOW_OPTIONS}


def _chips(replicas: list[dict], role: str):
    if not replicas:
        return html.Span("none", className="muted")
    if len(replicas) > CHIPS_SHOWN:
        rest = replicas[CHIPS_SHOWN:]
        return [
            *_chips(replicas[:CHIPS_SHOWN], role),
            html.Details(
                [
                    html.Summary(f"+{len(rest)} more"),
                    html.Div(_chips(rest, role), className="chips"),
                ]
            ),
        ]
    chips = []
    for r in replicas:
        priority = cpu_priority_label(r.get("nice"), r.get("batch_every_s"))
        label = [f"{r['job']}/{r['stage']}"]
        detail = r["state"]
        if priority:
            label.append(html.Small(priority, className="chip-note"))
            detail += f"; CPU priority {priority}"
        chips.append(
            html.A(
                label,
                href=f"/console/jobs/{r['job_id']}/",
                className=f"chip chip-{role}",
                title=f"{r['replica_id']} ({detail})",
            )
        )
    return chips


def _node_card(node: dict, rank: int):
    idle = " · ".join(
        f"{label} {fmt_pct(node[key])}" for key, label in figures.IDLE_BARS if node[key] is not None
    )
    return html.Div(
        [
            html.Div(
                [
                    html.Span(f"#{rank}", className="rank", title="place in the node queue by Q"),
                    html.B(node["name"]),
                    html.Span(node["state"], className=f"status status-{node['state']}"),
                    html.Span(f"Q {fmt_num(node['q_score'], 2)}", className="q"),
                ],
                className="node-head",
            ),
            html.Div(idle or "no resource samples yet", className="muted small"),
            html.Div("Primaries", className="label"),
            html.Div(_chips(node["primaries"], "primary"), className="chips"),
            html.Div("Standbys", className="label"),
            html.Div(_chips(node["standbys"], "standby"), className="chips"),
            html.Div(
                f"warm spares: {node['warm_spares']}",
                className="muted small",
                title="pre-started stage processes (JVM and session up) that a restart or a new "
                "standby takes over; they count against the reserve",
            ),
            html.Div(f"heartbeat {fmt_time(node['last_heartbeat'])}", className="muted small"),
        ],
        className="card node-card",
        id=f"node-{node['name']}",
    )


def _summary(nodes: list[dict], reserve: float):
    free = figures.cluster_free(nodes)
    standbys = sum(len(n["standbys"]) for n in nodes)

    def tile(label, value):
        return html.Div(
            [html.Div(value, className="kpi-value"), html.Div(label, className="kpi-label")],
            className="kpi",
        )

    return [
        tile("cluster CPU free", fmt_pct(free["cpu"])),
        tile("cluster memory free", fmt_pct(free["mem"])),
        tile("reserve kept free", fmt_pct(reserve)),
        tile("standbys placed", str(standbys)),
        tile("warm spares", str(sum(n["warm_spares"] for n in nodes))),
    ]


# Badge colour per verdict rule (console/policy/placement.py names the rules).
RULE_BADGES = {"placed at launch": "standby", "added": "standby", "moved": "starting", "kept": "up"}


def _standby_table(rows: list[dict]):
    """One row per live standby: where it runs, its node's Q rank, and the policy's verdict."""
    return table(
        ["Standby", "Node", "Q now", "Q rank (alive nodes)", "Its primary on", "Rule",
         "Why (and the reserve check)", "Judged"],
        [
            [
                _chips([row], "standby"),
                row["node"],
                fmt_num(row["q"], 2),
                row["q_rank"],
                row["primary_node"] or "—",
                badge(row["rule"], RULE_BADGES.get(row["rule"], "unknown")),
                html.Div(
                    [
                        html.Span(row["reason"], className="reason small"),
                        html.Span(f"Reserve: {row['reserve']}", className="reason small muted"),
                    ]
                ),
                fmt_time(row["judged_at"]),
            ]
            for row in rows
        ],
        "No standby runs now.",
        table_id="standby-verdicts",
    )  # fmt: skip


def _host_reserve(reserve_rows: dict, reserve: float):
    """Each host's measured free CPU and memory against the reserve, and the standbys the
    reserve downgraded to checkpoint-only (highest priority first), with why."""
    hosts = table(
        ["Host", "Nodes", "Cores", "Memory MiB", "CPU free", "Memory free", "Reserve"],
        [
            [
                row["host"],
                ", ".join(row["nodes"]),
                fmt_num(row["cpu_total"], 1),
                fmt_num(row["mem_total"], 0),
                fmt_pct(row["cpu_free"]),
                fmt_pct(row["mem_free"]),
                html.Span(
                    [
                        fmt_pct(reserve),
                        badge("kept", "up")
                        if min(row["cpu_free"], row["mem_free"]) >= reserve
                        else badge("crossed", "failed"),
                    ]
                ),
            ]
            for row in reserve_rows["hosts"]
        ],
        "No host reports samples.",
        table_id="host-reserve-hosts",
    )
    downgraded = table(
        ["Stage", "P_eff", "Downgraded", "Why"],
        [
            [
                html.A(f"{row['job']}/{row['stage']}", href=f"/console/jobs/{row['job_id']}/"),
                fmt_num(row["priority"], 3),
                f"{fmt_num(row['since_s'], 0)} s ago",
                html.Span(row["reason"], className="reason small"),
            ]
            for row in reserve_rows["downgraded"]
        ],
        "No standby is downgraded: every stage the policy protects has its standby.",
        table_id="host-reserve-downgraded",
    )
    return [
        html.P(
            "Measured use per host (its agents' processes, the mean of their last 5 samples; "
            "each machine's cores counted once). With the policy's hold_host_reserve at 1, past "
            "the reserve a launch is refused, a spare is not started, and standbys run "
            "checkpoint-only, lowest priority first; one is restored 60 s later at the "
            "earliest, once the reserve plus 10% stays free with it. At 0 (the default) the "
            "reserve is kept at placement only.",
            className="muted small",
        ),
        hosts,
        downgraded,
    ]


def _policy_table(policy: dict):
    items = [
        html.Div([html.Span(name, className="muted"), html.Span(f"{value:g}")], className="kv")
        for name, value in policy["values"].items()
    ]
    author = policy["created_by"] or "system"
    return [
        html.P(
            f"Version {policy['version']} by {author} at {fmt_time(policy['created_at'])}: "
            f"{policy['reason'] or 'no reason given'}",
            id="policy-version",
        ),
        html.Div(items, className="kv-grid"),
    ]


def _predictor_table(runs: list[dict], window_s: float):
    """The predictor's training runs; the newest decides whether operators get a learned fr.
    `window_s` is the policy's prediction window (a run shows the one it was trained with)."""
    if runs and runs[0]["used"]:
        verdict = f"In force: model #{runs[0]['id']}; each operator's fr is on its job page."
    elif runs:
        verdict = f"Operators get the prior fr: the newest model (#{runs[0]['id']}) is not used."
    else:
        verdict = "Not trained yet: operators get the prior fr until a run beats it."
    shown_window = runs[0]["window_s"] if runs else window_s
    rows = [
        [
            f"#{run['id']}",
            fmt_time(run["trained_at"]),
            f"{run['samples']} ({run['failures']} failed)",
            fmt_num(run["r2"], 3),
            f"{fmt_num(run['mae'], 3)} / {fmt_num(run['prior_mae'], 3)}",
            f"{fmt_num(run['mse'], 4)} / {fmt_num(run['prior_mse'], 4)}",
            badge("used" if run["used"] else "not used", "active" if run["used"] else "passive"),
            html.Span(run["reason"], className="small"),
        ]
        for run in runs
    ]
    return [
        html.P(
            f"{verdict} A row is one stage over {fmt_num(shown_window, 0)} s; fr is the chance "
            "the stage fails in the next window. Features: recent faults of the stage and of its "
            "node, the node's CPU, memory, disk and network use, the "
            "stage's throughput and the job's p99 latency. The newest 30% of rows are held out.",
            id="predictor-verdict",
        ),
        table(
            ["Run", "Trained", "Samples", "R² (held out)", "MAE / prior", "MSE / prior", "Used",
             "Why"],
            rows,
            "No training run yet (the beat task runs every 5 minutes).",
            table_id="predictor-runs",
        ),
    ]  # fmt: skip


def _shown(node: dict, show: str, reserve: float) -> bool:
    if show == "up":
        return node["state"] == "up"
    if show == "not-up":
        return node["state"] != "up"
    if show == "busy":
        idle = [node[key] for key in ("cpu_idle", "mem_idle") if node[key] is not None]
        return any(value < reserve for value in idle)
    if show == "standbys":
        return bool(node["standbys"])
    return True


def _of_jobs(replicas: list[dict], search: str) -> list[dict]:
    return [r for r in replicas if search.lower() in r["job"].lower()]


def refresh(n_intervals, show=None, job_search=None, user=None):
    """Every 2 s: reserve tiles, idle and Q charts with what Q's scale is, node cards with
    replicas, why each standby sits where it is, the policy, the fault predictor's training
    runs and the host reserve. `show` picks the node cards (NODE_SHOW_OPTIONS) and
    `job_search` keeps the replicas of jobs whose name contains it; the charts always show
    every node."""
    if not can_view(user):
        raise PreventUpdate
    show = one_choice(show, NODE_SHOW, "all")
    search = text_value(job_search)
    visible = jobs_visible_to(user)
    nodes = data.node_rows(visible)
    policy = data.policy_thresholds()
    reserve = policy["values"]["resource_reserve"]
    scale = q_scale(PolicyConfig(**policy["values"]))
    standbys = figures.standby_explanations(data.standby_rows(visible), nodes)
    cards = []
    for rank, node in enumerate(figures.by_q(nodes), start=1):
        if not _shown(node, show, reserve):
            continue
        if search:
            node = {
                **node,
                "primaries": _of_jobs(node["primaries"], search),
                "standbys": _of_jobs(node["standbys"], search),
            }
            if not node["primaries"] and not node["standbys"]:
                continue
        cards.append(_node_card(node, rank))
    if search:
        standbys = _of_jobs(standbys, search)
    return (
        _summary(nodes, reserve),
        figures.idle_figure(nodes, reserve),
        figures.q_figure(nodes, scale),
        figures.q_scale_note(policy["values"]),
        cards or html.P("No node to show.", className="muted"),
        f"{len(cards)} of {len(nodes)} nodes shown, in queue order by Q",
        scroll_box(_standby_table(standbys)),
        _policy_table(policy),
        _predictor_table(data.predictor_trainings(), policy["values"]["prediction_window_s"]),
        _host_reserve(reserve_data.host_reserve(visible), reserve),
    )


def render_controls(pathname, user=None):
    """The threshold editor for admins; nothing at all for everyone else."""
    return controls_layout() if has_role(user, ADMIN) else None


def ask_threshold(n_clicks, field, value):
    """First step of changing a threshold: the confirm dialog with old and new value."""
    if not n_clicks:
        raise PreventUpdate
    old = data.policy_thresholds()["values"].get(field)
    return True, f"Change {field} from {old} to {value}? This writes a new policy version."


def threshold_confirmed(submit_n_clicks, field, value, reason, user=None):
    """Second step: write the new policy version through the policy service."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        policy = controls.change_threshold(user, field=field, value=value, reason=reason)
    except controls.ActionRefused as exc:
        return message(f"Not saved: {exc}", ok=False)
    return message(f"Saved: policy v{policy.version} has {field} = {value}.", ok=True)
