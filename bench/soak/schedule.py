"""The soak's seeded event schedule (pure Python, no Django).

One event every `spacing` seconds (a uniform draw between its bounds), from `random.Random(seed)`.
Kinds are dealt from a shuffled deck of every kind, reshuffled when it runs out, so any
`len(kinds)` consecutive events hold every kind once: a run of 10 events or more meets each of
them (11 with a job on Kafka, whose run adds `kafka-broker`), and the same seed always gives the
same schedule.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Faults of a job, through the console's fault service (console/services/faults.py).
JOB_FAULTS = (
    "kill-driver",
    "kill-standby",
    "kill-node",
    "pause-node",
    "stress-node",
    "operator-exception",
)
# Restarts of the control plane, done by the soak itself.
CONTROLLER_RESTART = "controller-restart"
AGENT_RESTART = "agent-restart"
REDIS_RESTART = "redis-restart"
POSTGRES_RESTART = "postgres-restart"
CONTROL_PLANE = (CONTROLLER_RESTART, AGENT_RESTART, REDIS_RESTART, POSTGRES_RESTART)
EVENT_KINDS = JOB_FAULTS + CONTROL_PLANE
# Faults of a job on Kafka, through the fault service too: dealt only in a run with such a job
# (`manage.py soak --kafka`), whose broker the run started (infra/kafka_outage.py).
KAFKA_BROKER = "kafka-broker"
KAFKA_FAULTS = (KAFKA_BROKER,)


def event_kinds(kafka: bool = False) -> tuple[str, ...]:
    """The kinds a run deals: every job fault and control-plane restart, and the Kafka faults
    when a job of the run is on Kafka."""
    return EVENT_KINDS + KAFKA_FAULTS if kafka else EVENT_KINDS


DEFAULT_SPACING_S = (60.0, 120.0)


@dataclass(frozen=True)
class Event:
    """One scheduled event: `at_s` seconds after the soak's start (all its jobs running)."""

    number: int
    at_s: float
    kind: str


def parse_spacing(text: str) -> tuple[float, float]:
    """`LOW,HIGH` seconds between events (LOW <= HIGH, LOW at least 10)."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--spacing: LOW,HIGH seconds, not {text!r}") from None
    if not 10 <= low <= high:
        raise ValueError(f"--spacing: 10 <= LOW <= HIGH, not {text!r}")
    return low, high


def plan_schedule(
    seed: int,
    duration_s: float,
    spacing: tuple[float, float] = DEFAULT_SPACING_S,
    kinds: tuple[str, ...] = EVENT_KINDS,
) -> list[Event]:
    """The events of a run of `duration_s` seconds: the first `spacing` after the start, each
    next one `spacing` after the previous, none at or after the end."""
    rng = random.Random(seed)
    events: list[Event] = []
    deck: list[str] = []
    at = 0.0
    while True:
        at += rng.uniform(*spacing)
        if at >= duration_s:
            return events
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        events.append(Event(len(events) + 1, round(at, 1), deck.pop()))


def event_rng(seed: int, number: int) -> random.Random:
    """The random source of event `number`'s target: seeded by the run's seed and the event,
    so choosing a target never shifts the schedule or another event's choice."""
    return random.Random(f"{seed}:{number}")


def pick(rng: random.Random, candidates) -> object | None:
    """One of `candidates` (sorted first, so the pick depends on the seed, not on the order they
    were read in), or None when there are none."""
    ordered = sorted(candidates)
    return rng.choice(ordered) if ordered else None
