"""What a fleet run leaves: DIR/fleet.json (the contract other checks read), DIR/fleet.png, and
with --write-results the "Fleet scale" section of docs/RESULTS.md (through bench.results)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.results import RESULTS_MD, write_report, write_section
from console.services.fleet import LEASE_S, RENEW_S

SECTION = "## Fleet scale"
# A chaos run (issue 58) has a section of its own, so that it does not replace the curve.
CHAOS_SECTION = "## Fleet scale: chaos of the control plane"
# The issues' goals (issues 41 and 58): what each figure should stay within.
# Failure to action is judged on the jobs that had a controller when they failed: the killed
# controller's jobs wait for their takeover, which controller_takeover_s judges. Unsupervised
# stretches are sampled every 0.5 s: a job waits for its lease to lapse and a renewal.
GOALS = {
    "failure_to_action_ms_supervised.p50": ("<=", 300),
    "failure_to_action_ms_supervised.p99": ("<=", 1000),
    "max_unsupervised_s": ("<=", LEASE_S + RENEW_S),
    "controller_takeover_s": ("<=", 5),
    "epoch_regressions": ("==", 0),
    "controller_cpu_cores": ("<=", 1.0),
    "db_queries_per_job_s": ("<=", 1.0),
    "pages_p95_ms.overview": ("<=", 500),
    "pages_p95_ms.jobs_api": ("<=", 500),
    "pages_p95_ms.placement": ("<=", 500),
    "pages_p95_ms.metrics": ("<=", 500),
    # Issue 58's, met by any run (a run without chaos sends no request and starts no upgrade).
    "stale_commands_executed": ("==", 0),
    "duplicate_replica_starts": ("==", 0),
    "operator_requests.lost": ("==", 0),
    "upgrades.unfinished": ("==", 0),
}


def figure(result: dict, path: str):
    """`result`'s value at a dotted path (None when missing)."""
    value = result
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def goal_misses(result: dict) -> list[str]:
    """The goals `result` misses (a figure that could not be measured misses too)."""
    misses = []
    for path, (op, bound) in GOALS.items():
        value = figure(result, path)
        ok = value is not None and (value <= bound if op == "<=" else value == bound)
        if not ok:
            misses.append(f"{path} = {value} (goal {op} {bound})")
    return misses


def fleet_json(results: list[dict], command: str) -> dict:
    """The largest size's figures at the top, every size under `curve` when there are several."""
    clean = [{k: v for k, v in r.items() if k != "series"} for r in results]
    largest = max(clean, key=lambda r: r["jobs"])
    out = {
        **largest,
        "command": command,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "goal_misses": goal_misses(largest),
    }
    if len(clean) > 1:
        out["curve"] = [{**r, "goal_misses": goal_misses(r)} for r in clean]
    return out


def write_json(out_dir: Path, results: list[dict], command: str) -> Path:
    return write_report(out_dir, "fleet.json", fleet_json(results, command))


def plot(out_dir: Path, results: list[dict]) -> Path:
    """The largest size over time (live jobs without a lease holder, each failure's time to
    the controller's action, controller CPU) and, with several sizes, the curve."""
    # matplotlib only when a plot is drawn: a heavy import that the figures do not need.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    largest = max(results, key=lambda r: r["jobs"])
    series = largest.get("series", {})
    rows = 2 if len(results) > 1 else 1
    fig = Figure(figsize=(16, 4.5 * rows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 3, squeeze=False)
    title = f"{largest['jobs']} jobs, {largest['nodes']} nodes"

    ax = axes[0][0]
    unheld = series.get("unheld", [])
    ax.plot([t for t, _ in unheld], [n for _, n in unheld], lw=1)
    _mark_faults(ax, largest)
    ax.set(title=f"{title}: jobs with no lease holder", xlabel="s into the window", ylabel="jobs")

    ax = axes[0][1]
    delays = series.get("failure_delays", [])
    ax.scatter([t for t, _ in delays], [d for _, d in delays], s=10)
    ax.axhline(1000, color="red", lw=0.8, ls="--", label="p99 goal")
    ax.axhline(300, color="orange", lw=0.8, ls="--", label="p50 goal")
    _mark_faults(ax, largest)
    ax.set(title="process kill -> controller's command", xlabel="s into the window", ylabel="ms")
    ax.legend(loc="upper right", fontsize=8)

    ax = axes[0][2]
    by_name: dict[str, list] = {}
    for t, name, cores in series.get("controller_cpu", []):
        by_name.setdefault(name, []).append((t, cores))
    for name, points in sorted(by_name.items()):
        ax.plot([t for t, _ in points], [c for _, c in points], lw=1, label=name)
    _mark_faults(ax, largest)
    ax.set(title="controller CPU", xlabel="s into the window", ylabel="cores")
    if by_name:
        ax.legend(loc="upper right", fontsize=8)

    if len(results) > 1:
        ordered = sorted(results, key=lambda r: r["jobs"])
        jobs = [r["jobs"] for r in ordered]
        ax = axes[1][0]
        for key in ("p50", "p99"):
            ax.plot(jobs, [figure(r, f"failure_to_action_ms.{key}") for r in ordered], "o-",
                    label=key)  # fmt: skip
        ax.set(title="failure -> action", xlabel="jobs", ylabel="ms")
        ax.legend(fontsize=8)
        ax = axes[1][1]
        ax.plot(jobs, [r["controller_cpu_cores"] for r in ordered], "o-", label="controller cores")
        ax.plot(jobs, [r["db_queries_per_job_s"] for r in ordered], "s-", label="DB queries/job/s")
        ax.plot(jobs, [r["max_unsupervised_s"] for r in ordered], "^-", label="max unsupervised s")
        ax.set(title="controller cost", xlabel="jobs")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.legend(fontsize=8)
        ax = axes[1][2]
        for page in ("overview", "jobs_api", "placement", "metrics"):
            ax.plot(jobs, [figure(r, f"pages_p95_ms.{page}") for r in ordered], "o-", label=page)
        ax.set(title="page server time p95", xlabel="jobs", ylabel="ms")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "fleet.png"
    fig.savefig(path, dpi=90)
    return path


def _mark_faults(ax, result: dict) -> None:
    """The measured window shaded, node kills (dashed) and the controller kill (dotted)."""
    t0, t1 = result["window"]
    ax.axvspan(0, t1 - t0, color="0.92", zorder=0)
    for fault in result.get("fault_log", []):
        if fault["kind"] == "node":
            ax.axvline(fault["offset_s"], color="grey", lw=0.8, ls="--")
    kill = result.get("controller_kill")
    if kill:
        ax.axvline(kill["at"] - t0, color="black", lw=0.8, ls=":")


def _fmt(value) -> str:
    if value is None:
        return "–"
    return f"{value:g}" if isinstance(value, float) else str(value)


def table(results: list[dict]) -> str:
    """One row per size."""
    lines = [
        "| jobs | nodes | replicas | controllers | failure→action p50 / p99 ms (n): all; "
        "jobs with a controller | "
        "max unsupervised s | takeover s | epoch regressions | controller cores / RSS MiB | "
        "DB queries /job/s | Redis cmd/s | metric rows /min | pages p95 ms (overview, jobs API, "
        "placement, /metrics) |",
        "|" + "---|" * 13,
    ]
    for r in sorted(results, key=lambda r: r["jobs"]):
        f2a, mine = r["failure_to_action_ms"], r["failure_to_action_ms_supervised"]
        pages = r["pages_p95_ms"]
        lines.append(
            f"| {r['jobs']} | {r['nodes']} | {r['replicas']} | {r['controllers']} | "
            f"{_fmt(f2a['p50'])} / {_fmt(f2a['p99'])} ({f2a['count']}); "
            f"{_fmt(mine['p50'])} / {_fmt(mine['p99'])} ({mine['count']}) | "
            f"{_fmt(r['max_unsupervised_s'])} | {_fmt(r['controller_takeover_s'])} | "
            f"{r['epoch_regressions']} | {_fmt(r['controller_cpu_cores'])} / "
            f"{_fmt(r['controller_rss_mb'])} | {_fmt(r['db_queries_per_job_s'])} | "
            f"{_fmt(r['redis_commands_per_s'])} | {_fmt(r['metric_rows_per_min'])} | "
            f"{_fmt(pages.get('overview'))}, {_fmt(pages.get('jobs_api'))}, "
            f"{_fmt(pages.get('placement'))}, {_fmt(pages.get('metrics'))} |"
        )
    return "\n".join(lines)


def section(results: list[dict], command: str) -> str:
    """The body of the "Fleet scale" section of docs/RESULTS.md."""
    largest = max(results, key=lambda r: r["jobs"])
    misses = goal_misses(largest)
    machine = largest.get("machine", {})
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(largest["window"][1]))
    load = ", ".join(f"{x:g}" for x in machine.get("loadavg", []))
    parts = [
        f"```bash\n.venv/bin/python {command}\n```",
        f"Measured {when} UTC on {machine.get('cores')} cores (load average {load} at the end). "
        "The real controller processes, beat, PostgreSQL and Redis; node agents and stage "
        "processes simulated at their Redis edge (bench/fleet/sim.py), under a seeded schedule "
        "of process kills, one node kill and one controller kill (bench/fleet/schedule.py). "
        "How each figure is measured: bench/fleet/measure.py.",
        table(results),
        f"Database queries counted with {largest['db_method']}; Redis commands per second "
        f"split {json.dumps(largest['redis_commands_per_s_by'])}. Node kills: time to the "
        f"controller's first command {_fmt(figure(largest, 'node_failure_to_action_ms.p50'))} ms "
        f"p50, {_fmt(figure(largest, 'node_failure_to_action_ms.p99'))} ms p99 "
        f"({figure(largest, 'node_failure_to_action_ms.count')} replicas). A lease counts as "
        "held until it expires, so a dead controller's jobs show in the takeover time, not in "
        "the longest unsupervised stretch. Pages: server time through Django's test Client "
        "once the controllers stopped, against the run's database, each Dash page with the "
        "callback request that fills it.",
        chaos_paragraph(largest),
        "Goals of issues 41 and 58 at the largest size: "
        + ("all met." if not misses else "missed: " + "; ".join(misses) + "."),
    ]
    return "\n\n".join(parts)


def chaos_paragraph(result: dict) -> str:
    """What the chaos of the control plane did and what got through (bench/fleet/chaos.py)."""
    faults = result.get("faults", {})
    requests, upgrades = result["operator_requests"], result["upgrades"]
    takeovers = ", ".join(_fmt(t) for t in upgrades.get("takeover_s", [])) or "–"
    return (
        f"Chaos of the control plane (issue 58, bench/fleet/chaos.py): "
        f"{faults.get('controller_pauses', 0)} controller pauses (SIGSTOP, 2-10 s), "
        f"{faults.get('controller_kills_in_upgrades', 0)} controllers SIGKILLed in the middle of "
        f"an upgrade, each once another controller was live, and replaced at once (as is the "
        f"schedule's controller kill in a chaos run); "
        f"takeover after each of those "
        f"{takeovers} s. Controllers' commands carried out by a simulated "
        f"agent or stage for a controller that no longer held the job: "
        f"{result['stale_commands_executed']} (refused by the fence: "
        f"{result['stale_commands_refused']}, of "
        f"{_fmt(figure(result, 'sim.fence.fenced_commands_carried_out'))} carried out); replica "
        f"ids started while running on another node: {result['duplicate_replica_starts']}; "
        f"operators' requests (stops, rollbacks, confirms) sent {requests['sent']}, lost "
        f"{requests['lost']}; upgrades started {upgrades['started']}, unfinished "
        f"{upgrades['unfinished']} (statuses at the end: "
        f"{json.dumps(upgrades.get('by_status', {}))}; the run waited "
        f"{_fmt(upgrades.get('settled_s'))} s after the window for the last to end)."
    )


def is_chaos(result: dict) -> bool:
    """Whether `result` is of a chaos run: controllers paused, upgrades or operators' requests."""
    return bool(
        figure(result, "faults.controller_pauses")
        or figure(result, "upgrades.started")
        or figure(result, "operator_requests.sent")
    )


def write_results(results: list[dict], command: str, path: Path = RESULTS_MD) -> None:
    """The "Fleet scale" section of docs/RESULTS.md, or for a chaos run its own section."""
    largest = max(results, key=lambda r: r["jobs"])
    heading = CHAOS_SECTION if is_chaos(largest) else SECTION
    write_section(heading, section(results, command), path)
