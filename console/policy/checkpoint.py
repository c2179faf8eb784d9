"""Adaptive checkpoint interval for passive operators (Da-Stream) and its mapping to Spark.

Formulas
--------
Initial interval: ``C_initial = T * T_checkpoint / (fr * T_recover)`` with T the planning horizon
(`interval_horizon_s`), T_checkpoint the cost of one checkpoint (`checkpoint_cost_s`), T_recover
the cost of one recovery (`recovery_cost_s`) and fr the predicted fault rate. Rare faults or
cheap recoveries allow long intervals; expensive checkpoints push them out too.

Online adjustment, applied in this order to the current interval CI:

1. no fault since the last cycle -> ``CI + CI*(1-fr)``; a fault -> ``CI - CI*fr``;
2. CPU utilisation above C_const -> ``CI * (U_cpu/C_const)`` (checkpoints cost CPU; do fewer);
3. memory utilisation above M_const -> ``CI * (U_mem/M_const)``;
4. slow tasks N_slow above M -> ``CI + CI*(N_slow-M)/M``;
5. clamp to [checkpoint_min_s, checkpoint_max_s].

Mapping to Spark Structured Streaming
-------------------------------------
A micro-batch query commits its offsets and state at every trigger: every micro-batch is already a
consistent restart point, so "how often we checkpoint" in Da-Stream's sense is the cost-bearing
part of the checkpoint, not the commit itself. With the RocksDB state store and
``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true`` each batch uploads
only a small changelog of the state it changed; a full state snapshot is written every
``spark.sql.streaming.stateStore.minDeltasForSnapshot`` batches. A restart loads the newest
snapshot and replays the changelogs after it, so the snapshot spacing is what trades checkpoint
cost against recovery cost, exactly Da-Stream's CI. Hence:

- the stage keeps its latency-driven trigger interval (its topology's), shortened to CI when CI
  is shorter, because a trigger longer than CI would leave more than CI of un-committed input;
- ``minDeltasForSnapshot = max(1, round(CI / trigger))`` so a full snapshot lands about every CI
  seconds;
- the snapshot is made locally at commit once that many changelogs have piled up, but uploaded by
  the executors' background maintenance task, which runs every
  ``spark.sql.streaming.stateStore.maintenanceInterval`` (Spark's default 60 s). So that interval
  is set to ``min(60 s, CI)`` (whole seconds, at least 1 s), otherwise a CI below a minute would
  not shorten the replay after a restart.

A query runs on a copy of the session taken when it starts, so a running stage takes new
settings only by restarting its queries from their checkpoints (a few seconds of its output; the
process and its JVM stay). Hence (`interval_rollout`): a replica starts with its stage's interval
(the shortest of its operators'); later, a change of more than INTERVAL_CHANGE_FACTOR reaches it
at most every `interval_apply_gap_s`, only at a quiet moment, one replica of a stage at a time,
the standby before the primary. The trigger does not change (it is the topology's,
spark_runtime.topology: wordcount 0.3 s, the others 0.5 s): with the default checkpoint_min_s
(1 s) no interval is shorter than it; an interval an admin sets below a stage's trigger takes
effect as a snapshot every batch. Spark runs the state store's maintenance thread once per JVM;
whether it picks up a new maintenanceInterval without a new process is not verified here.
"""

from __future__ import annotations

from dataclasses import dataclass

from console.policy.config import PolicyConfig

# fr is a probability from the predictor, which clips to [0.001, 0.999]; the same floor here
# keeps C_initial finite when a caller passes 0.
MIN_FAULT_RATE = 0.001
SPARK_MAINTENANCE_DEFAULT_S = 60


def clamp_interval(seconds: float, config: PolicyConfig) -> float:
    """Clamp an interval to [checkpoint_min_s, checkpoint_max_s]."""
    return min(config.checkpoint_max_s, max(config.checkpoint_min_s, seconds))


def initial_interval(fr: float, config: PolicyConfig) -> float:
    """C_initial = T * T_checkpoint / (fr * T_recover), clamped to the configured bounds."""
    fr = max(MIN_FAULT_RATE, fr)
    raw = config.interval_horizon_s * config.checkpoint_cost_s / (fr * config.recovery_cost_s)
    return clamp_interval(raw, config)


@dataclass(frozen=True)
class IntervalDecision:
    """A new interval and the rules that produced it (human-readable, in order)."""

    seconds: float
    rules: tuple[str, ...]

    @property
    def reason(self) -> str:
        """The rules joined into one line for an action's reason."""
        return "; ".join(self.rules)


def adjust_interval(
    current: float,
    *,
    fault: bool,
    fr: float,
    cpu_util: float,
    mem_util: float,
    slow_tasks: int,
    config: PolicyConfig,
) -> IntervalDecision:
    """Apply Da-Stream's online adjustment rules (see the module docstring) to `current`."""
    ci = float(current)
    rules: list[str] = []
    if fault:
        new = ci - ci * fr
        rules.append(f"fault: {ci:.3g} - {ci:.3g}*{fr:.3g} = {new:.3g}")
    else:
        new = ci + ci * (1 - fr)
        rules.append(f"no fault: {ci:.3g} + {ci:.3g}*(1-{fr:.3g}) = {new:.3g}")
    ci = new
    if cpu_util > config.cpu_const:
        new = ci * (cpu_util / config.cpu_const)
        rules.append(
            f"cpu {cpu_util:.2f} > {config.cpu_const:g}: x{cpu_util / config.cpu_const:.3g}"
        )
        ci = new
    if mem_util > config.mem_const:
        new = ci * (mem_util / config.mem_const)
        rules.append(
            f"mem {mem_util:.2f} > {config.mem_const:g}: x{mem_util / config.mem_const:.3g}"
        )
        ci = new
    limit = config.slow_task_limit
    if slow_tasks > limit:
        new = ci + ci * (slow_tasks - limit) / limit
        rules.append(f"slow tasks {slow_tasks} > {limit}: +{(slow_tasks - limit) / limit:.3g}x")
        ci = new
    clamped = clamp_interval(ci, config)
    if clamped != ci:
        rules.append(
            f"clamped {ci:.3g} to [{config.checkpoint_min_s:g}, {config.checkpoint_max_s:g}]"
        )
    return IntervalDecision(seconds=clamped, rules=tuple(rules))


def _spark_duration(seconds: float) -> str:
    # Spark parses "N seconds" and "N milliseconds"; use whole milliseconds for fractions.
    if float(seconds).is_integer():
        return f"{int(seconds)} seconds"
    return f"{round(seconds * 1000)} milliseconds"


def spark_settings_for_interval(seconds: float, trigger_s: float) -> dict:
    """Spark settings that realise a checkpoint interval of `seconds` (see module docstring).

    Returns the trigger interval as a Spark duration string and as float seconds, plus the SQL
    confs for changelog checkpointing, the snapshot spacing in batches and the maintenance
    interval that uploads the snapshots. Example: 30 s with a 1 s trigger -> trigger "1 seconds",
    minDeltasForSnapshot "30", maintenanceInterval "30s".
    """
    if seconds <= 0 or trigger_s <= 0:
        raise ValueError(f"interval and trigger must be positive (got {seconds}, {trigger_s})")
    trigger = min(trigger_s, seconds)
    maintenance_s = max(1, min(SPARK_MAINTENANCE_DEFAULT_S, round(seconds)))
    return {
        "trigger_interval": _spark_duration(trigger),
        "trigger_interval_s": float(trigger),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": str(
            max(1, round(seconds / trigger))
        ),
        "spark.sql.streaming.stateStore.maintenanceInterval": f"{maintenance_s}s",
    }


# --- Bringing an interval to running stages ----------------------------------------------------

# A replica is asked to take a new interval only if it differs from the one in force by more than
# this factor either way: each change restarts the replica's queries, so the online adjustment's
# small steps (CI*fr after a fault) are not worth one.
INTERVAL_CHANGE_FACTOR = 1.5
# A replica asked to take an interval that has not reported it within this long is asked again.
INTERVAL_PENDING_TIMEOUT_S = 60.0


def state_store_confs(seconds: float, trigger_s: float) -> dict[str, str]:
    """The Spark settings a running stage with trigger `trigger_s` (its topology's) takes for
    interval `seconds`: the state-store part of spark_settings_for_interval (a running stage
    keeps its trigger; see the module docstring)."""
    return {
        key: value
        for key, value in spark_settings_for_interval(seconds, trigger_s).items()
        if key.startswith("spark.")
    }


def stage_interval(intervals) -> float | None:
    """A stage's interval: the shortest of its operators' (the most protective), None if none."""
    positive = [float(s) for s in intervals if s and s > 0]
    return min(positive) if positive else None


@dataclass(frozen=True)
class ReplicaInterval:
    """What the controller knows of one live replica's interval."""

    replica_id: str
    stage: str
    role: str  # "primary" or "standby"
    running: bool  # reported running (not starting, catching up, failed)
    seconds: float | None  # the interval in force, as the replica reports it
    since: float | None  # when that took effect (epoch seconds)
    pending_since: float | None = None  # asked for a new one then, not reported yet


@dataclass(frozen=True)
class ApplyInterval:
    """Ask `replica_id` to take interval `seconds` (it restarts its queries from checkpoints)."""

    replica_id: str
    stage: str
    seconds: float
    reason: str


def _differs(wanted: float, current: float | None) -> bool:
    if current is None or current <= 0:
        return True
    return max(wanted, current) / min(wanted, current) > INTERVAL_CHANGE_FACTOR


def interval_rollout(
    wanted: dict[str, float],
    replicas: list[ReplicaInterval],
    now: float,
    min_gap_s: float,
    quiet: bool,
) -> list[ApplyInterval]:
    """Which replicas take their stage's interval now: at most one per stage at a time.

    Rules (each restart of a replica's queries costs it a few seconds of output):
    - only at a quiet moment (`quiet`: no recovery under way and no recent failure);
    - a stage whose replicas are not all running, or one of which has a request pending, waits:
      never both replicas of a stage at once, never a replica whose partner is down;
    - a replica is asked only if its interval differs by more than INTERVAL_CHANGE_FACTOR and
      it has kept its current one at least `min_gap_s`;
    - the standby goes first, so the primary restarts only once its standby runs the new one.
    """
    if not quiet:
        return []
    actions = []
    for stage, seconds in sorted(wanted.items()):
        mine = [r for r in replicas if r.stage == stage]
        if not mine or not all(r.running for r in mine):
            continue
        if any(
            r.pending_since is not None and now - r.pending_since < INTERVAL_PENDING_TIMEOUT_S
            for r in mine
        ):
            continue
        due = [
            r
            for r in mine
            if _differs(seconds, r.seconds) and (r.since is None or now - r.since >= min_gap_s)
        ]
        if not due:
            continue
        replica = min(due, key=lambda r: (r.role != "standby", r.replica_id))
        current = "none" if replica.seconds is None else f"{replica.seconds:g} s"
        actions.append(
            ApplyInterval(
                replica.replica_id,
                stage,
                seconds,
                f"{replica.replica_id} ({replica.role}): checkpoint interval {current} -> "
                f"{seconds:g} s; its queries restart from their checkpoints",
            )
        )
    return actions
