"""Where a recovery's time went: its phases, from timestamps taken where each step happens
(pure Python, no Django).

An episode keeps its marks (epoch seconds) in `RecoveryEpisode.phases`:

- `fault`: when the fault was injected (else detection minus the heartbeat timeout);
- `detected`, `decided`, `commanded`: the controller, when it saw the failure, when the state
  machine answered it, and when the answer's commands were sent (console/services/controller.py);
- `process_started`, `state_restored`, `caught_up`: the replica that took over, in its own entry
  (spark_runtime/stage.py): its process started (`started_at`; a warm spare: when it took the
  replica over), its queries started on the checkpoint's state (`queries_started_at`; so the
  restore includes building the replica's Spark session and JVM unless a warm spare had one),
  its first batch ended (`first_batch_at`: the backlog since the checkpoint read). A promoted
  standby ran already with its state: no process start or restore, and its catch-up ends when
  it has taken over and written what it buffered (`promoted_at`; after a restart it overtook,
  its catch-up is the wait for it to catch up);
- `first_output`: the job's first output after that (its progress records).

A phase runs from the latest mark before it that is present to its own end mark; a phase whose
end mark is missing (not part of this recovery, or not seen) has no duration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

# (phase, the mark that ends it), in order; the first phase starts at the "fault" mark.
PHASES = (
    ("detection", "detected"),
    ("decision", "decided"),
    ("command", "commanded"),
    ("process start", "process_started"),
    ("state restore", "state_restored"),
    ("catch-up", "caught_up"),
    ("first output", "first_output"),
)
FIRST_MARK = "fault"
MARKS = (FIRST_MARK, *(mark for _, mark in PHASES))
# The replica's own entry fields that date the stage's marks (spark_runtime/stage.py).
RESTART_FIELDS = {
    "process_started": "started_at",
    "state_restored": "queries_started_at",
    "caught_up": "first_batch_at",
}
PROMOTE_FIELDS = {"caught_up": "promoted_at"}


@dataclass(frozen=True)
class Phase:
    """One phase of a recovery: seconds from `start` to `end` (epoch s), None when not seen."""

    name: str
    start: float | None
    end: float | None
    seconds: float | None

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


def phases_of(marks: Mapping[str, float]) -> list[Phase]:
    """The phases of a recovery from its marks (module docstring), in order."""
    phases = []
    previous = marks.get(FIRST_MARK)
    for name, mark in PHASES:
        end = marks.get(mark)
        if end is None or previous is None:
            phases.append(Phase(name, previous, None, None))
            continue
        # A mark taken on another host's clock may sit a little before the one before it.
        seconds = round(max(0.0, end - previous), 3)
        phases.append(Phase(name, previous, end, seconds))
        previous = max(previous, end)
    return phases


def phase_seconds(marks: Mapping[str, float]) -> dict[str, float | None]:
    """phase name -> seconds (None when not seen), for the API and the benchmarks' JSON."""
    return {phase.name: phase.seconds for phase in phases_of(marks)}


def stage_marks(entry: Mapping, promoted: bool, since: float) -> dict[str, float]:
    """The marks the replica that took over reported in its entry (`entry`: its value in the
    replicas hash), those at or after `since` only (an entry of an earlier run of that id says
    nothing about this recovery). `promoted`: the recovery promoted a standby."""
    fields = PROMOTE_FIELDS if promoted else RESTART_FIELDS
    marks = {}
    for mark, field in fields.items():
        value = entry.get(field)
        if isinstance(value, int | float) and value >= since:
            marks[mark] = float(value)
    return marks


def first_output_after(output_times: Iterable[float], since: float) -> float | None:
    """The first output time at or after `since`, or None."""
    return min((t for t in output_times if t >= since), default=None)


def last_mark(marks: Mapping[str, float]) -> float | None:
    """The latest mark present before the first output (where its search starts)."""
    present = [marks[m] for m in MARKS[:-1] if marks.get(m) is not None]
    return max(present, default=None)
