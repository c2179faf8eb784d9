"""How many warm spares each node keeps: a pure rule, no Django.

A warm spare is a pre-started stage process (Python, JVM and SparkSession up, no query) that a
restart or a new standby takes over instead of starting cold. Spares cost memory, so they count
against the same resource reserve as standbys (see placement.py): nodes are filled by Q
(best first), one spare at a time, up to the policy's `warm_spares_per_node`, while the
cluster's free memory and cpu stay above the reserve. Spares already running are part of the
measured usage, so only spares beyond the idle ones are charged. Nodes that share a host
(several agents on one machine, as in the demo and the benchmarks) share that host's
`warm_spares_per_node`: their spares draw on one machine's memory, and the supervisor puts a
new standby where an idle spare is (`standby_node_preference`), so one spare placed where it
covers the next fault serves them all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from console.policy.config import PolicyConfig
from console.policy.reserve import HostLoad
from console.policy.reserve import host_of as host_named
from console.policy.resources import NodeCapacity

# The measured footprint of an idle spare on this machine's Spark 4 defaults (driver JVM with a
# 1 GB heap ceiling, one warm Python worker); cpu is near zero while it waits.
SPARE_MEM_MB = 600.0
SPARE_CPU = 0.02


def spares_wanted(
    capacities: Mapping[str, NodeCapacity],
    current: Mapping[str, int],
    config: PolicyConfig,
    hosts: Mapping[str, str] | None = None,
    cover: Mapping[str, int] | None = None,
    measured: Mapping[str, int] | None = None,
    asked: Mapping[str, int] | None = None,
    loads: Mapping[str, HostLoad] | None = None,
) -> dict[str, int]:
    """Spares wanted per alive node.

    `current`: the spares each node holds now (idle or warming up), kept where they are so
    that a spare does not move between nodes as Q or the job whose cycle runs changes.
    `asked`: spares a recent cycle asked nodes for that their agents have not started yet,
    kept where they are after `current` (a host over its limit keeps its started spares first).
    `measured`: those of them whose memory the measured usage already
    includes, the idle ones (default: all of `current`); the others are charged against the
    reserve. `hosts`: the host each node's agent runs on (a node missing from it is a host of
    its own); the nodes of one host share its `warm_spares_per_node`. `cover`: how many of the
    job's stages a spare on each node would cover (`stages_covered`). A host over its limit
    keeps the spares that cover most, then those on the best Q; a new spare goes to the host
    and node with the fewest, then where it covers most, then by Q. (While a stage is
    re-protected the agents start none of them: spark_runtime.spare.hold_spare_refills.)
    `loads`: each host's measured use (console.policy.reserve.host_loads, keyed like `hosts`
    names them); given, a new spare must leave its own host at the reserve, not only the
    cluster: several agents on one machine each report its cores, and counted over them the
    cluster looks idle while the machine is saturated."""
    alive = [c for c in capacities.values() if c.alive]
    cpu_total = sum(c.cpu_total for c in alive)
    mem_total = sum(c.mem_total for c in alive)
    if cpu_total <= 0 or mem_total <= 0:
        return {}
    cpu_free = sum(c.cpu_free for c in alive)
    mem_free = sum(c.mem_free for c in alive)
    limit = config.warm_spares_per_node
    measured = current if measured is None else measured
    host_of = {c.name: host_named(c.name, hosts or {}) for c in alive}

    def preference(c: NodeCapacity) -> tuple:
        return -(cover or {}).get(c.name, 0), -c.score, c.name

    on_host: Counter[str] = Counter()
    wanted = {}
    ranked = sorted(alive, key=preference)
    for c in ranked:
        wanted[c.name] = min(current.get(c.name, 0), limit - on_host[host_of[c.name]])
        on_host[host_of[c.name]] += wanted[c.name]
    for c in ranked:
        pending = max(0, (asked or {}).get(c.name, 0) - wanted[c.name])
        kept = min(pending, limit - on_host[host_of[c.name]])
        wanted[c.name] += kept
        on_host[host_of[c.name]] += kept

    def keeps_reserve(extra: int) -> bool:
        return (cpu_free - extra * SPARE_CPU) / cpu_total >= config.resource_reserve and (
            mem_free - extra * SPARE_MEM_MB
        ) / mem_total >= config.resource_reserve

    # Spares kept but not idle yet (warming up, or asked for) are not in the measured usage.
    added = sum(max(0, wanted[c.name] - measured.get(c.name, 0)) for c in alive)
    added_on: Counter[str] = Counter()
    for c in alive:
        added_on[host_of[c.name]] += max(0, wanted[c.name] - measured.get(c.name, 0))

    def host_keeps_reserve(c: NodeCapacity) -> bool:
        load = (loads or {}).get(host_of[c.name])
        if load is None:
            return True
        extra = added_on[host_of[c.name]] + 1
        return load.keeps_reserve(config.resource_reserve, extra * SPARE_CPU, extra * SPARE_MEM_MB)

    while True:
        short = [c for c in alive if on_host[host_of[c.name]] < limit and host_keeps_reserve(c)]
        if not short or not keeps_reserve(added + 1):
            break
        # Round robin: the host, then the node, with the fewest spares first.
        node = min(short, key=lambda c: (on_host[host_of[c.name]], wanted[c.name], preference(c)))
        wanted[node.name] += 1
        on_host[host_of[node.name]] += 1
        if wanted[node.name] > measured.get(node.name, 0):
            added += 1
            added_on[host_of[node.name]] += 1
    return wanted


def spare_needed(
    placements: Mapping[str, tuple[str | None, str | None]],
    idle_spares: Mapping[str, int],
) -> bool:
    """Whether a job lacks a warm spare where its next fault would start a process, so that a
    spare warming up should have the normal CPU priority rather than the lowest.

    `placements`: (primary node or None, standby node or None) per stage; `idle_spares`: idle
    spares per alive node. Every stage must be covered:
    - with a standby, by an idle spare on a node that holds neither replica: after either one
      fails, the new standby goes to such a node (`standby_node_preference` puts the ones with
      an idle spare first); one on the standby's node does not count, that node is the new
      primary's after a promotion;
    - with a primary only, by an idle spare on its node: a failed primary restarts there;
    - with neither (being restarted), by an idle spare anywhere.
    Spares are counted per node, not per stage: one idle spare covers every stage it is off,
    although a node fault that fails two of them needs two."""

    def idle_on(nodes) -> bool:
        return any(idle_spares.get(node, 0) > 0 for node in nodes)

    def covered(primary: str | None, standby: str | None) -> bool:
        if standby:
            return idle_on(set(idle_spares) - {primary, standby})
        if primary:
            return idle_on([primary])
        return idle_on(idle_spares)

    return not all(covered(*nodes) for nodes in placements.values())


def stages_covered(
    placements: Mapping[str, tuple[str | None, str | None]], nodes: Collection[str]
) -> dict[str, int]:
    """For each of `nodes`, how many stages of `placements` one idle spare there would cover
    (as `spare_needed` counts cover): those with a standby it is off both replicas of, those
    without one whose primary's node it is on, and those being restarted."""
    return {
        node: sum(not spare_needed({stage: at}, {node: 1}) for stage, at in placements.items())
        for node in nodes
    }


def standby_node_preference(
    ranked: Sequence[str], spares: Mapping[str, Mapping[str, int]]
) -> list[str]:
    """Where a standby the supervisor starts on its own (after a promotion) should go, best
    first: nodes with an idle warm spare (the standby skips the JVM and session start there),
    then nodes with a spare still warming up (`starting`: the standby takes it over, a head
    start on a cold process), then the others, each group in `ranked` order (alive nodes by Q,
    best first). `spares`: per node, how many spares are in each state."""

    def rank(node: str) -> tuple[bool, bool]:
        counts = spares.get(node, {})
        return counts.get("idle", 0) == 0, counts.get("starting", 0) == 0

    return sorted(ranked, key=rank)
