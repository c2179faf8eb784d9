"""soak.json's figures from what a run recorded, the goals judged on them, and the RESULTS.md
text (pure Python, no Django).

A run records `faults` (one row per scheduled event), `audits` (one row per job and audit) and
`samples` (one per minute: per process kind RSS, file descriptors and count, database rows per
table, Redis memory and keys, checkpoint bytes). This module derives the rest.
"""

from __future__ import annotations

import math

from bench.soak.processes import SETTLED_AGE_S
from bench.soak.schedule import CONTROL_PLANE
from spark_runtime.keys import job_prefix

# Supervision must resume within this after a control-plane restart.
RESUME_GOAL_S = 10.0
# Issue 59's recovery goals: a promotion after a kill-driver or an operator exception, a local
# restart (a stage or job restarted from its checkpoint, whatever the fault), and a re-protect
# (a promoted stage's new standby caught up, or a killed standby's replacement running).
PROMOTION_GOAL_S = 5.0
LOCAL_RESTART_GOAL_S = 30.0
REPROTECT_GOAL_S = 90.0
PROMOTION_FAULTS = ("kill-driver", "operator-exception")
LOCAL_RESTARTS = ("restart-stage", "restart-job")
# Each process kind's RSS per process, over the last RSS_WINDOW_S of the run, against its value
# at the reference point.
RSS_TOLERANCE = 0.10
RSS_WINDOW_S = 1800.0
# "Bounded": growth over the second half of the run at most this much faster than over the first.
GROWTH_SLACK = 1.25
REFERENCE_S = 600.0  # RSS reference: at 10 minutes, or at the first fifth of a shorter run
# Kinds whose RSS is not judged: a CPU hog lives for its fault only; orphans are a leak goal.
RSS_UNJUDGED = ("cpu-hog", "orphan")

# The first part of a job's key (after `backstop:{job}:`) of the data a stopped job keeps on
# purpose: its input, intermediate streams, results and what makes them exact (fencing epochs,
# watermarks, appended keys), dead letters, counters, and its progress (trimmed by retention).
# A stopped job can be restarted from its checkpoints and audited, so these are not leaks.
KEPT_DATA = {"in", "s", "results", "written", "out", "dead", "stats", "fence", "wm", "progress"}
# Kept on purpose too: the job's cursor on the agents' events stream, so that a restart does not
# read its old runs' events again (console.services.retention.forget_ended_runs), and its
# controller tenure count, so that a tenure number is never given twice (command_fence).
KEPT_CONTROL = {"agent-events-cursor", "controller-tenure"}
REPORT_KEYS = (
    "minutes", "seed", "faults", "audits", "leaked_processes", "leaked_keys", "rss_mb",
    "per_hour", "goals",
)  # fmt: skip


def sort_job_keys(keys: list[tuple[str, int]], job_key: str) -> dict[str, list[str]]:
    """A stopped job's Redis keys as (key, TTL in s; -1 none) in three lists: `kept` (its data,
    KEPT_DATA and KEPT_CONTROL, and a progress stream's ingest cursor while the stream is
    there), `expiring` (a TTL: they go by themselves) and `leaked` (the rest)."""
    prefix = job_prefix(job_key)
    present = {key for key, _ in keys}
    out: dict[str, list[str]] = {"kept": [], "expiring": [], "leaked": []}
    for key, ttl in sorted(keys):
        part = key[len(prefix) :].split(":", 1)[0] if key.startswith(prefix) else ""
        cursor = key.endswith(":ingest-cursor")
        # A progress stream's ingest cursor lives as long as the stream (retention deletes both).
        kept = (
            part in KEPT_CONTROL
            or (part in KEPT_DATA and not cursor)
            or (cursor and key.removesuffix(":ingest-cursor") in present)
        )
        if kept:
            out["kept"].append(key)
        elif ttl is not None and ttl >= 0:
            out["expiring"].append(key)
        else:
            out["leaked"].append(key)
    return out


def reference_at_s(duration_s: float) -> float:
    """When the RSS reference is taken: at 10 minutes, or at the end of the first fifth when
    that comes first (a run shorter than 50 minutes)."""
    return min(REFERENCE_S, duration_s / 5)


def reference_label(duration_s: float) -> str:
    at = reference_at_s(duration_s)
    if at == REFERENCE_S:
        return "at 10 min"
    return f"at the end of the first fifth ({at:.0f} s; the run is shorter than 50 min)"


def sample_at(samples: list[dict], at_s: float) -> dict | None:
    """The first sample taken at or after `at_s` (else the last one)."""
    after = [s for s in samples if s["at_s"] >= at_s]
    return after[0] if after else (samples[-1] if samples else None)


def rss_of(sample: dict | None) -> dict[str, float]:
    """Each process kind's RSS in MB (all its processes together) in a sample."""
    if sample is None:
        return {}
    return {kind: entry["rss_mb"] for kind, entry in sample["processes"].items()}


def rss_per_process(sample: dict, measure: str = "rss_mb") -> dict[str, float]:
    """Each process kind's RSS (or `measure`: "private_mb") in MB per process in a sample. The
    number of primaries, standbys, spares and Python workers alive at a sample moves with the
    faults, so a leak shows in what one process holds, not in the kind's total. A sample taken
    before the soak recorded private memory has none."""
    return {
        kind: round(entry[measure] / entry["processes"], 1)
        for kind, entry in sample["processes"].items()
        if entry.get("processes") and measure in entry
    }


def farthest_from(
    before: dict[str, float], window: list[dict], measure: str = "rss_mb"
) -> dict[str, float]:
    """Per kind, the per-process value of `measure` farthest from `before` in `window`."""
    farthest: dict[str, float] = {}
    for sample in window:
        for kind, mb in rss_per_process(sample, measure).items():
            base = before.get(kind)
            if base and (kind not in farthest or abs(mb - base) > abs(farthest[kind] - base)):
                farthest[kind] = mb
    return farthest


# Two sightings of a pid are one process if their start times (sample time less age) are this
# close: a sample's time and the ages it reads are taken up to a few seconds apart.
SAME_START_S = 5.0


def row_memory(row: list, measure: str) -> float | None:
    """A process row's memory by `measure`: "rss", or "rss_less_shmem" (RSS less the shared
    memory pages it touched, as a row records since it does: a PostgreSQL process's RSS rises
    as it touches more of the shared buffers, one fixed segment; an older row has no such
    column and gives its RSS). None: the row's shared memory could not be read."""
    rss = row[2]
    if measure == "rss_less_shmem" and len(row) > 5:
        return None if row[5] is None else round(rss - row[5], 1)
    return rss


def process_drift(
    samples: list[dict], reference_from_s: float, window_from_s: float, measure: str = "rss"
) -> dict[str, dict] | None:
    """How far each process's own memory (`measure`, see `row_memory`) moved, per kind: the
    memory goal followed process by process, from the samples' `process_rows` (a run recorded
    before them has none: None).

    A process in one role (a pid's life as one kind: a promoted standby starts a new one as a
    primary) takes its reference in the first sample at or after `reference_from_s` in which it
    has been in that role SETTLED_AGE_S, and is compared with it in each later sample from
    `window_from_s` on. A process restarted or promoted late in the run is judged from when it
    settled, and one that never settled (or left no later sample) is not judged. Returns, per
    kind with a judged process, `processes` (how many) and the one that moved most: `pid`,
    `from_mb`, `to_mb`, `change` (a fraction); None for a run whose samples hold no processes
    (recorded before they did)."""
    if not any("process_rows" in sample for sample in samples):
        return None
    lives: dict[tuple, list[tuple[float, float]]] = {}
    current: dict[int, tuple[str, float, float]] = {}  # pid -> (kind, started at, in kind since)
    for sample in samples:
        at = sample["at_s"]
        for row in sample.get("process_rows", ()):
            pid, kind, rss, _private, age = row[:5]
            if rss <= 0:
                continue  # its memory could not be read (it was ending)
            started = at - age
            known = current.get(pid)
            if known is None or abs(started - known[1]) > SAME_START_S:
                since = started  # a new process (or its pid used again)
            elif kind != known[0]:
                since = at  # a new role: it settles into this one from now
            else:
                since = known[2]
            current[pid] = (kind, started, since)
            memory = row_memory(row, measure)
            if memory is None or memory <= 0:
                continue  # not read (it was ending), or nothing of its own to compare
            lives.setdefault((pid, kind, since), []).append((at, memory))
    drift: dict[str, dict] = {}
    for (pid, kind, since), values in sorted(lives.items()):
        ref_from = max(reference_from_s, since + SETTLED_AGE_S)
        reference = next(((at, mb) for at, mb in values if at >= ref_from), None)
        if reference is None:
            continue
        later = [mb for at, mb in values if at > reference[0] and at >= window_from_s]
        if not later:
            continue
        farthest = max(later, key=lambda mb: abs(mb - reference[1]))
        change = (farthest - reference[1]) / reference[1]
        entry = drift.setdefault(kind, {"processes": 0, "change": 0.0})
        entry["processes"] += 1
        if "pid" not in entry or abs(change) > abs(entry["change"]):
            entry.update(pid=pid, from_mb=round(reference[1], 1), to_mb=round(farthest, 1),
                         change=round(change, 4))  # fmt: skip
    return dict(sorted(drift.items()))


def shmem_recorded(samples: list[dict]) -> bool:
    """Whether the run's process rows record each process's shared memory (a sixth column)."""
    return any(len(row) > 5 for sample in samples for row in sample.get("process_rows", ()))


def rss_summary(samples: list[dict], duration_s: float) -> dict:
    """`rss_mb` of soak.json: per kind at the reference point and at the end (all its processes
    together), and per process at the reference point and at its farthest from it over the last
    RSS_WINDOW_S of the run (the samples the goal judges); the same per process for private
    memory (RSS less shared pages), reported beside it and not judged."""
    reference = sample_at(samples, reference_at_s(duration_s))
    end_at = samples[-1]["at_s"] if samples else None
    window_from = max(reference["at_s"], end_at - RSS_WINDOW_S) if reference else None
    window = [s for s in samples if window_from is not None and s["at_s"] >= window_from]
    before = rss_per_process(reference) if reference else {}
    private_before = rss_per_process(reference, "private_mb") if reference else {}
    return {
        "at_10_min": rss_of(reference),
        "at_end": rss_of(samples[-1] if samples else None),
        "per_process_at_10_min": before,
        "per_process_farthest": farthest_from(before, window),
        "private_per_process_at_10_min": private_before,
        "private_per_process_farthest": farthest_from(private_before, window, "private_mb"),
        "window_from_s": window_from,
        # The goal's measure: RSS less shared memory where the rows record it (`row_memory`).
        "process_drift_measure": "rss_less_shmem" if shmem_recorded(samples) else "rss",
        "process_drift": (
            process_drift(samples, reference["at_s"], window_from, "rss_less_shmem")
            if reference
            else None
        ),
        # Plain RSS, process by process, reported beside the goal's measure.
        "process_drift_rss": (
            process_drift(samples, reference["at_s"], window_from) if reference else None
        ),
        "reference": reference_label(duration_s),
        "reference_at_s": reference["at_s"] if reference else None,
        "end_at_s": end_at,
    }


def _figures(sample: dict) -> dict:
    """The growing quantities of one sample."""
    return {
        "db_rows": sum(sample["db_rows"].values()),
        "redis_used_memory_mb": sample["redis"]["used_memory_mb"],
        "redis_keys": sample["redis"]["keys"],
        "checkpoint_mb": round(sample["checkpoint_bytes"] / 2**20, 1),
    }


def per_hour(faults: list[dict], audits: list[dict], samples: list[dict], duration_s: float):
    """Per hour of the run (hour 0: its first hour, also when shorter): faults by kind with how
    many recovered, the worst audit per job, and the last sample's RSS and descriptors per kind,
    database rows, Redis memory and keys, checkpoint bytes; and the growth per hour from the
    RSS reference point to the end."""
    hours = []
    for hour in range(max(1, math.ceil(duration_s / 3600))):
        low, high = hour * 3600, (hour + 1) * 3600
        by_kind: dict[str, dict] = {}
        for fault in faults:
            if low <= fault["at_s"] < high:
                entry = by_kind.setdefault(fault["kind"], {"events": 0, "recovered": 0})
                entry["events"] += 1
                entry["recovered"] += bool(fault["recovered"])
        worst: dict[str, dict] = {}
        for audit in audits:
            if low <= audit["at_s"] < high + 600:  # the final audit counts in the last hour
                entry = worst.setdefault(audit["job"], {"lost": 0, "duplicates": 0})
                entry["lost"] = max(entry["lost"], audit["lost"] or 0)
                entry["duplicates"] = max(entry["duplicates"], audit["duplicates"] or 0)
        inside = [s for s in samples if low <= s["at_s"] < high] or samples[-1:]
        last = inside[-1] if inside else None
        hours.append({
            "hour": hour,
            "faults": dict(sorted(by_kind.items())),
            "audits_worst": worst,
            "rss_mb": rss_of(last),
            "fds": {k: e["fds"] for k, e in last["processes"].items()} if last else {},
            "db_rows_by_table": last["db_rows"] if last else {},
            **(_figures(last) if last else {}),
        })  # fmt: skip
    return {"hours": hours, "growth_per_hour": growth_per_hour(samples, duration_s)}


def growth_per_hour(samples: list[dict], duration_s: float) -> dict | None:
    """How fast each growing quantity grew from the RSS reference point to the end, per hour,
    and over each half of that span (for the "bounded" goal)."""
    start = sample_at(samples, reference_at_s(duration_s))
    if start is None or not samples or samples[-1]["at_s"] - start["at_s"] < 60:
        return None
    end = samples[-1]
    middle = sample_at(samples, (start["at_s"] + end["at_s"]) / 2)
    out = {}
    for name in _figures(start):
        a, m, b = (_figures(s)[name] for s in (start, middle, end))
        span_h = (end["at_s"] - start["at_s"]) / 3600
        first_h = max((middle["at_s"] - start["at_s"]) / 3600, 1e-9)
        second_h = max((end["at_s"] - middle["at_s"]) / 3600, 1e-9)
        out[name] = {
            "per_hour": round((b - a) / span_h, 1),
            "first_half_per_hour": round((m - a) / first_h, 1),
            "second_half_per_hour": round((b - m) / second_h, 1),
        }
    return out


def _goal(met: bool | None, detail: str) -> dict:
    return {"met": met, "detail": detail}


def episode_actions(fault: dict) -> list[str]:
    """The actions of a fault's recovery episodes ([] with none). A run recorded before the fault
    rows kept `actions` names them in `how` ("2 episode(s), promote+restart-stage, closed")."""
    if "actions" in fault:
        return fault["actions"]
    how = fault.get("how") or ""
    if "episode(s), " not in how:
        return []
    return how.split("episode(s), ", 1)[1].split(",", 1)[0].split("+")


def recovery_goal_s(fault: dict) -> float | None:
    """The recovery time issue 59 allows this fault: a local restart's whatever the fault, a
    kill-driver's or an operator exception's otherwise (a promotion); None: no such goal."""
    if any(action in LOCAL_RESTARTS for action in episode_actions(fault)):
        return LOCAL_RESTART_GOAL_S
    if fault["kind"] in PROMOTION_FAULTS:
        return PROMOTION_GOAL_S
    return None


def judge_recovery_times(faults: list[dict]) -> dict:
    """Every kill-driver and operator exception recovered within PROMOTION_GOAL_S, every local
    restart within LOCAL_RESTART_GOAL_S."""
    goals = [(f, recovery_goal_s(f)) for f in faults]
    bounded = [(f, goal) for f, goal in goals if goal is not None]
    misses = [
        f"#{f['number']} {f['kind']} ({'+'.join(episode_actions(f)) or 'no episode'}): "
        + (f"{f['recovery_s']} s" if f["recovered"] else "not recovered")
        for f, goal in bounded
        if not f["recovered"] or f["recovery_s"] is None or f["recovery_s"] > goal
    ]
    return _goal(
        not misses if bounded else None,
        f"{len(bounded) - len(misses)} of {len(bounded)} within their goal (kill-driver and "
        f"operator exception {PROMOTION_GOAL_S:g} s, a local restart {LOCAL_RESTART_GOAL_S:g} s)"
        + ("; not: " + ", ".join(misses) if misses else ""),
    )


def reprotect_s(fault: dict) -> tuple[bool, float | None]:
    """(judged, seconds) of a fault's re-protect: a killed standby's replacement running (the
    fault's recovery), a promotion's new standby caught up (`reprotect_s`, None if it was not by
    the end of the run); not judged for other faults and runs that did not record it."""
    if fault["kind"] == "kill-standby":
        return True, fault["recovery_s"] if fault["recovered"] else None
    if "promote" in episode_actions(fault) and "reprotect_s" in fault:
        return True, fault["reprotect_s"]
    return False, None


def judge_reprotects(faults: list[dict]) -> dict:
    """Every re-protect within REPROTECT_GOAL_S."""
    judged = []
    for fault in faults:
        ok, seconds = reprotect_s(fault)
        if ok:
            judged.append((fault, seconds))
    misses = [
        f"#{f['number']} {f['kind']}: " + (f"{seconds} s" if seconds is not None else "never")
        for f, seconds in judged
        if seconds is None or seconds > REPROTECT_GOAL_S
    ]
    return _goal(
        not misses if judged else None,
        f"{len(judged) - len(misses)} of {len(judged)} re-protected within "
        f"{REPROTECT_GOAL_S:g} s" + ("; not: " + ", ".join(misses) if misses else ""),
    )


def drift_measure_label(rss: dict) -> str:
    """What the goal compared, process by process, in words."""
    if rss.get("process_drift_measure") == "rss_less_shmem":
        return "RSS less shared memory"
    return "RSS"


def judge_rss(rss: dict) -> dict:
    """RSS within RSS_TOLERANCE of its value at the reference point over the last RSS_WINDOW_S:
    each process against itself where the run recorded its processes (`process_drift`; RSS less
    the shared memory it touched where recorded, see `row_memory`), else each kind's RSS per
    process (the kind's processes come and go with the faults, and one restarted a minute ago
    has not grown into its size yet: an older run's judge)."""
    window = (
        f"from {rss['window_from_s']:.0f} s to the end" if rss["window_from_s"] is not None else ""
    )
    if rss.get("process_drift") is not None:
        by_process = {
            kind: entry for kind, entry in rss["process_drift"].items() if kind not in RSS_UNJUDGED
        }
        if not by_process:
            return _goal(None, f"no process had run {SETTLED_AGE_S / 60:.0f} min in its role "
                               f"{rss['reference']} with a sample after it")  # fmt: skip
        drift = [
            f"{kind} (pid {e['pid']}) {e['from_mb']:g} -> {e['to_mb']:g} MB ({e['change']:+.0%})"
            for kind, e in by_process.items()
            if abs(e["change"]) > RSS_TOLERANCE
        ]
        judged = sum(e["processes"] for e in by_process.values())
        return _goal(
            not drift,
            f"each process's {drift_measure_label(rss)} within {RSS_TOLERANCE:.0%} of its own "
            f"value {rss['reference']} "
            f"(or once it had run {SETTLED_AGE_S / 60:.0f} min in its role, if later) in every "
            f"sample {window}; judged: {judged} process(es) of {len(by_process)} kind(s)"
            + ("; not (farthest): " + ", ".join(drift) if drift else ""),
        )
    before, farthest = rss["per_process_at_10_min"], rss["per_process_farthest"]
    drift = []
    for kind, base in before.items():
        if kind in RSS_UNJUDGED or kind not in farthest:
            continue
        change = (farthest[kind] - base) / base
        if abs(change) > RSS_TOLERANCE:
            drift.append(f"{kind} {base:g} -> {farthest[kind]:g} MB ({change:+.0%})")
    return _goal(
        not drift if before else None,
        f"each kind's RSS per process within {RSS_TOLERANCE:.0%} of its value "
        f"{rss['reference']} in every sample {window}"
        + ("; not (farthest): " + ", ".join(drift) if drift else ""),
    )


def judge_goals(report: dict) -> dict:
    """The goals of issues 44 and 59, each `{"met": True/False/None (not judged), "detail"}`."""
    goals = {}
    judged = [f for f in report["faults"] if f.get("injected")]
    skipped = [f for f in report["faults"] if not f.get("injected")]
    misses = []
    for fault in judged:
        if fault["kind"] in CONTROL_PLANE:
            if not fault["recovered"] or (fault["recovery_s"] or 0) > RESUME_GOAL_S:
                misses.append(f"#{fault['number']} {fault['kind']}: {fault['recovery_s']} s")
        elif not fault["recovered"]:
            misses.append(f"#{fault['number']} {fault['kind']} on {fault['target']}")
    detail = f"{len(judged) - len(misses)} of {len(judged)} events recovered"
    detail += f" (control plane within {RESUME_GOAL_S:g} s)"
    if misses:
        detail += "; not: " + ", ".join(misses)
    if skipped:
        detail += f"; {len(skipped)} not injected (no target)"
    goals["every_fault_recovered"] = _goal(not misses if judged else None, detail)

    audits = report["audits"]
    unaudited = [a for a in audits if a["lost"] is None]
    inexact = [a for a in audits if a["lost"] or a["duplicates"]]
    goals["exact_output"] = _goal(
        (not inexact and not unaudited) if audits else None,
        f"{len(audits)} audits; {len(inexact)} with lost or duplicated results"
        + (f"; {len(unaudited)} not computed" if unaudited else ""),
    )

    procs, keys = report["leaked_processes"], report["leaked_keys"]
    goals["no_leaks"] = _goal(
        not procs and not keys, f"{len(procs)} leaked processes, {len(keys)} leaked keys"
    )

    goals["fast_recoveries"] = judge_recovery_times(judged)
    goals["reprotected"] = judge_reprotects(judged)

    goals["rss_stable"] = judge_rss(report["rss_mb"])

    growth = report["per_hour"]["growth_per_hour"]
    if growth is None:
        goals["growth_bounded"] = _goal(None, "too short after the reference point to judge")
    else:
        faster = [
            f"{name} {g['first_half_per_hour']:g} -> {g['second_half_per_hour']:g}/h"
            for name, g in growth.items()
            if name != "checkpoint_mb"
            and g["second_half_per_hour"] > max(0.0, g["first_half_per_hour"]) * GROWTH_SLACK
            and g["second_half_per_hour"] > 0
        ]
        goals["growth_bounded"] = _goal(
            not faster,
            "database rows and Redis memory and keys grow no faster in the second half of the "
            "run than in the first (a proxy: linear growth passes)"
            + ("; faster: " + ", ".join(faster) if faster else ""),
        )
    return goals


def to_markdown(report: dict) -> str:
    """The "Soak (manage.py soak)" section's body for docs/RESULTS.md."""
    lines = [
        f"`{report['command']}` on {report['date']} ({report['machine']}); "
        f"{report['minutes']:g} min, seed {report['seed']}, events every "
        f"{report['spacing_s'][0]:g}-{report['spacing_s'][1]:g} s, "
        f"{report['rate']:g} lines/s per job. {report['services']['note']}",
        "",
        "| # | at | event | target | recovered | recovery s | how |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in report["faults"]:
        recovered = "-" if not f.get("injected") else ("yes" if f["recovered"] else "no")
        lines.append(
            f"| {f['number']} | {f['at_s']:.0f} s | {f['kind']} | {f['target']} | {recovered} | "
            f"{f['recovery_s'] if f['recovery_s'] is not None else '-'} | {f['how']} |"
        )
    lines += ["", "| audit at | job | lost | duplicated | results |", "|---|---|---|---|---|"]
    for a in report["audits"]:
        lines.append(f"| {a['at_s']:.0f} s | {a['job']} | {a['lost']} | {a['duplicates']} | "
                     f"{a['cells']} |")  # fmt: skip
    rss = report["rss_mb"]
    lines += [
        "",
        f"| process kind | RSS MB {rss['reference']} | RSS MB at end | per process "
        f"{rss['reference']} | per process, farthest from it in the last "
        f"{RSS_WINDOW_S / 60:.0f} min | private MB per process {rss['reference']} | private, "
        "farthest |",
        "|---|---|---|---|---|---|---|",
    ]
    private_before = rss.get("private_per_process_at_10_min", {})
    private_farthest = rss.get("private_per_process_farthest", {})
    for kind in sorted(set(rss["at_10_min"]) | set(rss["at_end"])):
        lines.append(
            f"| {kind} | {rss['at_10_min'].get(kind, '-')} | {rss['at_end'].get(kind, '-')} | "
            f"{rss['per_process_at_10_min'].get(kind, '-')} | "
            f"{rss['per_process_farthest'].get(kind, '-')} | {private_before.get(kind, '-')} | "
            f"{private_farthest.get(kind, '-')} |"
        )
    lines += [
        "",
        "Private memory is RSS less the pages a process shares (file pages, shared memory such "
        "as PostgreSQL's shared buffers): what a leak grows. It is reported, not judged.",
    ]
    drift = {k: e for k, e in (rss.get("process_drift") or {}).items() if k not in RSS_UNJUDGED}
    if drift:
        measure = drift_measure_label(rss)
        plain = rss.get("process_drift_rss") or {}
        lines += [
            "",
            f"Each process against itself (the goal): its {measure} {rss['reference']}, or once "
            f"it had run {SETTLED_AGE_S / 60:.0f} min in its role if later, against every sample "
            f"from {rss['window_from_s']:.0f} s on; the same with plain RSS beside it:",
            "",
            f"| process kind | processes judged | the one that moved most | {measure} MB then | "
            "farthest | change | by plain RSS: moved most | change |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for kind, e in drift.items():
            by_rss = plain.get(kind)
            rss_cells = (
                f"pid {by_rss['pid']} ({by_rss['from_mb']:g} -> {by_rss['to_mb']:g} MB) | "
                f"{by_rss['change']:+.1%}"
                if by_rss
                else "- | -"
            )
            lines.append(f"| {kind} | {e['processes']} | pid {e['pid']} | {e['from_mb']:g} | "
                         f"{e['to_mb']:g} | {e['change']:+.1%} | {rss_cells} |")  # fmt: skip
        if rss.get("process_drift_measure") == "rss_less_shmem":
            lines += [
                "",
                "Shared memory is the shared memory pages a process touched (RssShmem). Among "
                "Backstop's processes only PostgreSQL's have any: its shared buffers, a segment "
                "of fixed size that every PostgreSQL process maps. A process's RSS rises as it "
                "touches more of them (the checkpointer writes more distinct buffers at each "
                "checkpoint) while the segment stays the same size, so the goal leaves them out. "
                "The goal's measure still counts file pages; private memory, above, does not.",
            ]
    growth = report["per_hour"]["growth_per_hour"] or {}
    if growth:
        lines += ["", "Growth per hour (reference point to end): " + ", ".join(
            f"{name} {g['per_hour']:g}" for name, g in growth.items()
        ) + "."]  # fmt: skip
    lines += [
        "",
        f"Leaked processes: {len(report['leaked_processes'])}; leaked Redis keys of the stopped "
        f"jobs: {len(report['leaked_keys'])}"
        + (f" ({', '.join(report['leaked_keys'][:8])})" if report["leaked_keys"] else "")
        + ".",
        "",
        "| goal | met | detail |",
        "|---|---|---|",
    ]
    for name, goal in report["goals"].items():
        met = {True: "yes", False: "no", None: "not judged"}[goal["met"]]
        lines.append(f"| {name} | {met} | {goal['detail']} |")
    return "\n".join(lines)
