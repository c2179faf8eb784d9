"""The host reserve against measured use (console/policy/reserve.py): admission, downgrade by
priority, restore with hysteresis. Pure, no database; expectations computed by hand below."""

from __future__ import annotations

import random

import pytest

from console.policy.actions import AddStandby, DropStandby, SetCheckpointInterval
from console.policy.config import PolicyConfig
from console.policy.placement import CycleInput, run_cycle
from console.policy.reserve import (
    CLAIM_FRESH_S,
    RESTORE_HOLD_S,
    RESTORE_MARGIN,
    HostLoad,
    StandbyClaim,
    admit_launch,
    fresh_claims,
    host_loads,
    plan_reserve,
)
from console.policy.resources import NodeCapacity
from console.policy.spares import SPARE_CPU, SPARE_MEM_MB, spares_wanted
from tests.policy.helpers import make_priority, make_sample

RESERVE = 0.2
NOW = 10_000.0
# Three agents on one 2-core, 8000 MiB machine (the demo's layout), one agent on a machine of
# its own.
HOSTS = {"n1": "boot:a", "n2": "boot:a", "n3": "boot:a", "solo": "boot:b"}


def load(cpu_used: float, mem_used: float = 1000.0, nodes=("n1", "n2", "n3")) -> HostLoad:
    return HostLoad("boot:a", tuple(nodes), 2.0, 8000.0, cpu_used, mem_used)


def claim(key, priority, node="n2", cpu=0.3, mem=500.0, primary="n1", downgraded_at=None):
    return StandbyClaim(key, priority, primary, node, cpu, mem, NOW, downgraded_at, "why")


def test_a_host_counts_its_capacity_once_and_its_agents_use_summed_and_averaged():
    history = {
        # newest first; only the newest 5 count
        "n1": [
            make_sample("n1", 2.0, used, 8000.0, 1000.0) for used in (0.6, 0.4, 0.5, 0.5, 0.5, 2.0)
        ],
        "n2": [make_sample("n2", 2.0, 0.7, 8000.0, 2000.0)] * 3,
        "n3": [make_sample("n3", 2.0, 0.3, 8000.0, 500.0)],
        "solo": [make_sample("solo", 4.0, 1.0, 16000.0, 4000.0)],
        "gone": [make_sample("gone", 2.0, 1.9, 8000.0, 100.0)],
    }  # fmt: skip
    loads = host_loads(
        history, {**HOSTS, "gone": "boot:a"}, alive={n: n != "gone" for n in history}
    )
    a = loads["boot:a"]
    assert a.nodes == ("n1", "n2", "n3")
    assert (a.cpu_total, a.mem_total) == (2.0, 8000.0)
    assert a.cpu_used == pytest.approx((0.6 + 0.4 + 0.5 * 3) / 5 + 0.7 + 0.3)  # 1.5
    assert a.mem_used == pytest.approx(1000.0 + 2000.0 + 500.0)
    assert a.free_shares() == pytest.approx((0.5 / 2.0, 4500.0 / 8000.0))
    assert loads["boot:b"].cpu_used == 1.0 and loads["boot:b"].cpu_total == 4.0
    # Counted over nodes (Da-Stream's cluster reserve) the same machine looks 75% idle:
    # 6 cores reported, 1.5 used.
    cluster_free = (3 * 2.0 - 1.5) / (3 * 2.0)
    assert cluster_free == 0.75 and a.free_shares()[0] == pytest.approx(0.25)


def test_a_host_whose_agents_report_shares_of_its_memory_is_judged_on_the_machine():
    # The demo and the benchmarks split a 24 GiB machine's memory between its three agents;
    # each reports all of its 2 cores. Counted on one share, 6 GB of stages left 25% free.
    history = {n: [make_sample(n, 2.0, 0.3, 8192.0, 2048.0)] for n in ("n1", "n2", "n3")}
    hosts = {n: "boot:a" for n in history}
    share = host_loads(history, hosts)["boot:a"]
    assert (share.mem_total, share.mem_used) == (8192.0, 6144.0)
    machine = host_loads(history, hosts, machines={"boot:a": (2.0, 24576.0)})["boot:a"]
    assert (machine.cpu_total, machine.mem_total, machine.mem_used) == (2.0, 24576.0, 6144.0)
    assert machine.free_shares() == pytest.approx((1.1 / 2.0, 0.75))
    # Another host's figures do not apply.
    assert host_loads(history, hosts, machines={"boot:z": (8.0, 1.0)})["boot:a"] == share


def test_a_node_without_a_host_is_a_host_of_its_own_and_use_never_exceeds_capacity():
    history = {"x": [make_sample("x", 2.0, 2.0)], "y": [make_sample("y", 2.0, 1.5)]}
    loads = host_loads(history, {"x": "h", "y": "h"})
    assert loads["h"].cpu_used == 2.0  # 3.5 measured over two agents, capped at the machine's 2
    assert set(host_loads(history, {})) == {"node:x", "node:y"}


def test_a_launch_is_refused_when_its_primaries_would_cross_a_hosts_reserve():
    loads = {"boot:a": load(1.2), "boot:b": HostLoad("boot:b", ("solo",), 4.0, 16000.0, 0.0, 0.0)}
    # 1.2 + 0.25 + 0.25 = 1.7 of 2 cores: 15% free < 20%.
    refusal = admit_launch(loads, HOSTS, {"n1": (0.25, 256.0), "n2": (0.25, 256.0)}, RESERVE)
    assert refusal == (
        "the reserve would not hold: its primaries (cpu 0.5, mem 512) would leave host boot:a: "
        "cpu 15% / mem 81% free (measured) vs reserve 20%"
    )
    # One primary (1.45: 27% free) fits, and so do both on the other machine.
    assert admit_launch(loads, HOSTS, {"n1": (0.25, 256.0)}, RESERVE) is None
    assert admit_launch(loads, HOSTS, {"solo": (0.5, 512.0)}, RESERVE) is None


def test_a_host_below_the_reserve_downgrades_its_standbys_lowest_priority_first_across_jobs():
    # 1.96 of 2 cores used (2% free). Dropping the lowest standby there (0.3) leaves 17%,
    # still below 20%; the next lowest (0.3) brings 32%: two go, the highest stays.
    claims = [
        claim("job1:count", 0.9),
        claim("job2:count", 0.5),
        claim("job3:count", 0.6),
        claim("job4:count", 0.1, node="solo", primary="n1"),  # another host: untouched
    ]
    random.Random(7).shuffle(claims)
    loads = {"boot:a": load(1.96), "boot:b": HostLoad("boot:b", ("solo",), 4.0, 16000.0, 0.5, 0)}
    plan = plan_reserve(loads, HOSTS, claims, RESERVE, NOW)
    assert list(plan.downgrade) == ["job2:count", "job3:count"]
    assert plan.downgrade["job2:count"].startswith(
        "reserve: host boot:a: cpu 2% / mem 88% free (measured) vs reserve 20%; the "
        "lowest-priority standby there (P_eff 0.500) runs checkpoint-only"
    )
    assert "cpu 17% / mem" in plan.downgrade["job3:count"]  # after the first drop
    assert plan.restore == {} and plan.held == {}
    assert plan.vetoed() == plan.downgrade


def test_memory_alone_can_cross_the_reserve():
    plan = plan_reserve(
        {"boot:a": load(0.2, 7000.0)}, HOSTS, [claim("j:s", 0.7, mem=800.0)], RESERVE, NOW
    )
    # 1000 MiB free of 8000 (12.5%); without the standby 1800 (22.5%).
    assert list(plan.downgrade) == ["j:s"]


def test_nothing_is_downgraded_on_a_host_at_the_reserve():
    # Exactly 20% free: the reserve holds (>=).
    assert (
        plan_reserve({"boot:a": load(1.6)}, HOSTS, [claim("j:s", 0.7)], RESERVE, NOW).downgrade
        == {}
    )


def test_a_downgraded_standby_is_restored_only_after_the_hold_and_with_the_margin():
    downgraded = claim("j:s", 0.7, node=None, cpu=0.3, downgraded_at=NOW - 30.0)
    # Room enough, but only 30 s after the downgrade.
    plan = plan_reserve({"boot:a": load(0.2)}, HOSTS, [downgraded], RESERVE, NOW)
    assert plan.restore == {}
    assert "restored no sooner than 60 s after" in plan.held["j:s"]
    later = NOW - RESTORE_HOLD_S
    downgraded = claim("j:s", 0.7, node=None, cpu=0.3, downgraded_at=later)
    # With it the host needs reserve + margin = 30% free: used + 0.3 <= 1.4, so used <= 1.1.
    limit = 2.0 * (1 - RESERVE - RESTORE_MARGIN) - 0.3
    assert limit == pytest.approx(1.1)
    held = plan_reserve({"boot:a": load(limit + 0.05)}, HOSTS, [downgraded], RESERVE, NOW)
    assert held.restore == {} and "still no room" in held.held["j:s"]
    # Between the reserve and the margin: no flapping back (it would fit the reserve alone).
    assert load(limit + 0.05).keeps_reserve(RESERVE, 0.3, 500.0)
    restored = plan_reserve({"boot:a": load(limit - 0.05)}, HOSTS, [downgraded], RESERVE, NOW)
    assert list(restored.restore) == ["j:s"] and restored.held == {}
    assert restored.restore["j:s"].startswith("room returned: host boot:a: cpu 32% / mem")
    assert restored.vetoed() == {}


def test_restores_go_highest_priority_first_and_each_is_charged_before_the_next():
    old = NOW - RESTORE_HOLD_S - 1
    claims = [
        claim("low:s", 0.45, node=None, cpu=0.4, downgraded_at=old),
        claim("high:s", 0.8, node=None, cpu=0.4, downgraded_at=old),
    ]
    # 0.5 used: with one (0.9) 55% free, with both (1.3) 35% free, both >= 30%: both return.
    assert set(plan_reserve({"boot:a": load(0.5)}, HOSTS, claims, RESERVE, NOW).restore) == {
        "low:s",
        "high:s",
    }
    # 0.7 used: with high (1.1) 45%; low then would leave (1.5) 25% < 30%: held.
    plan = plan_reserve({"boot:a": load(0.7)}, HOSTS, claims, RESERVE, NOW)
    assert list(plan.restore) == ["high:s"] and list(plan.held) == ["low:s"]


def test_a_standby_is_not_restored_on_a_host_holding_only_its_primarys_node():
    old = NOW - RESTORE_HOLD_S - 1
    only = {"boot:a": load(0.1, nodes=("n1",))}
    plan = plan_reserve(
        only, HOSTS, [claim("j:s", 0.9, node=None, downgraded_at=old)], RESERVE, NOW
    )
    assert plan.restore == {} and "still no room" in plan.held["j:s"]


def test_claims_no_cycle_renews_are_left_out():
    fresh, stale = claim("a:s", 0.5), claim("b:s", 0.5)
    stale = StandbyClaim(**{**stale.to_dict(), "at": NOW - CLAIM_FRESH_S - 1})
    assert fresh_claims([fresh, stale], NOW) == [fresh]
    assert StandbyClaim.from_dict(fresh.to_dict()) == fresh


def test_algorithm_2_drops_a_vetoed_standby_adds_none_and_says_why_in_the_interval():
    priorities = [make_priority("count", 0.9), make_priority("topn", 0.8)]
    samples = {n: [make_sample(n, 4.0, 0.5)] for n in ("n1", "n2", "n3")}
    veto = "reserve: host boot:a: cpu 5% free"
    state = CycleInput(
        priorities=priorities,
        primaries={"count": "n1", "topn": "n1"},
        standbys={"count": "n2"},
        samples=samples,
        alive=dict.fromkeys(samples, True),
        vetoed={"count": veto, "topn": veto},
    )
    actions = run_cycle(state, PolicyConfig()).actions
    assert DropStandby("count", "n2", veto) in actions
    assert not [a for a in actions if isinstance(a, AddStandby)]
    intervals = [a for a in actions if isinstance(a, SetCheckpointInterval)]
    assert sorted(a.operator for a in intervals) == ["count", "topn"]
    assert all(a.reason.startswith(f"no standby ({veto}); initial") for a in intervals)
    # Without the veto the same cycle keeps count's standby and gives topn one.
    actions = run_cycle(
        CycleInput(priorities, state.primaries, state.standbys, samples, state.alive),
        PolicyConfig(),
    ).actions
    assert [type(a) for a in actions] == [AddStandby]


def test_no_new_spare_where_its_host_would_cross_the_reserve_though_the_cluster_has_room():
    # Three agents on one 2-core host, each reporting 2 cores: the cluster of 6 has room, the
    # host (1.6 used of 2 by their processes) is at its reserve exactly; a spare's 0.02 cores
    # would cross it. The spare already running on n1 is kept.
    nodes = {
        n: NodeCapacity(n, 2.0, 8000.0, 2.0 - 1.6 / 3, 6000.0, 1.0) for n in ("n1", "n2", "n3")
    }
    hosts = {n: "boot:a" for n in nodes}
    loads = {"boot:a": HostLoad("boot:a", tuple(nodes), 2.0, 8000.0, 1.6, 2000.0)}
    config = PolicyConfig(warm_spares_per_node=2)
    assert spares_wanted(nodes, {}, config, hosts) == {"n1": 1, "n2": 1, "n3": 0}
    assert spares_wanted(nodes, {"n1": 1}, config, hosts, loads=loads) == {
        "n1": 1,
        "n2": 0,
        "n3": 0,
    }
    room = {"boot:a": HostLoad("boot:a", tuple(nodes), 2.0, 8000.0, 1.5, 2000.0)}
    assert room["boot:a"].keeps_reserve(RESERVE, 2 * SPARE_CPU, 2 * SPARE_MEM_MB)
    assert sum(spares_wanted(nodes, {}, config, hosts, loads=room).values()) == 2
