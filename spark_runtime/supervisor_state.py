"""What a Supervisor (spark_runtime/supervision.py) keeps between ticks: its fields, the queries
over its replica table, the table's primitive changes, and the JSON snapshot a driver keeps in
Redis (`to_dict`; `Supervisor.from_dict` rebuilds the machine from it, also from an older or a
newer version's: fields this version does not know are left out, spark_runtime/snapshot.py).
Pure Python: no I/O, no clock.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass

from spark_runtime.failover import CauseStreak, FailoverStrategy, RestartPolicy
from spark_runtime.replicas import (
    BACKOFF,
    FAILED,
    PRIMARY,
    RUNNING,
    STANDBY,
    STARTING,
    Replica,
    ReplicaSpec,
    StartReplica,
)
from spark_runtime.snapshot import rebuild
from spark_runtime.strategies import Strategy, get_strategy
from spark_runtime.upgrade import BlueGreen

# How much of the recovery record a snapshot keeps (newest last).
HISTORY_KEPT = 200
REPROTECTIONS_KEPT = 50


# --- the persisted state ---------------------------------------------------------------------


def _persisted(*, key: str | None = None, dump=None, load=None, **kwargs):
    """A SupervisorState field with its own snapshot treatment: its key (default: its name),
    what of it the snapshot keeps (`dump`, default all of it) and how from_dict rebuilds it from
    JSON (`load`, default a copy)."""
    return field(metadata={"key": key, "dump": dump, "load": load}, **kwargs)


def _tuples_by_key(raw: dict) -> dict:
    return {key: tuple(value) for key, value in raw.items()}


def _tuple_items(raw: list) -> list[tuple]:
    return [tuple(item) for item in raw]


def _replicas_from_json(raw: list[dict]) -> dict[str, Replica]:
    replicas = {}
    for item in raw:
        saved = item["spec"]
        as_tuples = {"operators": tuple(saved["operators"]), "params": tuple(saved["params"])}
        spec = rebuild(ReplicaSpec, saved, **as_tuples)
        replicas[spec.replica_id] = rebuild(Replica, item, spec=spec)
    return replicas


def _current_replica_entry(item: dict, strategy: str) -> dict:
    """A replica entry of a snapshot as this version writes it, from one an older version wrote
    (supervisor state outlives a controller upgrade in Redis)."""
    spec = dict(item["spec"])
    if "low_priority" in spec:  # saved before primaries took part in CPU priorities
        del spec["low_priority"]
        spec["cpu_priorities"] = get_strategy(strategy).cpu_priorities
    # Saved before strategies had a recovery class of their own (it came with CPU priorities).
    spec.setdefault("recovery_first", get_strategy(strategy).recovery_first)
    return {"launched_at": item["since"], **item, "spec": spec}


def _to_json(value):
    """`value` in JSON types: dataclasses as dicts, tuples as lists, sets as sorted lists."""
    if value is None or isinstance(value, str | float | int):  # most values: first
        return value
    if isinstance(value, list | tuple):
        return [_to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _to_json(item) for key, item in value.items()}
    if isinstance(value, set):
        return sorted(value)
    if is_dataclass(value):
        return {f.name: _to_json(getattr(value, f.name)) for f in fields(value)}
    raise TypeError(f"not serialisable: {value!r}")


@dataclass(eq=False)
class SupervisorState:
    """What a Supervisor keeps between ticks, with the queries over its replica table.

    `to_dict` and `Supervisor.from_dict` follow these fields, so a field is declared once here.
    The snapshot keys are the ones earlier versions wrote: a controller upgraded in the middle
    of a job resumes the state its predecessor saved in Redis.
    """

    job: str
    topology: str
    # Stage name -> its operators, in launch order.
    stage_operators: dict[str, tuple[str, ...]] = _persisted(key="stages", load=_tuples_by_key)
    strategy: str
    nodes: list[str]
    # Stages that get a hot standby.
    active_stages: set[str] = _persisted(default_factory=set, load=set)
    params: tuple[str, ...] = _persisted(default=(), load=tuple)
    # Whether the job runs an existing app (spark_runtime/apps.py): its restarts take over warm
    # spares under restart-all too (`takes_warm_spares`).
    app: bool = False
    startup_grace: float = 90.0
    # Optional (primary node, standby node) per stage chosen by the policy; else round robin.
    placement: dict[str, tuple[str, str | None]] = _persisted(
        default_factory=dict, load=_tuples_by_key
    )
    # The driver may replace it at any time (the controller applies the policy in force).
    restart_policy: RestartPolicy = _persisted(
        default_factory=RestartPolicy, load=lambda raw: rebuild(RestartPolicy, raw)
    )
    # How long a busy replica may stay silent before it counts as hung (driver may change it).
    hung_timeout_s: float = 30.0
    # Stage -> time its standby was promoted, until a new standby is promotable again.
    unprotected_since: dict[str, float] = field(default_factory=dict)
    # (stage, promoted at, protected again at) per completed re-protection, newest last.
    reprotections: list[tuple[str, float, float]] = _persisted(
        default_factory=list, dump=lambda r: r[-REPROTECTIONS_KEPT:], load=_tuple_items
    )
    # Stage -> time its primary was restarted after a failure, until that primary reports a
    # finished batch; a standby that catches up meanwhile takes over (see the module doc).
    restarting: dict[str, float] = field(default_factory=dict)
    # Stage -> the standby a move replaces: it keeps the stage protected until the moved
    # standby is caught up, and is killed then (make before break; see move_standby).
    retiring: dict[str, str] = field(default_factory=dict)
    # "stage/role" -> times of its replicas' failures within the policy's window.
    failures: dict[str, list[float]] = field(default_factory=dict)
    # "stage/role" -> its last failures in a row with the same reported cause.
    cause_streaks: dict[str, CauseStreak] = _persisted(
        default_factory=dict, load=lambda raw: {k: rebuild(CauseStreak, v) for k, v in raw.items()}
    )
    # Stages whose standbys crash-looped: no standby is started for them any more.
    unprotectable: set[str] = _persisted(default_factory=set, load=set)
    # Why the job was given up on (None while it is supervised).
    gave_up: str | None = None
    # When the job's stop asked an app's queries to stop (Supervisor.ask_app_to_stop), None
    # before that and for Backstop's own jobs.
    stop_asked_at: float | None = None
    # Stage -> how many replica ids it has handed out ("<stage>-<n>").
    _counter: dict[str, int] = _persisted(key="counter", default_factory=dict)
    # (time, description) of every recovery step.
    history: list[tuple[float, str]] = _persisted(
        default_factory=list, dump=lambda h: h[-HISTORY_KEPT:], load=_tuple_items
    )
    replicas: dict[str, Replica] = _persisted(
        default_factory=dict, dump=lambda r: list(r.values()), load=_replicas_from_json
    )
    # The job's latest blue/green upgrade (spark_runtime/upgrade.py), under way or ended.
    upgrade: BlueGreen | None = _persisted(
        default=None, load=lambda raw: BlueGreen.from_dict(raw) if raw else None
    )

    def to_dict(self) -> dict:
        """A JSON-serialisable snapshot, so a driver can persist the machine between ticks."""
        snapshot = {}
        for state_field in fields(SupervisorState):
            value, dump = getattr(self, state_field.name), state_field.metadata.get("dump")
            key = state_field.metadata.get("key") or state_field.name
            snapshot[key] = _to_json(dump(value) if dump else value)
        return snapshot

    def _load(self, data: dict) -> None:
        """Take the fields of a `to_dict()` snapshot, of this version or an earlier one (a key
        missing from an older snapshot keeps its current value)."""
        entries = [_current_replica_entry(item, data["strategy"]) for item in data["replicas"]]
        data = {**data, "replicas": entries}
        for state_field in fields(SupervisorState):
            key = state_field.metadata.get("key") or state_field.name
            if key in data:
                load = state_field.metadata.get("load") or copy.deepcopy
                setattr(self, state_field.name, load(data[key]))

    @property
    def stages(self) -> list[str]:
        """The stage names, in launch order."""
        return list(self.stage_operators)

    @property
    def definition(self) -> Strategy:
        """The strategy's definition (spark_runtime.strategies)."""
        return get_strategy(self.strategy)

    @property
    def takes_warm_spares(self) -> bool:
        """Whether new and restarted replicas take over a warm spare: as the strategy says, and
        always for an existing app. An app runs as one copy under restart-all, so its restart is
        its only recovery: a spare's JVM and session, already up, are what make it faster than
        a cold `spark-submit` (docs/JOBS.md, "A warm spare takes over a failed app"). The
        restart-all of Backstop's own jobs stays the plain Spark baseline."""
        return self.definition.warm_spares or self.app

    @property
    def failover(self) -> FailoverStrategy:
        """Which replicas a failure restarts, or which standby takes over."""
        return self.definition.on_failure

    def of_stage(self, stage: str, role: str | None = None) -> list[Replica]:
        """Replicas of `stage` (optionally of one role) currently in the table, without the two
        of an upgrade under way (spark_runtime/upgrade.py handles those)."""
        apart = self.upgrade.apart() if self.upgrade is not None else set()
        return [
            r
            for r in self.replicas.values()
            if r.spec.stage == stage and (role is None or r.role == role) and r.id not in apart
        ]

    def live(self) -> list[Replica]:
        """Replicas the driver should watch (everything with a process that should run)."""
        return [r for r in self.replicas.values() if r.state not in (FAILED, BACKOFF)]

    def all_running(self) -> bool:
        """True once every replica in the table reports running."""
        return bool(self.replicas) and all(r.state == RUNNING for r in self.replicas.values())

    def standby_of(self, stage: str) -> Replica | None:
        """The stage's standby that is not failed (None: it has none)."""
        return next((r for r in self.of_stage(stage, STANDBY) if r.state != FAILED), None)

    def has_standby(self, stage: str) -> bool:
        """True if `stage` has a standby that is not failed."""
        return self.standby_of(stage) is not None

    def placement_by_stage(self) -> dict[str, tuple[str | None, str | None]]:
        """(primary node, standby node or None) per stage, from the live replicas."""
        result: dict[str, tuple[str | None, str | None]] = {}
        for stage in self.stage_operators:
            primaries = [r for r in self.of_stage(stage, PRIMARY) if r.state != FAILED]
            standby = self.standby_of(stage)
            result[stage] = (
                primaries[0].spec.node if primaries else None,
                standby.spec.node if standby else None,
            )
        return result

    def slow(self) -> list[str]:
        """Replicas that are silent but busy (flagged, not yet hung)."""
        return [r.id for r in self.replicas.values() if r.slow_since is not None]

    def _new_spec(self, stage: str, role: str, node: str) -> ReplicaSpec:
        """A new replica of `stage` with the next id; a standby is seeded from the stage's
        running primary where the strategy seeds standbys."""
        self._counter[stage] = self._counter.get(stage, 0) + 1
        replica_id = f"{stage}-{self._counter[stage]}"
        strategy = self.definition
        seed = None
        if role == STANDBY and strategy.seeded_standbys:
            primaries = [r for r in self.of_stage(stage, PRIMARY) if r.state == RUNNING]
            seed = primaries[0].id if primaries else None
        return ReplicaSpec(
            self.job,
            self.topology,
            stage,
            role,
            replica_id,
            node,
            operators=self.stage_operators[stage],
            params=self.params,
            seed_from=seed,
            warm=self.takes_warm_spares,
            cpu_priorities=strategy.cpu_priorities,
            recovery_first=strategy.recovery_first,
        )

    def _node_for(self, index: int, avoid: str | None = None) -> str:
        """Round robin over `nodes` from `index`, past `avoid` unless it is the only node."""
        for shift in range(len(self.nodes)):
            node = self.nodes[(index + shift) % len(self.nodes)]
            if node != avoid or len(self.nodes) == 1:
                return node
        return self.nodes[0]

    def _add(self, spec: ReplicaSpec, now: float) -> StartReplica:
        """Put a new replica into the table (starting) and return the action that launches it."""
        self.replicas[spec.replica_id] = Replica(spec, STARTING, now, launched_at=now)
        return StartReplica(spec)

    def _upgrading(self, stage: str) -> bool:
        """Whether an upgrade of `stage` is under way (spark_runtime/upgrade.py)."""
        return self.upgrade is not None and self.upgrade.under_way and stage == self.upgrade.stage
