"""Blue/green upgrade of a running stage: events -> actions, like supervision.py (no I/O).

A running stage (its primary: "blue") is upgraded to another registered version or other
operator parameters ("green") without a gap in its output:

1. STARTING: green starts as an extra standby of the stage, on the node the supervisor would give
   a new standby (a warm spare's), seeded from blue's latest committed checkpoint when its state
   is compatible (`seeded`), else rebuilding its state from the input the job's stream retains.
   Like any standby it buffers its output and trims what blue has written; unlike one it runs
   every batch at the normal priority (`successor`).
2. HANDING_OVER: green reports a measured lag of at most SWITCH_LAG_S behind blue; blue is told
   to demote itself (right after its next batch is written it stops writing and buffers, as a
   standby: its last write is the moment it hands over).
3. SWITCHING: blue reports it is a standby; green is promoted: a new fencing epoch (blue could
   not write any more even if it tried), then green writes what blue had not, from its buffer.
   Each result is written once: the sinks are idempotent by version (docs/JOBS.md).
4. VALIDATING: green writes; blue keeps running as green's standby, at full pace. For the
   validation window green is watched: a crash, its output latency or dead letters against
   blue's before the upgrade (`validation_failure`, on what the controller measured), or, for
   a change declared result-preserving, results that differ from those blue computes beside it
   on the same keys (spark_runtime/result_check.py), rolls it
   back (ROLLED_BACK: blue is promoted again, the ordinary promotion of a standby, and green
   goes); else the upgrade is CONFIRMED and blue retires.

Until the switch a failure of green abandons the upgrade (blue never stopped; if it had already
demoted itself it is promoted back). A failure of green while validating rolls back. Blue
failing after it handed over leaves nothing to roll back to: the upgrade is confirmed as soon
as green writes, and the stage gets an ordinary standby again. While an upgrade runs the two
replicas are apart from the stage's ordinary standbys (`apart`): the failover strategy never
promotes green in place of a failed blue, and the policy never moves or drops either.

An existing app (spark_runtime/apps.py) runs as one copy whose sinks know nothing of Backstop's
fencing, so it is upgraded by a stop and a start from the same checkpoints (APP_RESTART, the
same BlueGreen record with `blue == green`, the app's one replica): HANDING_OVER while its
queries stop (StopApp; killed after APP_STOP_WITHIN_S), VALIDATING once the new version is
launched there. Spark's own rules decide whether the checkpoints suit the new version: it is
confirmed when each of its queries has completed a batch, and rolled back (the old version
restarted from the checkpoints as the new one left them) when it fails first, or has not
done so APP_FIRST_BATCHES_WITHIN_S after its script started (APP_START_WITHIN_S after its
launch, for a session that never comes up) (`app_tick`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from spark_runtime.replicas import (
    FAILED,
    PRIMARY,
    PROMOTING,
    RUNNING,
    STANDBY,
    KillReplica,
    PromoteStandby,
    Replica,
    ReplicaSpec,
    RestartStage,
    StartReplica,
    relaunched,
)
from spark_runtime.snapshot import rebuild

STARTING = "starting"
HANDING_OVER = "handing_over"
SWITCHING = "switching"
VALIDATING = "validating"
CONFIRMED = "confirmed"
ROLLED_BACK = "rolled_back"
ABANDONED = "abandoned"  # the job was given up on or stopped meanwhile
# Green takes over once it has measured its lag behind blue after a batch (or found its input
# idle) and is at most this far behind. A standby counts as caught up for a failover 15 s behind
# (stage.CAUGHT_UP_S), and before its first batch ends when the primary wrote nothing yet: blue
# still writes, so green waits until taking over costs no more than a batch or two (a green
# switched in during its first, 12 s long, batch wrote 12 s old output: a 2.3 s gap).
SWITCH_LAG_S = 2.0
# Validation: green's p90 output latency, averaged over this many seconds, above blue's band
# rolls the upgrade back; judged from SWITCH_GRACE_S after the switch on, so that the switch's
# own gap (the first outputs after it carry a second or two more latency) is no symptom.
LATENCY_WINDOW_S = 10.0
SWITCH_GRACE_S = 10.0
# Dead letters: green may dead-letter what blue's rate before the switch predicts, plus the
# recovery band's share, plus this many entries (a lone malformed record is no symptom).
DEAD_LETTER_SLACK = 5
# How an upgrade replaces the running version.
BLUE_GREEN = "blue_green"
STOP_RESTART = "stop_restart"  # the baseline other consoles do: restart from the checkpoint
APP_RESTART = "app_restart"  # an existing app: stop it, start the new version on its checkpoints
# An app's new version is confirmed once each of its queries has completed a batch (a query's
# first batch after a restart loads its stateful operators' state, and Spark checks the state's
# compatibility there; one query's batches say nothing of another's state), and rolled back
# when they have not within this long after its script started. Counted from there, not from
# the launch: on this 2-core machine under other loads a stage's session took 2.5 min to come
# up and a first batch 71 s (measured 2026-11-29, load average 43), which are no fault of the
# new version. A session that does not come up within APP_START_WITHIN_S rolls back too.
APP_FIRST_BATCHES_WITHIN_S = 300.0
APP_START_WITHIN_S = 600.0
# The old version stops its queries (each ends its batch) and exits; one that has not within
# this long is killed (its checkpoints are consistent either way) and the new version starts.
APP_STOP_WITHIN_S = 30.0
# Phases in which the upgrade is under way (the others are final).
UNDER_WAY = (STARTING, HANDING_OVER, SWITCHING, VALIDATING)


class UpgradeRefused(ValueError):
    """The upgrade (or a step of it) cannot be done now; the message says why."""


@dataclass(frozen=True)
class DemoteReplica:
    """Tell a primary to become a standby after its next batch (blue handing over), and then its
    `successor` (green) to take over: the replica itself passes the promotion on as soon as it
    has demoted itself, a controller round trip (0.5 s measured) sooner than the controller
    would. The controller's own promotion follows and finds green promoted already."""

    replica_id: str
    stage: str
    successor: str = ""
    compare: bool = False  # check green's results against its own (BlueGreen.compare_results)


@dataclass(frozen=True)
class StopApp:
    """Tell an app's stage to stop its queries and exit (spark_runtime/stage.py, `supervise_app`).
    `sent_at`: a stage started later ignores it, a command meant for an earlier run of the
    replica left in its command list."""

    replica_id: str
    sent_at: float
    why: str = "an upgrade"  # for the decision log


@dataclass
class BlueGreen:
    """One upgrade of one stage, as the supervisor keeps it between ticks (JSON-serialisable)."""

    upgrade_id: int  # the console's record of it
    stage: str
    blue: str  # replica ids
    green: str
    from_topology: str
    to_topology: str
    from_params: tuple[str, ...]
    to_params: tuple[str, ...]
    seeded: bool
    phase: str
    started_at: float
    green_ready_at: float | None = None
    switched_at: float | None = None
    ended_at: float | None = None
    outcome: str = ""  # why it ended the way it did
    mode: str = BLUE_GREEN
    # Blue's normal before the upgrade, to judge green against while validating (None: not
    # learned, that check is skipped): its p90 output latency limit (ms) and the stage's dead
    # letter counter when the upgrade began, and at the switch (noted by the first check).
    latency_limit_ms: float | None = None
    dead_letters_at_start: int | None = None
    dead_letters_at_switch: int | None = None
    # Green's batch count (from its heartbeats) when it took over and now: a green that ran no
    # batch since (idle input) has not shown that its state loads, and is not confirmed by time.
    green_batches_at_switch: int | None = None
    green_batches: int = 0
    # Declared result-preserving: blue, standing by, compares green's results with its own on
    # the keys both computed (spark_runtime/result_check.py; its heartbeats report the counts)
    # and a difference rolls the upgrade back.
    compare_results: bool = False
    results_comparable: bool = True  # False: the stage writes nothing blue can compare
    results_compared: int = 0
    results_differing: int = 0
    results_examples: tuple[str, ...] = ()
    # An app's new version (APP_RESTART): the batches each of its queries completed so far.
    app_query_batches: dict[str, int] = field(default_factory=dict)

    @property
    def green_ran_since_switch(self) -> bool:
        """Green has run a batch as the primary (Spark loaded its state then)."""
        return self.green_batches_at_switch is not None and (
            self.green_batches > self.green_batches_at_switch
        )

    @property
    def results_checked(self) -> bool:
        """Nothing to check (not declared result-preserving, or nothing the stage writes can be
        compared), or blue has compared at least one key of green's results."""
        return not self.compare_results or not self.results_comparable or self.results_compared > 0

    @property
    def under_way(self) -> bool:
        return self.phase in UNDER_WAY

    @property
    def switched(self) -> bool:
        """Green has taken the output over (it may have been handed back since)."""
        return self.switched_at is not None

    def apart(self) -> set[str]:
        """Replica ids the stage's ordinary standby handling must leave alone now."""
        if not self.under_way:
            return set()
        return {self.green} if self.phase == STARTING else {self.green, self.blue}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BlueGreen:
        as_tuples = {
            name: tuple(data[name])
            for name in ("from_params", "to_params", "results_examples")
            if name in data
        }
        return rebuild(cls, data, **as_tuples)


@dataclass(frozen=True)
class BlueNormal:
    """What blue's output looked like before the upgrade (measured by the caller from the job's
    progress records and counters): green is judged against it while validating."""

    latency_limit_ms: float | None = None
    dead_letters: int | None = None


@dataclass(frozen=True)
class GreenSeen:
    """What green's output looks like now, while validating: its p90 output latency (ms) in
    each of the last seconds (oldest first, all after the switch) and the stage's dead letter
    counter."""

    p90_ms: tuple[float, ...]
    dead_letters: int | None
    band: float  # the recovery band (a fraction), for the dead letters' allowance


class UpgradeHost(Protocol):
    """What an upgrade reads and changes of the supervisor (spark_runtime.supervision.Supervisor)
    that calls into this module: its replica table, its history and the replica launches it
    makes. Typed here so this module needs nothing from the state machine above it."""

    topology: str
    params: tuple[str, ...]
    active_stages: set[str]
    standby_nodes: list[str]
    replicas: dict[str, Replica]
    retiring: dict[str, str]
    history: list[tuple[float, str]]
    gave_up: str | None
    upgrade: BlueGreen | None

    @property
    def stages(self) -> list[str]: ...

    def of_stage(self, stage: str, role: str | None = None) -> list[Replica]: ...

    def has_standby(self, stage: str) -> bool: ...

    def _new_spec(self, stage: str, role: str, node: str) -> ReplicaSpec: ...

    def _node_for(self, index: int, avoid: str | None = None) -> str: ...

    def _add(self, spec: ReplicaSpec, now: float) -> StartReplica: ...

    def _standby_for(self, stage: str, primary_node: str, now: float) -> StartReplica: ...


def validation_failure(upgrade: BlueGreen, seen: GreenSeen, now: float) -> str | None:
    """Why green fails its validation now (the reason a rollback gives), or None.

    - results: declared result-preserving, and blue found green's results different from its
      own on a key both computed (noted from blue's heartbeats, `on_heartbeat`);
    - latency: the mean of green's p90 output latency over the last LATENCY_WINDOW_S, all of it
      at least SWITCH_GRACE_S after the switch, above blue's limit (its recovery band);
    - dead letters: more since the switch than blue's rate from the upgrade's start to the
      switch allows over the same time, plus the band's share and DEAD_LETTER_SLACK.
    The first call after the switch notes the dead letter counter there (state kept)."""
    if upgrade.phase != VALIDATING or upgrade.switched_at is None:
        return None
    if upgrade.compare_results and upgrade.results_differing:
        return (
            f"the new version's results differ from the old version's on "
            f"{upgrade.results_differing} of {upgrade.results_compared} keys both computed "
            f"(declared result-preserving): {'; '.join(upgrade.results_examples)}"
        )
    since_switch = now - upgrade.switched_at
    if seen.dead_letters is not None and upgrade.dead_letters_at_switch is None:
        upgrade.dead_letters_at_switch = seen.dead_letters
    window = seen.p90_ms[-int(LATENCY_WINDOW_S) :]
    if (
        upgrade.latency_limit_ms is not None
        and since_switch >= SWITCH_GRACE_S + LATENCY_WINDOW_S
        and len(window) >= LATENCY_WINDOW_S
    ):
        mean = sum(window) / len(window)
        if mean > upgrade.latency_limit_ms:
            return (
                f"the new version's p90 output latency averaged {mean / 1000:.2f} s over "
                f"{LATENCY_WINDOW_S:g} s, above the old version's band "
                f"({upgrade.latency_limit_ms / 1000:.2f} s)"
            )
    if (
        seen.dead_letters is not None
        and upgrade.dead_letters_at_start is not None
        and upgrade.dead_letters_at_switch is not None
        and upgrade.switched_at > upgrade.started_at
    ):
        blue_rate = (upgrade.dead_letters_at_switch - upgrade.dead_letters_at_start) / (
            upgrade.switched_at - upgrade.started_at
        )
        green = seen.dead_letters - upgrade.dead_letters_at_switch
        allowed = blue_rate * since_switch * (1 + seen.band) + DEAD_LETTER_SLACK
        if green > allowed:
            return (
                f"the new version dead-lettered {green} input entries in {since_switch:.0f} s "
                f"where the old version's rate allows {allowed:.0f}"
            )
    return None


def begin(
    sup: UpgradeHost,
    upgrade_id: int,
    stage: str,
    to_topology: str,
    to_params: tuple[str, ...],
    seeded: bool,
    now: float,
    blue_normal: BlueNormal = BlueNormal(),
    compare_results: bool = False,
) -> list:
    """Start green beside the running primary of `stage`; raises UpgradeRefused when the stage
    has no running primary or an upgrade is under way. `blue_normal`: what green is judged
    against while validating; `compare_results`: the change is declared result-preserving."""
    if sup.upgrade is not None and sup.upgrade.under_way:
        raise UpgradeRefused(f"upgrade {sup.upgrade.upgrade_id} of this job is under way")
    if sup.gave_up:
        raise UpgradeRefused(f"the job was given up on: {sup.gave_up}")
    if stage not in sup.stages:
        raise UpgradeRefused(f"the job has no stage {stage!r}")
    primaries = [r for r in sup.of_stage(stage, PRIMARY) if r.state == RUNNING]
    if not primaries:
        raise UpgradeRefused(f"stage {stage} has no running primary to upgrade")
    blue = primaries[0]
    node = next((n for n in sup.standby_nodes if n != blue.spec.node), None)
    node = node or sup._node_for(sup.stages.index(stage) + 1, blue.spec.node)
    spec = sup._new_spec(stage, STANDBY, node)
    spec = replace(
        spec,
        topology=to_topology,
        params=tuple(to_params),
        seed_from=blue.id if seeded else None,
        successor=True,
    )
    sup.upgrade = BlueGreen(
        upgrade_id=upgrade_id,
        stage=stage,
        blue=blue.id,
        green=spec.replica_id,
        from_topology=sup.topology,
        to_topology=to_topology,
        from_params=tuple(sup.params),
        to_params=tuple(to_params),
        seeded=seeded,
        phase=STARTING,
        started_at=now,
        latency_limit_ms=blue_normal.latency_limit_ms,
        dead_letters_at_start=blue_normal.dead_letters,
        compare_results=compare_results,
    )
    how = f"seeded from {blue.id}'s checkpoint" if seeded else "rebuilding its state from input"
    sup.history.append(
        (now, f"upgrade {upgrade_id}: {spec.replica_id} ({to_topology}) starts on {node}, {how}")
    )
    return [sup._add(spec, now)]


def restart_in_place(
    sup: UpgradeHost,
    upgrade_id: int,
    stage: str,
    to_topology: str,
    to_params: tuple[str, ...],
    now: float,
) -> list:
    """The upgrade other consoles do (stop with a checkpoint, start the new version from it), as
    the baseline blue/green is measured against: every replica of `stage` restarts from its own
    checkpoint running the new version, in a new process as theirs do (a warm spare's JVM,
    Backstop's own, is not taken); the stage writes nothing until its primary is back."""

    if sup.upgrade is not None and sup.upgrade.under_way:
        raise UpgradeRefused(f"upgrade {sup.upgrade.upgrade_id} of this job is under way")
    replicas = sup.of_stage(stage)
    primary = next((r for r in replicas if r.role == PRIMARY), None)
    if primary is None:
        raise UpgradeRefused(f"stage {stage} has no primary to restart")
    actions = []
    for replica in replicas:
        replica.spec = replace(replica.spec, topology=to_topology, params=tuple(to_params))
        relaunched(replica, now)
        actions.append(RestartStage(replace(replica.spec, warm=False)))
    sup.upgrade = BlueGreen(
        upgrade_id=upgrade_id, stage=stage, blue=primary.id, green=primary.id,
        from_topology=sup.topology, to_topology=to_topology, from_params=tuple(sup.params),
        to_params=tuple(to_params), seeded=True, phase=CONFIRMED, started_at=now,
        switched_at=now, ended_at=now, mode=STOP_RESTART,
        outcome="stopped and restarted from its checkpoint running the new version",
    )  # fmt: skip
    sup.topology, sup.params = to_topology, tuple(to_params)
    sup.history.append((now, f"upgrade {upgrade_id}: restart {stage} in place as {to_topology}"))
    return actions


def on_heartbeat(sup: UpgradeHost, replica, reported: dict, now: float) -> list | None:
    """What a heartbeat of green or blue means for the upgrade under way: the actions, or None
    for the supervisor's ordinary handling."""
    upgrade = sup.upgrade
    if upgrade.mode == APP_RESTART:
        return _on_app_heartbeat(upgrade, reported, now)
    if replica.id == upgrade.green and upgrade.phase == STARTING:
        lag = reported.get("lag_s")
        if reported.get("state") != RUNNING or lag is None or float(lag) > SWITCH_LAG_S:
            return None  # starting or catching up: ordinary bookkeeping
        replica.state, replica.since = RUNNING, now
        upgrade.phase, upgrade.green_ready_at = HANDING_OVER, now
        sup.history.append(
            (
                now,
                f"upgrade {upgrade.upgrade_id}: {replica.id} caught up; {upgrade.blue} hands over",
            )
        )
        return [DemoteReplica(upgrade.blue, upgrade.stage, upgrade.green, upgrade.compare_results)]
    if replica.id == upgrade.blue and upgrade.phase == HANDING_OVER:
        if reported.get("role") != STANDBY:
            return []
        return _promote_green(sup, now)
    if replica.id == upgrade.green and upgrade.phase == HANDING_OVER:
        if reported.get("role") != PRIMARY or reported.get("state") != RUNNING:
            return []
        # Blue passed the promotion on (DemoteReplica.successor) before its own report that it
        # is a standby was seen: green has taken over, no promote command is due.

        actions = [a for a in _promote_green(sup, now) if not isinstance(a, PromoteStandby)]
        _switched(upgrade, reported)
        return actions + _on_green_promoted(sup, replica, now)
    if replica.id == upgrade.green and upgrade.phase == SWITCHING and replica.state == PROMOTING:
        if reported.get("state") == "promote_failed":
            why = f"{replica.id} could not take over: {reported.get('error')}"
            if upgrade.blue in sup.replicas:
                return roll_back(sup, now, why)
            # Blue is gone: green restarts from its own checkpoint as the stage's primary.

            replica.spec = replace(replica.spec, role=PRIMARY, seed_from=None, successor=False)
            relaunched(replica, now)
            _end(sup, ABANDONED, now, f"{why}; the version before was gone: restarted")
            return [RestartStage(replica.spec)]
        if reported.get("role") == PRIMARY and reported.get("state") == RUNNING:
            _switched(upgrade, reported)
            return _on_green_promoted(sup, replica, now)
        return []
    if replica.id == upgrade.green and upgrade.phase == VALIDATING:
        upgrade.green_batches = int(reported.get("batches") or 0)
    if replica.id == upgrade.blue and upgrade.phase == VALIDATING:
        check = reported.get("result_check") or {}
        upgrade.results_comparable = bool(check.get("comparable", True))
        upgrade.results_compared = int(check.get("compared") or 0)
        upgrade.results_differing = int(check.get("differing") or 0)
        upgrade.results_examples = tuple(check.get("examples") or ())
    return None


def _switched(upgrade: BlueGreen, reported: dict) -> None:
    """Note green's batch count at the switch (from its report as the primary)."""
    upgrade.green_batches_at_switch = int(reported.get("batches") or 0)
    upgrade.green_batches = upgrade.green_batches_at_switch


def _promote_green(sup: UpgradeHost, now: float) -> list:
    """Blue is a standby now (or gone): promote green (a new fencing epoch), and let the stage's
    ordinary standby go (blue itself stands by for green until the upgrade ends)."""

    upgrade = sup.upgrade
    if upgrade.blue in sup.replicas:
        blue = sup.replicas[upgrade.blue]
        blue.spec = replace(blue.spec, role=STANDBY)
    upgrade.phase = SWITCHING
    green = sup.replicas[upgrade.green]
    green.state, green.since = PROMOTING, now
    actions: list = [PromoteStandby(green.id, upgrade.stage)]
    for old in sup.of_stage(upgrade.stage, STANDBY):
        del sup.replicas[old.id]
        actions.append(KillReplica(old.id))
    sup.retiring.pop(upgrade.stage, None)
    sup.history.append((now, f"upgrade {upgrade.upgrade_id}: promote {green.id}"))
    return actions


def _on_green_promoted(sup: UpgradeHost, green, now: float) -> list:
    """Green writes the stage's output: new replicas of the stage run its version from now on."""
    upgrade = sup.upgrade
    green.spec = replace(green.spec, role=PRIMARY, seed_from=None, successor=False)
    green.state, green.since = RUNNING, now
    upgrade.phase, upgrade.switched_at = VALIDATING, now
    sup.topology, sup.params = upgrade.to_topology, upgrade.to_params
    if upgrade.blue not in sup.replicas:
        # Blue died handing over: nothing to roll back to, and the stage needs a standby now.
        return confirm(sup, now, f"{upgrade.blue} (the version before) failed: no rollback")
    sup.history.append(
        (now, f"upgrade {upgrade.upgrade_id}: {green.id} ({upgrade.to_topology}) is the primary "
         f"of {upgrade.stage}; {upgrade.blue} stands by until the upgrade is confirmed")
    )  # fmt: skip
    return []


def confirm(sup: UpgradeHost, now: float, why: str) -> list:
    """End the upgrade for good: blue retires; the stage gets an ordinary standby again where it
    is protected. Raises UpgradeRefused before the switch."""
    upgrade = _under_way(sup)
    if upgrade.phase != VALIDATING:
        raise UpgradeRefused(f"upgrade {upgrade.upgrade_id} has not switched yet ({upgrade.phase})")
    if upgrade.mode == APP_RESTART:
        _end(sup, CONFIRMED, now, why)  # the new version is the app's one copy already
        return []
    actions: list = []
    if upgrade.blue in sup.replicas:
        del sup.replicas[upgrade.blue]
        actions.append(KillReplica(upgrade.blue))
    _end(sup, CONFIRMED, now, why)
    green = sup.replicas[upgrade.green]
    if upgrade.stage in sup.active_stages and not sup.has_standby(upgrade.stage):
        actions.append(sup._standby_for(upgrade.stage, green.spec.node, now))
    return actions


def roll_back(sup: UpgradeHost, now: float, why: str) -> list:
    """Give the output back to blue (before the hand-over: just stop green). Raises
    UpgradeRefused when blue is gone.

    Green goes. Blue, if it was told to hand over, is promoted back: the ordinary promotion of
    a standby (a new epoch fences green, blue writes from its buffer what green had not; for a
    blue that had not demoted itself yet the promotion changes nothing). After the switch green
    stays in the table as the stage's failed primary until blue reports primary, as a failed
    primary does in a failover: should blue's promotion fail, the supervisor restarts green
    from its checkpoint rather than leave the stage without a writer."""

    upgrade = _under_way(sup)
    if upgrade.mode == APP_RESTART:
        return _restart_app(sup, upgrade.from_topology, upgrade.from_params, now, ROLLED_BACK, why)
    blue = sup.replicas.get(upgrade.blue)
    if blue is None or blue.state == FAILED:
        raise UpgradeRefused(f"{upgrade.blue} (the version before) is gone: no rollback possible")
    actions: list = []
    green = sup.replicas.get(upgrade.green)
    if green is not None:
        actions.append(KillReplica(green.id))
        if upgrade.switched:
            green.spec = replace(green.spec, role=PRIMARY, seed_from=None, successor=False)
            green.state = FAILED
        else:
            del sup.replicas[green.id]
    if upgrade.phase == HANDING_OVER and blue.role == PRIMARY:
        # Told to demote, perhaps not yet done: promoting it undoes that (or changes nothing).
        # It is still the stage's primary in the table: a failure restarts it as one.
        actions.append(PromoteStandby(blue.id, upgrade.stage))
    elif upgrade.phase != STARTING:
        blue.state, blue.since = PROMOTING, now
        actions.append(PromoteStandby(blue.id, upgrade.stage))
    sup.topology, sup.params = upgrade.from_topology, upgrade.from_params
    _end(sup, ROLLED_BACK, now, why)
    return actions


def on_failure(sup: UpgradeHost, replica_id: str, now: float, reason: str) -> tuple[list, bool]:
    """A failure of green or blue while the upgrade is under way: (actions, handled). Not
    handled: the supervisor's ordinary handling follows these actions."""

    upgrade = sup.upgrade
    if upgrade is None or not upgrade.under_way or replica_id not in (upgrade.green, upgrade.blue):
        return [], False
    if upgrade.mode == APP_RESTART:
        return _on_app_exit(sup, now, reason), True
    if replica_id == upgrade.green:
        when = "before the switch" if upgrade.phase in (STARTING, HANDING_OVER) else "after it"
        why = f"{replica_id} (the new version) failed {when}: {reason}"
        if upgrade.blue in sup.replicas:
            return roll_back(sup, now, why), True
        # Blue is gone too: green is all the stage has; the ordinary failover restarts it.
        green = sup.replicas[replica_id]
        green.spec = replace(green.spec, role=PRIMARY, seed_from=None, successor=False)
        _end(sup, ABANDONED, now, f"{why}; the version before was gone already")
        return [], False
    if upgrade.phase == STARTING:
        # Blue is still the stage's primary: its ordinary failover follows, and the upgrade,
        # whose green was seeded from it, ends (it may be asked for again).
        actions = []
        if upgrade.green in sup.replicas:
            del sup.replicas[upgrade.green]
            actions.append(KillReplica(upgrade.green))
        sup.topology, sup.params = upgrade.from_topology, upgrade.from_params
        _end(sup, ABANDONED, now, f"{replica_id} (the version before) failed before the switch")
        return actions, False
    # Blue failed after it was told to hand over: nothing to roll back to any more.
    del sup.replicas[replica_id]
    sup.history.append(
        (now, f"upgrade {upgrade.upgrade_id}: {replica_id} (the version before) failed: "
         f"{reason}; no rollback possible from now on")
    )  # fmt: skip
    if upgrade.phase == HANDING_OVER:
        return _promote_green(sup, now), True  # it died handing over: green takes over now
    if upgrade.phase == VALIDATING:
        # Green stays for good: confirmed now, so the stage gets its ordinary standby back
        # instead of running unprotected until the validation window ends.
        return confirm(sup, now, f"{replica_id} (the version before) failed: no rollback"), True
    return [], True


def abandon(sup: UpgradeHost, now: float, why: str) -> None:
    """The job was given up on or stopped while upgrading: the upgrade ends there."""
    if sup.upgrade is not None and sup.upgrade.under_way:
        if not sup.upgrade.switched:
            sup.topology, sup.params = sup.upgrade.from_topology, sup.upgrade.from_params
        _end(sup, ABANDONED, now, why)


def _under_way(sup: UpgradeHost) -> BlueGreen:
    upgrade = sup.upgrade
    if upgrade is None or not upgrade.under_way:
        raise UpgradeRefused("no upgrade of this job is under way")
    return upgrade


def _end(sup: UpgradeHost, phase: str, now: float, why: str) -> None:
    upgrade = sup.upgrade
    upgrade.phase, upgrade.ended_at, upgrade.outcome = phase, now, why
    sup.history.append((now, f"upgrade {upgrade.upgrade_id} {phase.replace('_', ' ')}: {why}"))


# --- an existing app: stop, start from the same checkpoints, validate -------------------------


def begin_app_restart(sup: UpgradeHost, upgrade_id: int, stage: str, to_topology: str, now: float):
    """Start the upgrade of an app (APP_RESTART): its one replica is told to stop its queries
    and exit; its exit starts the new version on the same checkpoints (`on_failure`). Raises
    UpgradeRefused when the app does not run or an upgrade is under way."""
    if sup.upgrade is not None and sup.upgrade.under_way:
        raise UpgradeRefused(f"upgrade {sup.upgrade.upgrade_id} of this job is under way")
    if sup.gave_up:
        raise UpgradeRefused(f"the job was given up on: {sup.gave_up}")
    running = [r for r in sup.of_stage(stage, PRIMARY) if r.state == RUNNING]
    if not running:
        raise UpgradeRefused(f"stage {stage} has no running app to upgrade")
    app = running[0]
    sup.upgrade = BlueGreen(
        upgrade_id=upgrade_id, stage=stage, blue=app.id, green=app.id,
        from_topology=sup.topology, to_topology=to_topology, from_params=tuple(sup.params),
        to_params=tuple(sup.params), seeded=True, phase=HANDING_OVER, started_at=now,
        mode=APP_RESTART,
    )  # fmt: skip
    sup.history.append(
        (now, f"upgrade {upgrade_id}: {app.id} ({sup.topology}) stops its queries; "
         f"{to_topology} starts from its checkpoints")
    )  # fmt: skip
    return [StopApp(app.id, now)]


def app_tick(sup: UpgradeHost, now: float) -> list:
    """The timed steps of an app's upgrade (the controller's every reconcile): the old version
    killed if it has not stopped within APP_STOP_WITHIN_S (the new one starts); the new version
    confirmed once each of its queries completed a batch, or rolled back when they have not
    within APP_FIRST_BATCHES_WITHIN_S of its script's start (or it has not started within
    APP_START_WITHIN_S of its launch). No upgrade of an app under way: nothing."""
    upgrade = sup.upgrade
    if upgrade is None or upgrade.mode != APP_RESTART or not upgrade.under_way:
        return []
    if upgrade.phase == HANDING_OVER:
        if now - upgrade.started_at < APP_STOP_WITHIN_S:
            return []
        why = f"{upgrade.blue} had not stopped {APP_STOP_WITHIN_S:g} s after it was asked: killed"
        return _start_new_version(sup, now, why)
    if upgrade.phase != VALIDATING:
        return []
    queries = upgrade.app_query_batches
    if queries and all(batches >= 1 for batches in queries.values()):
        why = (
            f"each query of the new version ({', '.join(sorted(queries))}) completed a batch "
            f"from the checkpoints, {now - upgrade.switched_at:.0f} s after its launch"
        )
        return confirm(sup, now, why)
    if upgrade.green_ready_at is None:
        if now - upgrade.switched_at < APP_START_WITHIN_S:
            return []
        why = f"the new version's app had not started {APP_START_WITHIN_S:g} s after its launch"
        return roll_back(sup, now, why)
    if now - upgrade.green_ready_at >= APP_FIRST_BATCHES_WITHIN_S:
        done = ", ".join(f"{name} {n}" for name, n in sorted(queries.items())) or "none started"
        why = (
            f"the new version's queries had not each completed a batch within "
            f"{APP_FIRST_BATCHES_WITHIN_S:g} s of its start (batches: {done})"
        )
        return roll_back(sup, now, why)
    return []


def _on_app_heartbeat(upgrade: BlueGreen, reported: dict, now: float) -> list | None:
    """A heartbeat of the app's replica while it is upgraded: the new version's start (its
    script runs) and batches per query count toward its validation; the stopping old
    version's news is none."""
    if upgrade.phase == VALIDATING:
        if reported.get("state") == RUNNING and upgrade.green_ready_at is None:
            upgrade.green_ready_at = now
        upgrade.green_batches = int(reported.get("batches") or 0)
        per_query = reported.get("query_batches") or {}
        upgrade.app_query_batches = {str(name): int(n) for name, n in per_query.items()}
        return None
    return []


def _on_app_exit(sup: UpgradeHost, now: float, reason: str) -> list:
    """The app's replica ended while upgraded: the old version stopping (as asked, or failing
    meanwhile) starts the new one; the new version failing before it was confirmed rolls back."""
    upgrade = sup.upgrade
    if upgrade.phase == HANDING_OVER:
        return _start_new_version(sup, now, f"{upgrade.blue} stopped ({reason})")
    return roll_back(sup, now, f"the new version failed before its first batches: {reason}")


def _start_new_version(sup: UpgradeHost, now: float, why: str) -> list:
    """Launch the new version on the app's checkpoints (a restart kills what is left of the old
    process first); its validation starts now."""
    upgrade = sup.upgrade
    actions = _restart_app(sup, upgrade.to_topology, upgrade.to_params, now, VALIDATING, why)
    upgrade.switched_at = now
    upgrade.green_batches_at_switch, upgrade.green_batches = 0, 0
    upgrade.app_query_batches, upgrade.green_ready_at = {}, None
    return actions


def _restart_app(
    sup: UpgradeHost, topology: str, params: tuple[str, ...], now: float, phase: str, why: str
) -> list:
    """Restart the app's replica from its own checkpoints running `topology`; the upgrade moves
    to `phase` (VALIDATING: the new version; ROLLED_BACK: the old one, ending it)."""
    upgrade = sup.upgrade
    app = sup.replicas[upgrade.blue]
    app.spec = replace(app.spec, topology=topology, params=tuple(params))
    relaunched(app, now)
    sup.topology, sup.params = topology, tuple(params)
    if phase == VALIDATING:
        upgrade.phase = VALIDATING
        sup.history.append(
            (now, f"upgrade {upgrade.upgrade_id}: {why}; {app.id} restarts as {topology}")
        )
    else:
        _end(sup, phase, now, why)
    return [RestartStage(app.spec)]
