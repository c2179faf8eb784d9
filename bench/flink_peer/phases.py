"""Where the Flink peer's output gap goes after each fault, read from its JobManager's log.

Flink logs every state change of the job and of each task with a timestamp. For a fault at a
known time, the gap splits into:

- detection: from the fault to the job's switch from RUNNING to RESTARTING (a killed
  TaskManager's failed heartbeat RPC, or the failing task's report);
- restart delay: RESTARTING to RUNNING again (the restart strategy's delay);
- deployment: until the last task is deployed (DEPLOYING to INITIALIZING): slots on the spare
  TaskManager, the tasks shipped there;
- initialization: until the last task runs (INITIALIZING to RUNNING): its keyed state restored
  from the last checkpoint and, for a PyFlink job, its Python worker started;
- first output: from then to the job's next output (the replay of the input since that
  checkpoint starts there), from the run's progress records.

Pure: no Django, no Flink; bench/flink_peer/peer.py feeds it the log and the output times.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

# The JobManager of a standalone cluster (its rolled-over files end in .log.1, .log.2, ...).
JOBMANAGER_LOG_GLOB = "flink-*-standalonesession-*.log*"

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_JOB = re.compile(r"\) switched from state (\w+) to (\w+)\.")
_TASK = re.compile(r"\) switched from (\w+) to (\w+)\.")


def state_changes(lines: Iterable[str]) -> list[tuple[float, str, str, str]]:
    """(epoch s, "job" or "task", from state, to state) for each state change in a JobManager
    log. Flink writes its local time, as this process reads it."""
    changes = []
    for line in lines:
        stamp = _LINE.match(line)
        # The execution graph's own lines (the application's state changes are logged too).
        if not stamp or "executiongraph.ExecutionGraph" not in line:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if job := _JOB.search(line):
            changes.append((at, "job", job.group(1), job.group(2)))
        elif task := _TASK.search(line):
            changes.append((at, "task", task.group(1), task.group(2)))
    return changes


def fault_phases(
    changes: Sequence[tuple[float, str, str, str]],
    faults_at: Sequence[float],
    output_times: Sequence[float],
) -> list[dict[str, float | None]]:
    """Per fault (epoch s, in order): the seconds of each phase (module doc), None where the
    log shows no such step before the next fault (or the end)."""
    phases = []
    outputs = sorted(output_times)
    bounds = list(faults_at[1:]) + [float("inf")]
    for fault_at, until in zip(faults_at, bounds, strict=True):
        window = [c for c in changes if fault_at <= c[0] < until]
        restarting = _first(window, "job", "RESTARTING")
        running = _first(window, "job", "RUNNING", after=restarting)
        deployed = _last(window, "INITIALIZING", after=running)
        tasks_running = _last(window, "RUNNING", after=deployed, kind="task")
        first_output = (
            None
            if tasks_running is None
            else next((t for t in outputs if t >= tasks_running), None)
        )
        marks = [fault_at, restarting, running, deployed, tasks_running, first_output]
        names = ["detection_s", "restart_delay_s", "deployment_s", "initialization_s",
                 "first_output_s"]  # fmt: skip
        phases.append(
            {
                name: None if a is None or b is None or b >= until else round(b - a, 2)
                for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)
            }
        )
    return phases


def jobmanager_phases(
    log_dir: Path, faults_at: Sequence[float], output_times: Sequence[float]
) -> list[dict[str, float | None]]:
    """`fault_phases` from the JobManager's log in `log_dir` (every phase None without one)."""
    lines: list[str] = []
    for path in sorted(log_dir.glob(JOBMANAGER_LOG_GLOB)):
        lines += path.read_text(errors="replace").splitlines()
    return fault_phases(sorted(state_changes(lines)), faults_at, output_times)


def _first(window, kind: str, to: str, after: float | None = 0.0) -> float | None:
    if after is None:
        return None
    return next((at for at, k, _, new in window if k == kind and new == to and at >= after), None)


def _last(window, to: str, after: float | None, kind: str = "task") -> float | None:
    """The last task's switch `to` after `after`, before the job's next restart."""
    if after is None:
        return None
    found = None
    for at, k, _, new in window:
        if at < after:
            continue
        if k == "job" and new == "RESTARTING":
            break
        if k == kind and new == to:
            found = at
    return found
