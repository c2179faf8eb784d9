"""The resource reserve per host, held against measured usage: admission, downgrade, restore.

Da-Stream's reserve (placement.py) is a share of the cluster's cores and memory that must stay
free after a standby is placed. Counted over nodes, it does not hold where several node agents
share one machine (the demo, the benchmarks, compose): each agent reports the machine's cores
as its own, so three agents on 2 cores make a "cluster" of 6 cores that is never below the
reserve while the machine is saturated. This module counts per host (the `host` an agent's
heartbeat names, infra.node_metrics.host_identity): the host's capacity once, its measured use
the sum of what its agents measured (in the agents' default `processes` scope each one counts
its own stage processes), averaged over the newest samples so one noisy second decides nothing.

What it decides, all pure (the controller carries it out, console/services/control/):
- `admit_launch`: a launch whose primaries would leave a host below the reserve is refused;
- `plan_reserve`: on a host below the reserve, running standbys are downgraded to
  checkpoint-only, lowest priority (P_eff) first across all jobs, until the host is back at
  the reserve; a downgraded standby is restored, highest priority first, once a host where it
  may run has room for it with the reserve plus `RESTORE_MARGIN` left, and not before
  `RESTORE_HOLD_S` after its downgrade: the margin and the hold are the hysteresis that keeps a
  standby from being dropped and started again every cycle as the measurements move.
Spares use `HostLoad.keeps_reserve` too (console.policy.spares).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from console.policy.resources import NodeSample

# Samples per node averaged into a host's measured use: the agents publish one a second, so
# five seconds, about one policy cycle.
RESERVE_SAMPLES = 5
# A downgraded standby comes back only if its host keeps this much more than the reserve free
# with it: a standby's measured cost (about half a core for a 20 lines/s stage) moves a 2-core
# host's free share by 25%, so a restore at exactly the reserve would cross it again at once.
RESTORE_MARGIN = 0.1
# ... and only this long after it was downgraded: the measurements must show the room lasting.
RESTORE_HOLD_S = 60.0
# Claims a job's cycle has not renewed within this long belong to a job no longer supervised.
CLAIM_FRESH_S = 30.0
# Shares within this of the reserve are at it: agents round their figures to a thousandth, and
# a float difference must not drop a standby from a host that is exactly at its reserve.
SHARE_EPSILON = 1e-9


@dataclass(frozen=True)
class HostLoad:
    """One host's capacity and measured use: cores and MiB, summed over its alive nodes' agents."""

    host: str
    nodes: tuple[str, ...]
    cpu_total: float
    mem_total: float
    cpu_used: float
    mem_used: float

    def free_shares(self, cpu: float = 0.0, mem: float = 0.0) -> tuple[float, float]:
        """Free cpu and memory shares of the host once `cpu` and `mem` more are used
        (negative: freed); 0 for a host without capacity."""
        if self.cpu_total <= 0 or self.mem_total <= 0:
            return 0.0, 0.0
        return (
            (self.cpu_total - self.cpu_used - cpu) / self.cpu_total,
            (self.mem_total - self.mem_used - mem) / self.mem_total,
        )

    def keeps_reserve(self, reserve: float, cpu: float = 0.0, mem: float = 0.0) -> bool:
        """Whether both free shares stay >= `reserve` once `cpu` and `mem` more are used."""
        free_cpu, free_mem = self.free_shares(cpu, mem)
        return free_cpu >= reserve - SHARE_EPSILON and free_mem >= reserve - SHARE_EPSILON

    def describe(self, reserve: float, cpu: float = 0.0, mem: float = 0.0) -> str:
        """ "host h: cpu 12% / mem 40% free (measured) vs reserve 20%", for reasons."""
        free_cpu, free_mem = self.free_shares(cpu, mem)
        return (
            f"host {self.host}: cpu {free_cpu:.0%} / mem {free_mem:.0%} free (measured) "
            f"vs reserve {reserve:.0%}"
        )

    def with_use(self, cpu: float, mem: float) -> HostLoad:
        """The same host with `cpu` and `mem` more in use."""
        return HostLoad(
            self.host,
            self.nodes,
            self.cpu_total,
            self.mem_total,
            self.cpu_used + cpu,
            self.mem_used + mem,
        )

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


def host_of(node: str, hosts: Mapping[str, str]) -> str:
    """The host a node's agent runs on; a node whose agent names none is a host of its own."""
    return hosts.get(node) or f"node:{node}"


def host_loads(
    history: Mapping[str, Sequence[NodeSample]],
    hosts: Mapping[str, str],
    alive: Mapping[str, bool] | None = None,
    window: int = RESERVE_SAMPLES,
    machines: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, HostLoad]:
    """HostLoad per host from its alive nodes' samples (newest first): capacity is the
    machine's (`machines`: host -> (cores, MiB) its agents measured), else the largest total
    any of its agents reports (they report the same machine, or each a share of its memory: the
    demo splits it); use is the sum over its agents of the mean of their newest `window`
    samples, at most the capacity. Nodes without samples are left out; without `alive` every
    node counts as alive."""
    grouped: dict[str, list[tuple[str, Sequence[NodeSample]]]] = {}
    for name, samples in sorted(history.items()):
        if samples and (alive is None or alive.get(name, False)):
            grouped.setdefault(host_of(name, hosts), []).append((name, samples[:window]))
    loads = {}
    for host, members in grouped.items():
        cpu_total = max(samples[0].cpu_total for _, samples in members)
        mem_total = max(samples[0].mem_total for _, samples in members)
        if machines and host in machines:
            cpu_total, mem_total = machines[host]
        cpu_used = sum(sum(s.cpu_used for s in samples) / len(samples) for _, samples in members)
        mem_used = sum(sum(s.mem_used for s in samples) / len(samples) for _, samples in members)
        loads[host] = HostLoad(
            host,
            tuple(name for name, _ in members),
            cpu_total,
            mem_total,
            min(cpu_used, cpu_total),
            min(mem_used, mem_total),
        )
    return loads


def admit_launch(
    loads: Mapping[str, HostLoad],
    hosts: Mapping[str, str],
    planned: Mapping[str, tuple[float, float]],
    reserve: float,
) -> str | None:
    """None if the launch's primaries (`planned`: node -> (cpu, mem) it will start there) leave
    every host at or above the reserve, else why not (the first host that would cross it, by
    name). A primary cannot be downgraded: without it the job does not run."""
    charged: dict[str, tuple[float, float]] = {}
    for node, (cpu, mem) in planned.items():
        host = host_of(node, hosts)
        before = charged.get(host, (0.0, 0.0))
        charged[host] = (before[0] + cpu, before[1] + mem)
    for host, (cpu, mem) in sorted(charged.items()):
        load = loads.get(host)
        if load is not None and not load.keeps_reserve(reserve, cpu, mem):
            return (
                f"the reserve would not hold: its primaries (cpu {cpu:g}, mem {mem:g}) would "
                f"leave {load.describe(reserve, cpu, mem)}"
            )
    return None


@dataclass(frozen=True)
class StandbyClaim:
    """A stage that its policy gives a hot standby, as its job's cycle publishes it.

    `key`: "job:stage"; `priority`: the P_eff of the stage's highest-priority active operator;
    `primary_node`: where its primary runs; `node`: where its standby runs (None while it has
    none); `cpu`/`mem`: what a standby of the stage costs (its operators' measured demand);
    `downgraded_at`/`reason`: when and why the reserve took its standby (None: it is not
    downgraded); `at`: when its cycle published it."""

    key: str
    priority: float
    primary_node: str | None
    node: str | None
    cpu: float
    mem: float
    at: float
    downgraded_at: float | None = None
    reason: str = ""

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> StandbyClaim:
        """The claim `to_dict` wrote."""
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


@dataclass(frozen=True)
class ReservePlan:
    """What the reserve decides this cycle, claim key -> reason: standbys to downgrade now,
    downgraded ones to restore, and downgraded ones that stay so (`held`)."""

    downgrade: dict[str, str]
    restore: dict[str, str]
    held: dict[str, str]

    def vetoed(self) -> dict[str, str]:
        """Claims that must have no standby after this cycle, with why."""
        return {**self.held, **self.downgrade}


def plan_reserve(
    loads: Mapping[str, HostLoad],
    hosts: Mapping[str, str],
    claims: Sequence[StandbyClaim],
    reserve: float,
    now: float,
) -> ReservePlan:
    """Downgrade and restore standbys so every host keeps the reserve (module docstring).

    1. Each host below the reserve gives up the standbys running on its nodes, lowest priority
       first (ties by key), each credited with its cost, until it is back at the reserve.
    2. Downgraded claims, highest priority first: restored where a host with an alive node
       other than the claim's primary's has room for it with reserve + RESTORE_MARGIN free,
       RESTORE_HOLD_S after the downgrade; each restore is charged to its host, so the next
       claim sees what is left. The others stay downgraded, saying why.
    Deterministic: every job's cycle computes the same plan from the same claims and loads and
    carries out its own part, so priorities decide across jobs, not the order cycles run in."""
    loads = dict(loads)
    downgrade: dict[str, str] = {}
    running = [c for c in claims if c.node is not None and c.downgraded_at is None]
    for host in sorted(loads):
        on_host = sorted(
            (c for c in running if host_of(c.node, hosts) == host),
            key=lambda c: (c.priority, c.key),
        )
        for claim in on_host:
            if loads[host].keeps_reserve(reserve):
                break
            downgrade[claim.key] = (
                f"reserve: {loads[host].describe(reserve)}; the lowest-priority standby there "
                f"(P_eff {claim.priority:.3f}) runs checkpoint-only"
            )
            loads[host] = loads[host].with_use(-claim.cpu, -claim.mem)
    restore: dict[str, str] = {}
    held: dict[str, str] = {}
    waiting = sorted(
        (c for c in claims if c.downgraded_at is not None),
        key=lambda c: (-c.priority, c.key),
    )
    for claim in waiting:
        since = now - claim.downgraded_at
        if since < RESTORE_HOLD_S:
            held[claim.key] = (
                f"{claim.reason} (downgraded {since:.0f} s ago; restored no sooner than "
                f"{RESTORE_HOLD_S:g} s after)"
            )
            continue
        room = [
            load
            for host, load in sorted(loads.items())
            if any(node != claim.primary_node for node in load.nodes)
            and load.keeps_reserve(reserve + RESTORE_MARGIN, claim.cpu, claim.mem)
        ]
        if not room:
            best = max(loads.values(), key=lambda load: load.free_shares()[0], default=None)
            where = best.describe(reserve) if best else "no alive host"
            held[claim.key] = (
                f"{claim.reason}; still no room: a standby (cpu {claim.cpu:g}, mem "
                f"{claim.mem:g}) needs the reserve plus {RESTORE_MARGIN:.0%} free after it "
                f"({where})"
            )
            continue
        target = room[0]
        restore[claim.key] = (
            f"room returned: {target.describe(reserve, claim.cpu, claim.mem)} with this "
            f"standby, at least the reserve plus {RESTORE_MARGIN:.0%}"
        )
        loads[target.host] = target.with_use(claim.cpu, claim.mem)
    return ReservePlan(downgrade, restore, held)


def fresh_claims(claims: Sequence[StandbyClaim], now: float) -> list[StandbyClaim]:
    """The claims renewed within CLAIM_FRESH_S (the others' jobs are no longer supervised)."""
    return [c for c in claims if now - c.at <= CLAIM_FRESH_S]
