"""The fault-tolerance strategies, each defined once.

Every part of Backstop that behaves differently per strategy reads this table: the job model's
choices, the planner (how stages are cut, which get a standby), the supervision state machine
(what a failure leads to), the policy cycle (whether Algorithm 2 may add, drop or move
standbys), the launchers (seeded standbys, warm spares, CPU priority) and the benchmark. Adding a
strategy is one entry here, plus one failover class in spark_runtime/failover.py if what a
failure leads to is new. No Django, no Spark: both sides import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from spark_runtime.failover import (
    FailoverStrategy,
    PromoteFailover,
    RestartJobFailover,
    RestartStageFailover,
)
from spark_runtime.topology import CHAINED, FUSED, PER_STATEFUL, Topology, compile_stages

# What a stage gets a hot standby for.
NO_STANDBYS = "none"
POLICY_STANDBYS = "policy"  # the operators Da-Stream's policy makes active, within the reserve
ALL_STANDBYS = "all"  # every stage, the reserve not kept (the resource upper bound)

# Nice levels (0 = normal), set for the process group and its session's autogroup
# (spark_runtime/cpu_priority.py), highest priority first:
# - the control plane (controller, node agents, beat, started by infra/launcher.py) at
#   CONTROL_PLANE_NICE, above the primaries: what supervises the jobs must not wait behind them,
#   and it takes little CPU but at its start. With three jobs on 2 cores (load average 30-40), a
#   restarted controller took 40-65 s to supervise again at the normal level (2.2 s of CPU to
#   start), 16 s at the primaries' level (docs/RESULTS.md, "Soak");
# - the console's web server at CONSOLE_NICE, the primaries' level, where it runs beside them
#   (the demo): operators use it most while a job recovers, when the cores are busiest. At the
#   normal level, on 2 cores running two test clusters' jobs, the overview showed its first
#   numbers after 26 s (its layout request alone took 7 s) and the browser test gave up in 2
#   runs of 3; at this level it passed 3 of 3. Its work comes in short bursts (a refresh every
#   2 s), which at a primary's weight wait little and take little from a primary;
# - recovery first (issue 59): work that restores service runs above the steady work of every job,
#   under every strategy but the plain Spark baseline (`recovery_first`). A primary that takes over
#   (a promoted standby, or a stage restarted from its checkpoint, by a restart or a relaunch) runs
#   at RECOVERING_NICE from its start or promotion for RECOVERY_PRIORITY_S, time for a restart's JVM
#   and state restore, its first output and the backlog of the gap, then at the strategy's steady
#   level (PRIMARY_NICE, or 0 without `cpu_priorities`): bounded, so a stage that keeps failing does
#   not hold the class for ever. A standby seeded from its primary's checkpoint (a new standby after
#   a promotion, a standby the policy adds or restores: the stage is unprotected until it has caught
#   up) catches up at REPROTECTING_NICE, above the steady primaries, below the recovering primary it
#   protects. Measured: docs/RESULTS.md, "Recovery first";
# - a standby whose queries missed Spark's fixed 10 s for the source's Python worker to connect
#   back, starting them again, at START_RETRY_NICE until its first batch: a deadline that a
#   start at its usual level missed on a host busy with steady work. Seen with six jobs
#   started at once on 2 cores: the standbys (at the normal level while they start) missed it
#   at each of their 3 tries and were started anew by the controller, minutes unprotected;
# - a steady primary at PRIMARY_NICE, where its process may raise its priority (CAP_SYS_NICE or an
#   RLIMIT_NICE of 25; elsewhere as high as its limit lets it). After a promotion the new
#   primary works off the input of the failover gap while a taken spare starts the new standby
#   and catches it up;
#   with all three at the normal level, on 2 shared cores, that contention kept topn's latency
#   out of its band for over 30 s after every fault (docs/RESULTS.md, "A primary above the
#   rest"). Above them it is served first, and the rest share what it leaves;
# - a standby starting or catching up at CATCHING_UP_NICE: a seeded
#   standby's backlog is short, and how fast it works it off is the stage's re-protect time.
#   Measured on 2 cores with a lower level (docs/RESULTS.md, "CPU priority"): re-protection
#   took 37-55 s instead of 16-23 s, so the second fault 30 s later found no promotable standby;
# - a caught-up standby at STANDBY_NICE, below its primary, so that the cores they share favour
#   the primary's latency;
# - a spare still warming up at the normal level while a job needs it (no idle spare where its
#   next fault would start a process: console.policy.spares.spare_needed), at
#   NEEDED_SPARE_HELD_NICE while a stage is re-protected (below the standby catching up, yet
#   warm before the fault after next), else at SPARE_NICE (spark_runtime.spare.warming_nice):
#   a refill at the normal level after a promotion took 40% of a core from topn's primary for
#   about a minute, and one at SPARE_NICE during every re-protection was not warm a minute later;
# - an idle warm spare at SPARE_NICE (it uses no CPU).
CONTROL_PLANE_NICE = -10
RECOVERING_NICE = -8
REPROTECTING_NICE = -6
START_RETRY_NICE = REPROTECTING_NICE
RECOVERY_PRIORITY_S = 30.0
PRIMARY_NICE = -5
CONSOLE_NICE = PRIMARY_NICE
STANDBY_NICE = 5
CATCHING_UP_NICE = 0
NEEDED_SPARE_HELD_NICE = 5
SPARE_NICE = 19

# A caught-up low-priority standby (at STANDBY_NICE) also reads new input only every
# STANDBY_BATCH_EVERY_S, not on every trigger: at these input rates a micro-batch's cost is
# nearly all fixed (planning, the source's Python calls, two state-store commits), so a standby
# batching as often as its primary used as much CPU as it. Measured with topn's plain query alone
# on 2 cores (50 events/s; bench/dataplane/batch_cost.py): 118-158% of a core batching every
# 1 s, 69% every 2 s, 47-49% every 3 s, 29% every 6 s. A standby so paced is at most this much
# input (and one batch)
# behind its primary, far below CAUGHT_UP_S (a read cut short by maxRecordsPerBatch is not
# paced: the next trigger reads on); a promotion lifts the pace before it fences the old
# primary. It must stay below Spark's spark.sql.streaming.noDataProgressEventInterval (10 s):
# a query idle that long reports onQueryIdle, which the output gate takes for "read everything
# there is" (OutputGate.note_idle), and a paced query's batches restart that clock.
STANDBY_BATCH_EVERY_S = 6.0


@dataclass(frozen=True)
class Strategy:
    """One strategy: how a job's operators are cut into stages and protected.

    - `chaining`: the stage-cutting rule of spark_runtime.topology.compile_stages;
    - `standbys`: which stages get a hot standby at launch (`none`, `policy`, `all`);
    - `policy_moves_standbys`: whether the policy cycle (Algorithm 2) may add, drop or move them;
    - `on_failure`: what a failed replica leads to, its failover strategy
      (spark_runtime.failover): the whole job restarts, only the failed stage, or a caught-up
      standby takes over;
    - `seeded_standbys`: a new standby starts from a copy of its primary's latest committed
      checkpoint instead of replaying the input from the beginning;
    - `warm_spares`: restarts and new standbys take over a node's pre-started stage process
      (JVM and SparkSession up) when one is free;
    - `cpu_priorities`: primaries run at a higher CPU priority (where allowed), standbys and
      spares at a lower one;
    - `recovery_first`: a primary that restores service (restarted from its checkpoint, or
      promoted) runs in the recovery class for RECOVERY_PRIORITY_S, above every job's steady
      work, whether or not the strategy sets steady levels (`cpu_priorities`).
    """

    name: str
    label: str
    chaining: str
    standbys: str
    policy_moves_standbys: bool
    on_failure: FailoverStrategy
    seeded_standbys: bool
    warm_spares: bool
    cpu_priorities: bool
    recovery_first: bool

    def standby_stages(self, stages: Iterable[str], chosen: Iterable[str] = ()) -> set[str]:
        """The stages that get a hot standby at launch: all of `stages`, those the policy
        `chosen`, or none."""
        if self.standbys == ALL_STANDBYS:
            return set(stages)
        if self.standbys == POLICY_STANDBYS:
            return set(chosen)
        return set()


RESTART_ALL = Strategy(
    name="restart-all",
    label="restart-all (one fused query, restart everything)",
    chaining=FUSED,
    standbys=NO_STANDBYS,
    policy_moves_standbys=False,
    on_failure=RestartJobFailover(),
    # The plain Spark baseline: none of Backstop's mechanisms. (An existing app's restarts take
    # over warm spares all the same: SupervisorState.takes_warm_spares says why.)
    seeded_standbys=False,
    warm_spares=False,
    cpu_priorities=False,
    recovery_first=False,
)
LOCAL_RESTART = Strategy(
    name="local-restart",
    label="local-restart (restart only the failed stage)",
    chaining=PER_STATEFUL,
    standbys=NO_STANDBYS,
    policy_moves_standbys=False,
    on_failure=RestartStageFailover(),
    seeded_standbys=False,
    warm_spares=False,
    cpu_priorities=False,
    # Its steady work stays at the normal level, but its restarts, its only recovery, run in
    # the recovery class: at nice 0 a restarted stage waited behind the steady primaries of
    # the adaptive jobs beside it (a local restart of 33.6 s in a soak, 21.4 s of it the JVM
    # and state restore; 14.5-16.0 s in the class).
    recovery_first=True,
)
ADAPTIVE = Strategy(
    name="adaptive",
    label="adaptive (Da-Stream policy)",
    chaining=CHAINED,
    standbys=POLICY_STANDBYS,
    policy_moves_standbys=True,
    on_failure=PromoteFailover(),
    seeded_standbys=True,
    warm_spares=True,
    cpu_priorities=True,
    recovery_first=True,
)
ACTIVE_ALL = Strategy(
    name="active-all",
    label="active-all (hot standby for every stage)",
    chaining=CHAINED,
    standbys=ALL_STANDBYS,
    policy_moves_standbys=False,
    on_failure=PromoteFailover(),
    seeded_standbys=True,
    warm_spares=False,
    cpu_priorities=True,
    recovery_first=True,
)

STRATEGY_TABLE: dict[str, Strategy] = {
    s.name: s for s in (RESTART_ALL, LOCAL_RESTART, ADAPTIVE, ACTIVE_ALL)
}
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_TABLE)


def get_strategy(name: str) -> Strategy:
    """The strategy called `name`; ValueError naming the known ones otherwise."""
    try:
        return STRATEGY_TABLE[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None


def in_place_refusal(
    topology: Topology,
    stages: Mapping[str, Sequence[str]],
    active_stages: Iterable[str],
    to: str,
) -> str | None:
    """Why a job of `topology` running as `stages` (stage -> operators, those in `active_stages`
    with a standby) cannot be protected by strategy `to` without stopping, in plain words; None
    when it can: `to` groups the job's operators into the stages it runs as, so every running
    replica and its checkpoint go on, under the names they run as (restart-all calls its one
    stage `job` where the others name a stage after its stateful operator: the same queries).
    A strategy whose standbys the policy chooses runs every cut its policy can lead to (two
    stateful operators protected differently go to stages of their own). Each stage has a
    checkpoint of its own, which a stage cut otherwise (other operators together) cannot
    resume."""
    new = get_strategy(to)
    running = {name: tuple(ops) for name, ops in stages.items()}
    cuts = [
        {s.name: tuple(s.operators) for s in compile_stages(topology, new.chaining, protected)}
        for protected in _protections(topology, new, stages, active_stages)
    ]
    running_groups = sorted(running.values())
    if any(sorted(cut.values()) == running_groups for cut in cuts):
        return None

    def described(by_stage: Mapping[str, Sequence[str]]) -> str:
        return "; ".join(f"{name}: {', '.join(ops)}" for name, ops in by_stage.items())

    return (
        f"{to} cuts this job into other stages ({described(cuts[0])}) than it runs as "
        f"({described(running)}): each stage resumes its own checkpoint, so the job cannot "
        f"change to {to} without stopping; start a new job with it"
    )


# The policy's choices tried for a strategy whose standbys it chooses: every subset of the
# stateful operators (what the chaining rule looks at) up to this many of them.
MAX_STATEFUL_TRIED = 10


def _protections(
    topology: Topology,
    strategy: Strategy,
    stages: Mapping[str, Sequence[str]],
    active_stages: Iterable[str],
) -> list[set[str]]:
    """The sets of operators `strategy` may protect on `topology`, the one it would protect
    now first (what a refusal describes): every operator, none, or, where the policy chooses,
    the operators it protects now and then every other choice of stateful operators."""
    if strategy.standbys == ALL_STANDBYS:
        return [{op.name for op in topology.operators}]
    if strategy.standbys != POLICY_STANDBYS:
        return [set()]
    now = {op for stage in active_stages for op in stages.get(stage, ())}
    stateful = [op.name for op in topology.operators if op.stateful]
    if len(stateful) > MAX_STATEFUL_TRIED:
        return [now]
    choices = (set(c) for n in range(len(stateful) + 1) for c in combinations(stateful, n))
    return [now, *choices]
