"""Job page callbacks: thin glue from data queries to tables and figures, plus the fault, stop,
restart and upgrade controls.

Each function is a Dash callback (wired in job/app.py) and can be called directly in tests;
`user` is the Django user django-plotly-dash passes in.
"""

from __future__ import annotations

import re
from datetime import timedelta

from dash import html
from dash.exceptions import PreventUpdate
from django.utils import timezone

from console.clock import utc
from console.dash import controls, data, kafka_data
from console.dash.common import (
    DEFAULT_WINDOW_S,
    MAX_POINTS,
    badge,
    can_view,
    cpu_priority_label,
    fmt_num,
    fmt_time,
    message,
    table,
)
from console.dash.job import app_queries, figures, upgrades
from console.dash.job.layout import controls as controls_layout
from console.dash.job.layout import upgrade_actions
from console.models import JobUpgrade, Policy
from console.redis import redis_client
from console.roles import OPERATOR, has_role
from console.services import queries
from console.services.app_operators import app_view
from console.services.control.record import reconcile_failures
from console.services.faults import Target, target_of
from console.services.teams import jobs_visible_to
from spark_runtime.strategies import STRATEGIES

JOB_PATH = re.compile(r"/console/jobs/(\d+)/?$")
# The decision, failure, fault and upgrade tables show this many rows at most.
TABLE_ROWS = 30


def job_id_from_path(pathname: str | None) -> int | None:
    """The job id in /console/jobs/<id>/, or None for any other path."""
    if not isinstance(pathname, str):
        return None  # a hand-made request to the Dash endpoint can send anything
    match = JOB_PATH.search(pathname)
    return int(match.group(1)) if match else None


def _tile(label: str, value, tile_id: str):
    return html.Div(
        [
            html.Div(value, className="kpi-value", id=tile_id),
            html.Div(label, className="kpi-label"),
        ],
        className="kpi",
    )


def _summary(job: dict, current: dict, replicas: list[dict]):
    primaries = sum(1 for r in replicas if r["role"] == "primary")
    standbys = sum(1 for r in replicas if r["role"] == "standby")
    return [
        _tile("status", badge(job["status"], job["status"]), "job-status"),
        _tile("throughput (ev/s)", fmt_num(current.get("throughput_eps"), 0), "job-throughput"),
        _tile("latency p99 (ms)", fmt_num(current.get("latency_p99_ms"), 0), "job-p99"),
        _tile("primaries / standbys", f"{primaries} / {standbys}", "job-replicas"),
    ]


def _failure_reason(job: dict):
    """Why a failed job failed (the controller's one-line cause and the last log lines)."""
    if job["status"] != "failed" or not job.get("status_reason"):
        return None
    cause, _, tail = job["status_reason"].partition("\n")
    return html.Div(
        [
            html.B("Failed: "),
            html.Span(cause, id="job-failure-cause"),
            html.Pre(tail.strip(), className="log-tail") if tail.strip() else None,
        ],
        className="card failure-reason",
    )


def _reconcile_failing(failure: dict | None):
    """That the controller's reconciles of the job keep failing (it retries them with a
    growing delay): how many in a row, since when, the last error."""
    if failure is None:
        return None
    since = utc(failure.get("since", 0))
    return html.Div(
        [
            html.B("Supervision failing: "),
            html.Span(
                f"{failure.get('failures', 0)} reconciles in a row failed since "
                f"{since:%Y-%m-%d %H:%M:%S} UTC; next try in "
                f"{fmt_num(failure.get('retry_in_s'), 0)} s",
                id="job-reconcile-failures",
            ),
            html.Pre(failure.get("error", ""), className="log-tail"),
        ],
        className="card failure-reason",
    )


def _operator_table(operators: list[dict]):
    rows = [
        [
            html.B(op["name"]),
            op["kind"],
            op["stage"] or "—",
            f"{fmt_num(op['cpu_demand'], 2)} cores, {fmt_num(op['mem_demand_mb'], 0)} MiB",
            op["demand_source"],
            fmt_num(op["type_score"], 2),
            fmt_num(op["resource_score"], 2),
            fmt_num(op["dependency_score"], 2),
            html.B(fmt_num(op["priority"], 2)),
            badge(op["mode"], op["mode"]),
            fmt_num(op["checkpoint_interval_s"], 1),
            fmt_num(op["predicted_fault_rate"], 3),
            html.Span(op["fault_rate_source"] or "—", className="small"),
            fmt_time(op["updated_at"]),
        ]
        for op in operators
    ]
    return table(
        [
            "Operator",
            "Kind",
            "Stage",
            "Demand",
            "Demand from",
            "S",
            "R",
            "L",
            "P",
            "Mode",
            "Interval (s)",
            "fr",
            "fr from",
            "Updated",
        ],
        rows,
        "This job has no operators.",
        table_id="operators",
    )


def _replica_table(replicas: list[dict], chains: dict[str, str]):
    rows = [
        [
            r["stage"],
            chains.get(r["stage"], "—"),
            _role_cell(r),
            r["node_name"],
            r["state"],
            str(r["fencing_epoch"]),
            _interval_in_force(r),
        ]
        for r in replicas
    ]
    return table(
        ["Stage", "Chains", "Role (CPU priority)", "Node", "State", "Epoch", "Checkpoint interval"],
        rows,
        "No replicas running.",
        table_id="replicas",
    )


def _role_cell(replica: dict):
    """The replica's role, and under it how it shares the CPU (its nice level and pace)."""
    priority = cpu_priority_label(replica["nice"], replica["batch_every_s"])
    role = badge(replica["role"], replica["role"])
    if not priority:
        return role
    return html.Div([role, html.Div(priority, className="muted small")])


def _interval_in_force(replica: dict) -> str:
    """The interval the replica runs with, and since when (it reports both)."""
    if not replica.get("checkpoint_interval_s"):
        return "—"
    return (
        f"{fmt_num(replica['checkpoint_interval_s'], 1)} s since "
        f"{fmt_time(replica['interval_since'])}"
    )


def _decision_table(decisions: list[dict]):
    rows = [
        [fmt_time(d["at"]), d["kind"], d["operator"] or "—", d["node"] or "—", d["reason"]]
        for d in decisions
    ]
    return table(
        ["Time", "Decision", "Operator", "Node", "Reason"],
        rows,
        "No controller decisions recorded for this job yet.",
        table_id="decisions",
    )


def _failure_table(failures: list[dict]):
    rows = [
        [
            fmt_time(f["at"]),
            f["replica_id"] or "—",
            f["node"] or "—",
            html.Pre(f["error_tail"] or f["reason"], className="log-tail"),
            f["response"] or "—",
        ]
        for f in failures
    ]
    return table(
        ["Time", "Replica", "Node", "Error (last log lines)", "Controller response"],
        rows,
        "No failures recorded for this job.",
        table_id="failures",
    )


def _fault_table(faults: list[dict]):
    rows = [
        [
            fmt_time(f["requested_at"]),
            f["kind"],
            f["target"],
            f["requested_by"],
            badge(f["outcome"], f["outcome"]),
            fmt_time(f["injected_at"]),
            f["detail"] or "",
        ]
        for f in faults
    ]
    return table(
        ["Requested", "Kind", "Target", "By", "Outcome", "Injected", "Detail"],
        rows,
        "No faults requested for this job.",
        table_id="faults",
    )


def refresh(n_intervals, window_s, pathname, user=None):
    """Every 2 s: summary tiles, DAG, replicas, operators, history (with upgrade markers),
    decisions, failures, faults, then the upgrade under way and the upgrade history, then the
    Kafka panel (hidden for a job without Kafka), then an app's queries and output (hidden for
    a job that is not an app)."""
    job_id = job_id_from_path(pathname)
    if not can_view(user) or job_id is None:
        raise PreventUpdate
    # Another team's job is as absent as one that does not exist: nothing of it is read.
    job = data.job_detail(job_id, jobs_visible_to(user))
    if job is None:
        raise PreventUpdate
    now = timezone.now()
    window_s = window_s or DEFAULT_WINDOW_S
    operators = data.operator_rows(job_id)
    replicas = data.stage_placement(job_id)
    current = queries.latest(
        ("throughput_eps", "latency_p99_ms"), job_id=job_id, stage=queries.JOB_SCOPE
    )
    threshold = Policy.current().priority_threshold
    history = data.operator_history(job_id, window_s, MAX_POINTS, end=now)
    job_upgrades = data.upgrade_rows(job_id, limit=TABLE_ROWS)
    markers = figures.upgrade_markers(job_upgrades, since=now - timedelta(seconds=window_s))
    in_progress = upgrades.under_way(job_upgrades)
    kafka = kafka_data.job_kafka(job, replicas)
    failure = reconcile_failures(redis_client(), [job["key"]]).get(job["key"])
    return (
        _summary(job, current, replicas),
        [card for card in (_failure_reason(job), _reconcile_failing(failure)) if card] or None,
        figures.dag_figure(operators, threshold),
        _replica_table(replicas, figures.stage_chains(operators)),
        _operator_table(operators),
        figures.history_figure(history, [op["name"] for op in operators], threshold, markers),
        _decision_table(data.recent_decisions(job_id, limit=TABLE_ROWS)),
        _failure_table(data.failure_history(job_id, limit=TABLE_ROWS)),
        _fault_table(data.fault_rows(job_ids=[job_id], limit=TABLE_ROWS)),
        in_progress is None,
        upgrades.upgrade_panel(in_progress, now),
        upgrades.store_value(in_progress),
        upgrades.upgrade_table(job_upgrades, now),
        kafka is None,
        figures.kafka_panel(kafka, current.get("throughput_eps")),
        *app_queries.app_panel(app_view(job["topology"], job["key"], redis_client())),
    )


def render_controls(pathname, user=None):
    """Fault, stop, restart and upgrade controls for operators and admins; nothing at all for
    viewers."""
    job_id = job_id_from_path(pathname)
    if job_id is None or not has_role(user, OPERATOR):
        return None
    job = data.job_detail(job_id, jobs_visible_to(user))
    if job is None:
        return None
    operators = [op["name"] for op in data.operator_rows(job_id)]
    params = data.upgrade_params_in_force(job_id)
    return controls_layout(
        operators,
        data.node_choices(),
        data.topology_versions(job["topology"]),
        job["topology"],
        "\n".join(f"{name}={value}" for name, value in sorted(params.items())),
        list(STRATEGIES),
        job["strategy"],
    )


def render_upgrade_actions(pathname, user=None):
    """Confirm and Roll back under the upgrade in progress, for operators and admins only."""
    if job_id_from_path(pathname) is None or not has_role(user, OPERATOR):
        return None
    return upgrade_actions()


def target_fields(kind):
    """Enable the operator picker for operator faults and the node picker for node faults
    (neither for a fault without a target: kafka-broker), as the kind's entry in the fault
    service's table says."""
    target = target_of(kind)
    return target != Target.OPERATOR, target != Target.NODE


def _fault_target(kind, operator, node_id) -> str:
    target = target_of(kind)
    if target is None:
        return "the Kafka broker"
    return f"node #{node_id}" if target == Target.NODE else f"operator {operator}"


def ask_fault(n_clicks, kind, operator, node_id, pathname):
    """First step of injecting: show a confirm dialog naming the fault and its target."""
    if not n_clicks:
        raise PreventUpdate
    target = _fault_target(kind, operator, node_id)
    return True, f"Inject {kind} on {target} of job #{job_id_from_path(pathname)}?"


def inject_confirmed(
    submit_n_clicks, kind, operator, node_id, duration_s, pathname, workers=None, user=None
):
    """Second step: the user confirmed; record the fault through the fault service, which
    checks the params (duration, CPU hogs) against the target node's bounds."""
    if not submit_n_clicks:
        raise PreventUpdate
    target = target_of(kind)
    try:
        fault = controls.inject_fault(
            user,
            job_id_from_path(pathname),
            kind=kind,
            operator=operator if target == Target.OPERATOR else None,
            node_id=node_id if target == Target.NODE else None,
            duration_s=duration_s,
            workers=workers,
        )
    except controls.ActionRefused as exc:
        return message(f"Not injected: {exc}", ok=False)
    return message(f"Fault #{fault.pk} requested: {fault}.", ok=True)


def ask_stop(n_clicks, pathname):
    """First step of stopping this job: the confirm dialog."""
    if not n_clicks:
        raise PreventUpdate
    return True, f"Stop job #{job_id_from_path(pathname)}? Its replicas will be shut down."


def stop_confirmed(submit_n_clicks, pathname, user=None):
    """Second step: stop the job through the job service."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        job = controls.stop_job(user, job_id_from_path(pathname))
    except controls.ActionRefused as exc:
        return message(f"Not stopped: {exc}", ok=False)
    return message(f"Job {job.name} is {job.status}.", ok=True)


def ask_restart(n_clicks, pathname):
    """First step of restarting this job: the confirm dialog."""
    if not n_clicks:
        raise PreventUpdate
    return True, (
        f"Restart job #{job_id_from_path(pathname)}? A failed job resumes from its checkpoints."
    )


def restart_confirmed(submit_n_clicks, pathname, user=None):
    """Second step: ask the controller to run the job again."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        job = controls.restart_job(user, job_id_from_path(pathname))
    except controls.ActionRefused as exc:
        return message(f"Not restarted: {exc}", ok=False)
    return message(f"Job {job.name}: restart requested; the controller starts it.", ok=True)


def ask_upgrade(n_clicks, version, params_text, preserving, pathname):
    """First step of upgrading: the confirm dialog names the version, the parameters and
    whether the results are to be checked (`preserving`: the checklist's values)."""
    if not n_clicks:
        raise PreventUpdate
    lines = [line.strip() for line in str(params_text or "").splitlines() if line.strip()]
    params = f" with {', '.join(lines)}" if lines else " with the version's own parameters"
    check = (
        " Its results are checked against the running version's: a difference rolls it back."
        if preserving
        else ""
    )
    return True, (
        f"Upgrade job #{job_id_from_path(pathname)} to {version}{params}? The new version starts "
        f"beside the running one and takes the output over once it has caught up.{check}"
    )


def upgrade_confirmed(submit_n_clicks, version, params_text, preserving, pathname, user=None):
    """Second step: ask for the upgrade through the upgrade service, which checks the version
    and the parameters and says which field is wrong."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        upgrade = controls.upgrade_job(
            user, job_id_from_path(pathname), version, params_text, bool(preserving)
        )
    except controls.ActionRefused as exc:
        return message(f"Not upgraded: {exc}", ok=False)
    return message(
        f"Upgrade #{upgrade.pk} requested: {upgrade.from_topology} -> {upgrade.to_topology}; "
        "the state check runs first.",
        ok=True,
    )


def ask_strategy(n_clicks, strategy, pathname):
    """First step of changing the strategy: the confirm dialog names it."""
    if not n_clicks:
        raise PreventUpdate
    return True, (
        f"Protect job #{job_id_from_path(pathname)} by {strategy} from now on? Its replicas go "
        "on running; standbys start or stop for the new strategy."
    )


def strategy_confirmed(submit_n_clicks, strategy, pathname, user=None):
    """Second step: ask for the change through the upgrade service, which refuses a strategy
    that would cut the job into other stages, saying how."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        upgrade = controls.change_strategy(user, job_id_from_path(pathname), strategy)
    except controls.ActionRefused as exc:
        return message(f"Not changed: {exc}", ok=False)
    return message(
        f"Upgrade #{upgrade.pk} requested: strategy {upgrade.from_strategy} -> "
        f"{upgrade.to_strategy}; the Upgrades card says when it is made or why it is refused.",
        ok=True,
    )


def _upgrade_id(current):
    """The id of the upgrade under way from the page's store (a forged one is checked again
    by the controls)."""
    return current.get("id") if isinstance(current, dict) else None


def end_buttons(current):
    """(Confirm disabled, Roll back disabled): confirm once the new version writes (validating),
    roll back while the upgrade is under way."""
    if not isinstance(current, dict):
        return True, True
    return current.get("status") != JobUpgrade.Status.VALIDATING, False


def ask_confirm_upgrade(n_clicks, current):
    """First step of confirming the upgrade under way: the confirm dialog."""
    if not n_clicks or _upgrade_id(current) is None:
        raise PreventUpdate
    return True, (
        f"Confirm upgrade #{current['id']} ({current.get('from')} -> {current.get('to')})? "
        "The old version retires; a rollback is no longer possible."
    )


def confirm_upgrade_confirmed(submit_n_clicks, current, user=None):
    """Second step: the job's controller confirms the upgrade at its next reconcile."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        upgrade = controls.confirm_upgrade(user, _upgrade_id(current))
    except controls.ActionRefused as exc:
        return message(f"Not confirmed: {exc}", ok=False)
    return message(f"Upgrade #{upgrade.pk}: confirm asked; the controller confirms it.", ok=True)


def ask_roll_back_upgrade(n_clicks, current):
    """First step of rolling the upgrade under way back: the confirm dialog."""
    if not n_clicks or _upgrade_id(current) is None:
        raise PreventUpdate
    return True, (
        f"Roll upgrade #{current['id']} back to {current.get('from')}? The old version "
        "writes the output again and the new one stops."
    )


def roll_back_confirmed(submit_n_clicks, current, user=None):
    """Second step: the job's controller rolls the upgrade back at its next reconcile."""
    if not submit_n_clicks:
        raise PreventUpdate
    try:
        upgrade = controls.roll_back_upgrade(user, _upgrade_id(current))
    except controls.ActionRefused as exc:
        return message(f"Not rolled back: {exc}", ok=False)
    if upgrade.status == JobUpgrade.Status.ABANDONED:
        return message(f"Upgrade #{upgrade.pk} cancelled before it started.", ok=True)
    return message(f"Upgrade #{upgrade.pk}: rollback asked; the controller rolls it back.", ok=True)
