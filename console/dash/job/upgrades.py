"""Job page: the upgrade in progress and the job's version history, built from upgrade rows
(console.dash.data.upgrade_rows). Pure: no database, the time passed in."""

from __future__ import annotations

from datetime import datetime

from dash import html

from console.dash.common import badge, fmt_num, fmt_time, table
from console.models import JobUpgrade

MODE_LABELS = {"blue_green": "blue/green", "stop_restart": "stop and restart"}


def under_way(upgrades: list[dict]) -> dict | None:
    """The job's upgrade under way, if any (at most one, its newest)."""
    return next((u for u in upgrades if u["under_way"]), None)


def store_value(upgrade: dict | None) -> dict | None:
    """What the page keeps of the upgrade under way for its Confirm and Roll back buttons."""
    if upgrade is None:
        return None
    return {
        "id": upgrade["id"],
        "status": upgrade["status"],
        "from": upgrade["from_topology"],
        "to": upgrade["to_topology"],
    }


def params_text(params: dict) -> str:
    """{"OP.KEY": "V", ...} as "OP.KEY=V, ..." (sorted), "" for none."""
    return ", ".join(f"{name}={value}" for name, value in sorted(params.items()))


def version_label(topology: str, params: dict) -> str:
    """`activity@2`, or `topn (topn.n=3)` with the operator parameters it runs with."""
    shown = params_text(params)
    return f"{topology} ({shown})" if shown else topology


def changes_strategy(upgrade: dict) -> bool:
    """Whether the upgrade changes the job's strategy (its versions stay)."""
    return bool(upgrade.get("to_strategy")) and upgrade["to_strategy"] != upgrade["from_strategy"]


def is_app(upgrade: dict) -> bool:
    """Whether the upgrade is of an existing app (one copy, stopped and started again)."""
    return upgrade["case"] == JobUpgrade.Case.APP_RESTART


def how(upgrade: dict) -> str:
    """`blue/green`, `stop and restart`, or `in place` for a strategy change; an app's is
    always a stop and restart, whatever mode was asked for."""
    if changes_strategy(upgrade):
        return "in place"
    if is_app(upgrade):
        return MODE_LABELS["stop_restart"]
    return MODE_LABELS.get(upgrade["mode"], upgrade["mode"])


def from_to(upgrade: dict) -> str:
    """`activity@1 → activity@2`, each side with its parameters; `strategy adaptive →
    active-all` for a strategy change."""
    if changes_strategy(upgrade):
        return f"strategy {upgrade['from_strategy']} → {upgrade['to_strategy']}"
    return (
        f"{version_label(upgrade['from_topology'], upgrade['from_params'])} → "
        f"{version_label(upgrade['to_topology'], upgrade['to_params'])}"
    )


def _from_to_cell(upgrade: dict):
    """The versions on one line and, when parameters are involved, the parameters under them
    (the table stays narrow enough to read without scrolling)."""
    if changes_strategy(upgrade):
        return from_to(upgrade)
    versions = f"{upgrade['from_topology']} → {upgrade['to_topology']}"
    if not (upgrade["from_params"] or upgrade["to_params"]):
        return versions
    before = params_text(upgrade["from_params"]) or "defaults"
    after = params_text(upgrade["to_params"]) or "defaults"
    return html.Div([versions, html.Div(f"{before} → {after}", className="muted small")])


def ago(at: datetime | None, now: datetime) -> str:
    """How long ago `at` was: "40 s ago", "3 min ago", "2 h ago"; a dash for never."""
    if at is None:
        return "—"
    seconds = max(0, int((now - at).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def _field(label: str, value):
    return html.Div([html.Span(label, className="muted"), html.Span(value)], className="kv")


def _replica(replica_id: str, topology: str) -> str:
    return f"{replica_id} ({topology})" if replica_id else "—"


def _requested(upgrade: dict, now: datetime) -> str:
    by = f" by {upgrade['requested_by']}" if upgrade["requested_by"] else ""
    return f"{ago(upgrade['requested_at'], now)}{by}"


def _asked(upgrade: dict) -> str | None:
    """What an operator asked of the upgrade under way, until the controller carries it out."""
    if not upgrade["requested_action"]:
        return None
    who = upgrade["ended_by"] or "an operator"
    return f"{upgrade['requested_action']} asked by {who}; the controller carries it out"


def upgrade_panel(upgrade: dict | None, now: datetime):
    """The upgrade under way: status, case and why, from -> to, blue and green, the checkpoint
    batch green started from, and how long ago it was asked for and switched."""
    if upgrade is None:
        return None
    case = upgrade["case"] or "not decided yet (the state check runs)"
    asked = _asked(upgrade)
    return html.Div(
        [
            html.Div(
                [
                    html.B(f"Upgrade #{upgrade['id']}"),
                    badge(upgrade["status"], upgrade["status"]),
                    html.Span(upgrade["status_label"], className="muted"),
                ],
                className="upgrade-head",
                id="upgrade-status",
            ),
            html.Div(
                [
                    html.Span(from_to(upgrade), id="upgrade-from-to"),
                    html.Span(f" · {how(upgrade)}"),
                ],
                className="upgrade-versions",
            ),
            html.P(
                [html.B("Case: "), html.Span(case, id="upgrade-case")]
                + ([" — ", html.Span(upgrade["reason"])] if upgrade["reason"] else []),
                className="upgrade-reason",
            ),
            html.Div(
                [
                    *_replica_fields(upgrade),
                    _field("checkpoint batch", fmt_num(upgrade["checkpoint_batch"], 0)),
                    _field("requested", _requested(upgrade, now)),
                    _field("switched", ago(upgrade["switched_at"], now)),
                    _field("results", results_check(upgrade)),
                ],
                className="kv-grid",
            ),
            html.P(asked, className="control-ok", id="upgrade-asked") if asked else None,
        ]
    )


def _replica_fields(upgrade: dict) -> list:
    """Blue and green, each with its version; an app's one replica runs both in turn."""
    if is_app(upgrade):
        return [_field("replica", upgrade["blue_replica"] or "—")]
    return [
        _field("blue", _replica(upgrade["blue_replica"], upgrade["from_topology"])),
        _field("green", _replica(upgrade["green_replica"], upgrade["to_topology"])),
    ]


def results_check(upgrade: dict) -> str:
    """What the old version found checking the new one's results (an upgrade declared
    result-preserving), in a few words."""
    if not upgrade.get("result_preserving"):
        return "not checked"
    compared, differing = upgrade.get("results_compared"), upgrade.get("results_differing")
    if not compared:
        return "no key compared yet"
    if differing:
        return f"{differing} of {compared} keys differ"
    return f"equal on {compared} keys"


def _case_cell(upgrade: dict):
    if not upgrade["case"]:
        return "—"
    # The reason is long; it is there on hover (and in full in the panel while under way).
    return html.Span(upgrade["case"], title=upgrade["reason"] or None)


def _lost_duplicated(upgrade: dict) -> str:
    if upgrade["lost"] is None and upgrade["duplicates"] is None:
        return "—"
    return f"{fmt_num(upgrade['lost'], 0)} / {fmt_num(upgrade['duplicates'], 0)}"


def _ended_cell(upgrade: dict):
    if upgrade["under_way"]:
        asked = _asked(upgrade)
        return html.Span(asked, className="reason") if asked else "—"
    by = upgrade["ended_by"] or "controller"
    return html.Span(
        [html.B(by), f": {upgrade['outcome'] or upgrade['status']}"], className="reason"
    )


def upgrade_table_rows(upgrades: list[dict], now: datetime | None = None) -> list[list]:
    """One row per upgrade, in the order given (newest first): requested at, by whom,
    from -> to with parameters, mode, case, status, checkpoint batch, switch time, output gap,
    lost / duplicated results, and who ended it and how."""
    return [
        [
            fmt_time(u["requested_at"], now),
            u["requested_by"] or "—",
            _from_to_cell(u),
            how(u),
            _case_cell(u),
            badge(u["status"], u["status"]),
            fmt_num(u["checkpoint_batch"], 0),
            fmt_time(u["switched_at"], now),
            fmt_num(u["gap_s"], 1),
            _lost_duplicated(u),
            _ended_cell(u),
        ]
        for u in upgrades
    ]


def upgrade_table(upgrades: list[dict], now: datetime | None = None):
    """The job's version history: every upgrade asked for, newest first."""
    return table(
        [
            "Requested",
            "By",
            "From → to",
            "Mode",
            "Case",
            "Status",
            "Checkpoint batch",
            "Switched",
            "Output gap (s)",
            "Lost / duplicated",
            "Ended by / outcome",
        ],
        upgrade_table_rows(upgrades, now),
        "This job has not been upgraded.",
        table_id="upgrades",
    )
