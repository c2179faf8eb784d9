"""Which kind of Backstop process a process is, from its command line (pure: no psutil, no
Django; the soak reads the process table and hands the rows in).

Kinds: controller, beat, agent (Celery workers of `celery -A web`, told apart by their queue),
primary and standby (stage processes, `spark_runtime.stage --role ...`; the role a replica has
now, from the job's replicas hash, wins over the one it was started with: a promoted standby
keeps its command line), spare (a warm spare with no replica yet), generator, archive-build
(the class-data archive's builder, for about two minutes when the run's machine has none yet),
cpu-hog (a stress-node fault's), python-worker (Spark's Python workers: `-m pyspark.daemon`, a
streaming source's runner), redis, postgres, kafka (Apache Kafka's broker, a JVM of its own: a
run on Kafka starts it). A JVM counts as the kind of the stage, spare, generator or builder
that started it. A JVM or Python worker with none of them above it is an orphan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infra.processes import CPU_HOG_MODULE, SPARE_MODULE, STAGE_MODULE, argv_of, cmdline_arg
from infra.queues import CONTROL_QUEUE
from spark_runtime.launch import ARCHIVE_BUILDER_MODULE

ORPHAN = "orphan"
KAFKA_MAIN_CLASS = "kafka.Kafka"  # the broker's JVM (infra/kafka.py)
# Kinds that own the JVMs and Python workers below them.
OWNERS = ("primary", "standby", "spare", "generator", "archive-build")
# Kinds a job owns (the rest belong to the cluster).
JOB_KINDS = ("primary", "standby", "generator")
# A process has settled in its role once it has run this long in it: the warm-up the soak's
# RSS goal gives the run (its reference point is at 10 minutes). A JVM's heap grows for about
# that long after it starts, so a standby or spare the schedule restarted a minute ago is
# smaller than a settled one without anything having leaked (bench/soak/report.py,
# `process_drift`).
SETTLED_AGE_S = 600.0


@dataclass(frozen=True)
class ProcRow:
    """One process as the soak read it."""

    pid: int
    ppid: int
    argv: tuple[str, ...]
    rss_mb: float = 0.0
    fds: int = 0
    # RSS less the pages the process shares: file pages and shared memory (a PostgreSQL
    # backend's RSS counts every page of the shared buffers it touched). A leak grows this.
    private_mb: float = 0.0
    age_s: float = 0.0  # seconds since the process started
    # The shared memory pages it has touched (RssShmem; None: not read). For Backstop's
    # processes these are PostgreSQL's shared buffers, a segment of fixed size that every
    # PostgreSQL process maps: its RSS counts the pages of it that it has touched so far, so it
    # rises without the segment growing (bench/soak/report.py judges RSS less this).
    shmem_mb: float | None = 0.0


def base_kind(cmdline: Iterable[str]) -> str | None:
    """The kind of a process from its own command line alone (a JVM: "jvm"); None for a
    process that is not Backstop's."""
    # A Celery worker renames itself: `[celeryd: name:MainProcess] -active- (-A web worker ...)`.
    args = [arg.strip("()") for arg in argv_of(list(cmdline))]
    if not args:
        return None
    if any("celery" in arg for arg in args[:3]) and cmdline_arg(args, "-A") == "web":
        if "beat" in args:
            return "beat"
        queue = cmdline_arg(args, "-Q") or ""
        if queue == CONTROL_QUEUE:
            return "controller"
        return "agent" if queue.startswith("node.") else None
    if STAGE_MODULE in args:
        return "standby" if cmdline_arg(args, "--role") == "standby" else "primary"
    if SPARE_MODULE in args:
        return "spare"
    if ARCHIVE_BUILDER_MODULE in args:
        return "archive-build"
    if CPU_HOG_MODULE in args:
        return "cpu-hog"
    if "spark_runtime" in args and "generate" in args:
        return "generator"
    if any(arg.startswith("pyspark.") for arg in args):
        return "python-worker"
    program = args[0].rsplit("/", 1)[-1]
    if program == "java":
        return "kafka" if KAFKA_MAIN_CLASS in args else "jvm"
    if program.startswith("redis-server"):
        return "redis"
    if program.startswith("postgres"):
        return "postgres"
    return None


def classify(rows: Iterable[ProcRow], roles_by_pid: dict[int, str] | None = None) -> dict[int, str]:
    """Kind per pid of `rows` (processes not Backstop's are left out). A JVM takes the kind of
    the nearest stage, spare, generator or archive builder above it, an orphan without one; a
    Python worker stays a python-worker under one and is an orphan without one. `roles_by_pid`:
    the current role (primary or standby) of stage processes."""
    rows = {row.pid: row for row in rows}
    roles_by_pid = roles_by_pid or {}
    own = {pid: base_kind(row.argv) for pid, row in rows.items()}
    for pid, kind in own.items():
        if kind in ("primary", "standby") and roles_by_pid.get(pid) in ("primary", "standby"):
            own[pid] = roles_by_pid[pid]

    def owner(pid: int) -> str | None:
        seen = set()
        parent = rows[pid].ppid
        while parent in rows and parent not in seen:
            seen.add(parent)
            if own[parent] in OWNERS:
                return own[parent]
            parent = rows[parent].ppid
        return None

    kinds = {}
    for pid, kind in own.items():
        if kind == "jvm":
            kinds[pid] = owner(pid) or ORPHAN
        elif kind == "python-worker":
            kinds[pid] = kind if owner(pid) else ORPHAN
        elif kind is not None:
            kinds[pid] = kind
    return kinds


def totals(rows: Iterable[ProcRow], kinds: dict[int, str]) -> dict[str, dict]:
    """Per kind: processes, summed RSS and private memory (MiB, one decimal) and open file
    descriptors."""
    out: dict[str, dict] = {}
    for row in rows:
        kind = kinds.get(row.pid)
        if kind is None:
            continue
        entry = out.setdefault(kind, {"processes": 0, "rss_mb": 0.0, "private_mb": 0.0, "fds": 0})
        entry["processes"] += 1
        entry["rss_mb"] += row.rss_mb
        entry["private_mb"] += row.private_mb
        entry["fds"] += row.fds
    for entry in out.values():
        entry["rss_mb"] = round(entry["rss_mb"], 1)
        entry["private_mb"] = round(entry["private_mb"], 1)
    return dict(sorted(out.items()))


def process_rows(rows: Iterable[ProcRow], kinds: dict[int, str]) -> list[list]:
    """Each of Backstop's processes as `[pid, kind, RSS MiB, private MiB, age s, shared
    memory MiB]`, for the goal that follows every process's own memory (bench/soak/report.py,
    `process_drift`)."""
    return [
        [row.pid, kinds[row.pid], round(row.rss_mb, 1), round(row.private_mb, 1),
         round(row.age_s), None if row.shmem_mb is None else round(row.shmem_mb, 1)]
        for row in sorted(rows, key=lambda r: r.pid)
        if row.pid in kinds
    ]  # fmt: skip


def unowned(
    rows: Iterable[ProcRow], kinds: dict[int, str], live_jobs: set[str], ended_replicas: set[str]
) -> list[dict]:
    """Processes no live job owns: orphaned JVMs and Python workers, and stage and generator
    processes of a job that is not live or of a replica that ended (`ended_replicas`: the
    `{job key}/{replica id}` of replicas recorded failed or stopped a while ago)."""
    found = []
    for row in rows:
        kind = kinds.get(row.pid)
        args = argv_of(list(row.argv))
        job = cmdline_arg(args, "--job")
        replica = cmdline_arg(args, "--replica-id")
        root = base_kind(row.argv) in JOB_KINDS  # the stage or generator itself, not its JVM
        if kind == ORPHAN:
            why = "no stage or spare above it"
        elif root and job not in live_jobs:
            why = f"its job {job} is not live"
        elif root and f"{job}/{replica}" in ended_replicas:
            why = f"its replica {replica} ended"
        else:
            continue
        found.append({"pid": row.pid, "kind": kind, "why": why, "cmdline": " ".join(args)[:160]})
    return found
