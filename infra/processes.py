"""Finding this machine's Backstop processes with psutil (no Django), in one place.

Processes are found by their command line: a stage is `python -m spark_runtime.stage ... --job
JOB --node NODE --replica-id ID`, a warm spare `python -m spark_runtime.spare ... --spare-id ID
--redis-url URL`, an input generator `python -m spark_runtime generate ... --job JOB`, a
stress-node CPU hog `python -m workers.cpu_hog SECONDS NODE`. Every scan of the process table
goes through `processes_matching` (or `processes_with_env`), so each reads command lines the same
way (`argv_of`) and skips zombies.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import psutil

from spark_runtime.launch import SPARE_MODULE, STAGE_MODULE

CPU_HOG_MODULE = "workers.cpu_hog"


def argv_of(cmdline: list[str] | None) -> list[str]:
    """A process's arguments from psutil's `cmdline()`. A warm spare that became a replica
    renamed itself (setproctitle) to that stage's command line: Linux then shows one string,
    NUL-padded, which is split back into arguments here."""
    cmdline = cmdline or []
    if cmdline and " " in cmdline[0] and not any(cmdline[1:]):
        return cmdline[0].split()
    return cmdline


def cmdline_arg(cmdline: list[str], flag: str) -> str | None:
    """The value after `flag` in a process's command line, or None."""
    try:
        return cmdline[cmdline.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def safe_read(call, default):
    """psutil raises when a process ends between listing and reading it: count it as gone."""
    try:
        return call()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return default


def processes_matching(predicate: Callable[[list[str]], bool]) -> list[psutil.Process]:
    """Live processes of this machine whose arguments (`argv_of` of their command line) satisfy
    `predicate`, in pid order; zombies are left out. Each process's `info["cmdline"]` holds the
    command line as psutil read it during the scan."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if predicate(argv_of(proc.info["cmdline"])):
            found.append(proc)
    return found


def processes_with_env(name: str, value: str) -> list[psutil.Process]:
    """Live processes of this machine (this one excepted) whose environment sets `name` to
    `value`; processes whose environment cannot be read (another user's) are left out."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        environ = safe_read(proc.environ, {})
        if environ.get(name) == value:
            found.append(proc)
    return found


def stage_processes(*, node: str | None = None, job: str | None = None) -> list[psutil.Process]:
    """Live stage processes (`spark_runtime.stage ...`) and warm spares, of one node and/or one
    job when given. Only the Python roots: their Spark JVMs are children (see `with_children`)."""

    def wanted(argv: list[str]) -> bool:
        # Warm spares are the node's too: their memory counts against its free resources.
        if STAGE_MODULE not in argv and SPARE_MODULE not in argv:
            return False
        if node is not None and cmdline_arg(argv, "--node") != node:
            return False
        return job is None or cmdline_arg(argv, "--job") == job

    return processes_matching(wanted)


def spare_processes(*, redis_url: str | None = None) -> list[psutil.Process]:
    """Live warm-spare processes of every node that run no replica yet (starting or idle), of
    the Backstop at `redis_url` when given: a spare handed a replica takes that replica's
    command line, and is then one of the job's stage processes (`stage_processes(job=...)`), no
    longer a spare."""
    return processes_matching(
        lambda argv: (
            SPARE_MODULE in argv
            and (redis_url is None or cmdline_arg(argv, "--redis-url") == redis_url)
        )
    )


def job_processes(job_keys: Iterable[str]) -> list[psutil.Process]:
    """Live data-plane processes (stages, spares that took a replica, input generators: any
    `spark_runtime...` module) of the given jobs."""
    job_keys = set(job_keys)
    return processes_matching(
        lambda argv: (
            any(part.startswith("spark_runtime") for part in argv)
            and cmdline_arg(argv, "--job") in job_keys
        )
    )


def cpu_hogs(node: str) -> list[psutil.Process]:
    """The CPU hogs of stress-node faults on `node` (`workers.cpu_hog SECONDS NODE`)."""
    return processes_matching(lambda argv: CPU_HOG_MODULE in argv and argv[-1] == node)


def with_children(roots: list[psutil.Process]) -> list[psutil.Process]:
    """`roots` and all their descendants (a stage's Spark JVM), each once."""
    found: dict[int, psutil.Process] = {}
    for root in roots:
        found[root.pid] = root
        try:
            for child in root.children(recursive=True):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def node_processes(node: str) -> list[psutil.Process]:
    """Stage processes started for `node` (`spark_runtime.stage ... --node NODE`), CPU hogs of
    stress-node faults on it (they count against their node too), and their children."""
    return with_children(stage_processes(node=node) + cpu_hogs(node))
