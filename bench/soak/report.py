"""soak.json's figures from what a run recorded, the goals judged on them, and the RESULTS.md
text (pure Python, no Django).

A run records `faults` (one row per scheduled event), `audits` (one row per job and audit) and
`samples` (one per minute: per process kind RSS, file descriptors and count, database rows per
table, Redis memory and keys, checkpoint bytes). This module derives the rest.
"""

from __future__ import annotations

import math

from bench.soak.schedule import CONTROL_PLANE
from spark_runtime.keys import job_prefix

# Supervision must resume within this after a control-plane restart.
RESUME_GOAL_S = 10.0
# The RSS of each process kind at the end, against its value at the reference point.
RSS_TOLERANCE = 0.10
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
    if sample is None:
        return {}
    return {kind: entry["rss_mb"] for kind, entry in sample["processes"].items()}


def rss_summary(samples: list[dict], duration_s: float) -> dict:
    """`rss_mb` of soak.json: per kind at the reference point and at the end."""
    reference = sample_at(samples, reference_at_s(duration_s))
    return {
        "at_10_min": rss_of(reference),
        "at_end": rss_of(samples[-1] if samples else None),
        "reference": reference_label(duration_s),
        "reference_at_s": reference["at_s"] if reference else None,
        "end_at_s": samples[-1]["at_s"] if samples else None,
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


def judge_goals(report: dict) -> dict:
    """The goals of issue 44, each `{"met": True/False/None (not judged), "detail"}`."""
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

    rss = report["rss_mb"]
    drift = []
    for kind, before in rss["at_10_min"].items():
        after = rss["at_end"].get(kind)
        if kind in RSS_UNJUDGED or after is None or before <= 0:
            continue
        change = (after - before) / before
        if abs(change) > RSS_TOLERANCE:
            drift.append(f"{kind} {before:g} -> {after:g} MB ({change:+.0%})")
    goals["rss_stable"] = _goal(
        not drift if rss["at_10_min"] else None,
        f"each kind within {RSS_TOLERANCE:.0%} of its RSS {rss['reference']}"
        + ("; not: " + ", ".join(drift) if drift else ""),
    )

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
    lines += ["", f"| process kind | RSS MB {rss['reference']} | RSS MB at end |", "|---|---|---|"]
    for kind in sorted(set(rss["at_10_min"]) | set(rss["at_end"])):
        lines.append(
            f"| {kind} | {rss['at_10_min'].get(kind, '-')} | {rss['at_end'].get(kind, '-')} |"
        )
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
