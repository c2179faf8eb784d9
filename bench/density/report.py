"""density.json's figures from what a run recorded, and its RESULTS.md section (no database:
the run hands in its recorded episodes, audits and samples as plain values)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bench.fleet.measure import percentile
from console.policy.recovery_phases import PHASES


@dataclass(frozen=True)
class EpisodeFigures:
    """What one recovery episode of a run measured (seconds; None when not measured):
    `recovery_s` its recovery time, `reprotect_s` after a promotion the time until the stage
    had a promotable standby again, `phases` its phase seconds (recovery_phases.phase_seconds)."""

    job: str
    stage: str
    action: str
    recovery_s: float | None
    reprotect_s: float | None
    phases: Mapping[str, float | None]


def spread(values: Iterable[float | None]) -> dict:
    """{"p50", "p99", "count"} of the measured values (None left out; p50/p99 None when none)."""
    measured = [float(v) for v in values if v is not None]
    return {
        "p50": _round(percentile(measured, 50)),
        "p99": _round(percentile(measured, 99)),
        "count": len(measured),
    }


def cores_by_kind(
    before: Mapping[int, float],
    after: Mapping[int, float],
    kinds: Mapping[int, str],
    seconds: float,
) -> dict[str, float]:
    """Cores each kind of process used over `seconds`: the CPU seconds of each process between
    `before` and `after` (pid -> CPU seconds; a process gone by then is left out), summed by its
    kind (`kinds`, bench/soak/processes.py; a process of no kind counts as "other"), largest
    first."""
    used: dict[str, float] = {}
    for pid, cpu_s in after.items():
        kind = kinds.get(pid, "other")
        used[kind] = used.get(kind, 0.0) + (cpu_s - before[pid]) / seconds
    return {kind: round(cores, 3) for kind, cores in sorted(used.items(), key=lambda kv: -kv[1])}


def density_run(
    *,
    jobs: int,
    cpu_cores: float | None,
    cpu_by_kind: Mapping[str, float] | None = None,
    steady_p50_ms: float | None,
    episodes: list[EpisodeFigures],
    audits: list[dict],
    standbys: tuple[int, int],
    faults: list[dict],
    refused: list[str] = (),
) -> dict:
    """One job count's row of density.json.

    `cpu_by_kind`: the steady window's cores per kind of process (`cores_by_kind`);
    `refused`: the launches the host reserve refused, each with its reason (the other figures
    are of the jobs that ran); `audits`: per job {"lost", "duplicates"} against the
    plain-Python reference of its input (None when it could not be audited); `standbys`:
    (kept, wanted) stages with a running hot standby against those the policy gives one;
    `faults`: what each injection did. Episodes without a recovery time (not back to normal)
    and promotions without a re-protect time are counted apart, so that `count` says how many
    the percentiles cover.
    """
    promotions = [e for e in episodes if e.action == "promote"]
    audited = [a for a in audits if a.get("lost") is not None]
    return {
        "jobs": jobs,
        "cpu_cores": None if cpu_cores is None else round(cpu_cores, 2),
        "cpu_by_kind": dict(cpu_by_kind or {}),
        "steady_p50_ms": None if steady_p50_ms is None else round(steady_p50_ms, 1),
        "recovery_s": spread(e.recovery_s for e in episodes),
        "reprotect_s": spread(e.reprotect_s for e in promotions),
        "lost": sum(a["lost"] for a in audited) if audited else None,
        "duplicates": sum(a["duplicates"] for a in audited) if audited else None,
        "standbys_kept": standbys[0],
        "standbys_wanted": standbys[1],
        "episodes": len(episodes),
        "unrecovered": sum(1 for e in episodes if e.recovery_s is None),
        "not_reprotected": sum(1 for e in promotions if e.reprotect_s is None),
        "audited_jobs": len(audited),
        "phases_p50_s": {
            name: spread(e.phases.get(name) for e in episodes)["p50"] for name, _ in PHASES
        },
        "faults": faults,
        "jobs_running": jobs - len(refused),
        "refused": list(refused),
    }


def to_markdown(report: dict) -> str:
    """The RESULTS.md section of a density run: the command, machine, and the curve."""
    lines = [
        f"Command: `{report['command']}` ({report['date']}; {report['machine']}; "
        f"{report['rate']:g} lines/s per job, adaptive policy, {report['faults']} kill-driver "
        "faults per job count, injected into the jobs in turn).",
        "",
        "| jobs | CPU (cores) | steady p50 (ms) | recovery p50 / p99 (s) [n] "
        "| re-protect p50 / p99 (s) [n] | lost | duplicated | hot standbys kept / wanted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        rec, rep = run["recovery_s"], run["reprotect_s"]
        refused = run.get("refused", [])
        jobs = f"{run['jobs']} ({len(refused)} refused)" if refused else run["jobs"]
        lines.append(
            f"| {jobs} | {_cell(run['cpu_cores'])} | {_cell(run['steady_p50_ms'])} | "
            f"{_cell(rec['p50'])} / {_cell(rec['p99'])} [{rec['count']}] | "
            f"{_cell(rep['p50'])} / {_cell(rep['p99'])} [{rep['count']}] | {_cell(run['lost'])} | "
            f"{_cell(run['duplicates'])} | {run['standbys_kept']} / {run['standbys_wanted']} |"
        )
    lines += [
        "",
        "Median seconds per phase of the recoveries (console/policy/recovery_phases.py):",
        "",
    ]
    names = [name for name, _ in PHASES]
    lines.append("| jobs | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for run in report["runs"]:
        cells = " | ".join(_cell(run["phases_p50_s"].get(name)) for name in names)
        lines.append(f"| {run['jobs']} | {cells} |")
    kinds = sorted({kind for run in report["runs"] for kind in run.get("cpu_by_kind", {})})
    if kinds:
        lines += [
            "",
            "Cores per kind of process in the steady window (bench/soak/processes.py: a JVM "
            "counts for the stage, spare or generator that started it; python-worker: the "
            "stages' Python workers):",
            "",
            "| jobs | " + " | ".join(kinds) + " |",
            "|---|" + "---|" * len(kinds),
        ]
        for run in report["runs"]:
            by_kind = run.get("cpu_by_kind", {})
            cells = " | ".join(_cell(by_kind.get(kind)) for kind in kinds)
            lines.append(f"| {run['jobs']} | {cells} |")
    return "\n".join(lines)


def _cell(value) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
