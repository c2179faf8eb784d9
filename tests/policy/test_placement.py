"""Algorithm 1 (initial placement) and Algorithm 2 (one cycle): hand examples and properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.policy.actions import (
    AddStandby,
    DropStandby,
    MoveStandby,
    SetCheckpointInterval,
    apply_standby_actions,
)
from console.policy.config import PolicyConfig
from console.policy.placement import (
    KEPT,
    MOVED,
    PLACED_AT_LAUNCH,
    CycleInput,
    StandbyVerdict,
    place_standbys,
    run_cycle,
)
from console.policy.resources import NodeCapacity, node_capacities
from tests.policy.helpers import make_priority, make_sample


def capacity(name, score, cpu_total, cpu_free, mem_total, mem_free, alive=True):
    return NodeCapacity(name, cpu_total, mem_total, cpu_free, mem_free, score, alive)


# Cluster: 10 cores, 10000 MiB; 6 cores and 6000 MiB free (60%). Reserve 20% = 2 cores, 2000 MiB.
NODES = {
    "a": capacity("a", 3.0, 4, 3, 4000, 3000),
    "b": capacity("b", 2.0, 4, 2, 4000, 2000),
    "c": capacity("c", 1.0, 2, 1, 2000, 1000),
}


def test_algorithm_1_by_hand():
    ops = [
        make_priority("w", 0.6, cpu=0.1, mem=100),
        make_priority("x", 0.9, cpu=1.5, mem=1500),
        make_priority("z", 0.7, cpu=1.5, mem=1500),
        make_priority("y", 0.8, cpu=1.5, mem=1500),
        make_priority("p", 0.95, active=False),
    ]
    primaries = {"x": "a", "y": "b", "z": "c", "w": "a", "p": "a"}
    result = place_standbys(ops, primaries, NODES, PolicyConfig())
    # p is passive: ignored. Order x(0.9), y(0.8), z(0.7), w(0.6).
    # x: free after 6-1.5 = 4.5 (45%) ok; best Q node that is not a: b (2 >= 1.5) -> b.
    # y: free after 4.5-1.5 = 3 (30%) ok; not b: a (3 >= 1.5) -> a.
    # z: free after 3-1.5 = 1.5 (15%) < 20% -> stop; z and w fall back (w would fit, but the
    #    paper stops at the first operator that would cross the reserve).
    assert result.standbys == {"x": "b", "y": "a"}
    assert [f.operator for f in result.fallbacks] == ["z", "w"]
    assert result.fallbacks[0].reason.startswith("reserve: a standby (cpu 1.5, mem 1500)")
    assert "cpu 15% / mem 15% free vs reserve 20%" in result.fallbacks[0].reason
    assert result.fallbacks[1].reason == "reserve reached at higher-priority operator z"
    assert result.to_dict()["standbys"] == {"x": "b", "y": "a"}


def test_algorithm_1_skips_an_operator_that_fits_nowhere_but_its_primary():
    # v needs 2.5 cores: only a (3 free) has room, and a runs v's primary -> v falls back alone.
    # u (0.5 cores) then gets a, the best node that is not its primary b.
    ops = [make_priority("v", 0.9, cpu=2.5, mem=100), make_priority("u", 0.5, mem=100)]
    result = place_standbys(ops, {"v": "a", "u": "b"}, NODES, PolicyConfig())
    assert result.standbys == {"u": "a"}
    assert result.fallbacks[0].operator == "v"
    assert result.fallbacks[0].reason == (
        "no alive node other than primary a has room for cpu 2.5, mem 100"
    )


def test_algorithm_1_ignores_dead_nodes_and_their_capacity():
    # With a dead, the cluster is b + c: 6 cores, 3 free (50%); y's standby may not go on a.
    nodes = {**NODES, "a": replace(NODES["a"], alive=False)}
    result = place_standbys([make_priority("y", 0.8, cpu=1.0)], {"y": "b"}, nodes, PolicyConfig())
    # free after: (3 - 1)/6 = 33% ok; not b, not dead a -> c (1 >= 1).
    assert result.standbys == {"y": "c"}


def sample(name, cpu_total, cpu_used, mem_total, mem_used):
    return make_sample(name, cpu_total, cpu_used, mem_total, mem_used)


def test_algorithm_2_by_hand():
    # Nodes (disk and network idle):
    #   a: 4 cores 1 used, 4000 MiB 1000 used -> Q = 0.4*0.75 + 0.3*0.75 + 0.15 + 0.15 = 0.825
    #   b: 4 cores 2 used, 4000 MiB 2000 used -> Q = 0.4*0.5 + 0.3*0.5 + 0.3 = 0.65
    #   c: dead.
    # Alive cluster: 8 cores (5 free, 62.5%), 8000 MiB (5000 free).
    state = CycleInput(
        priorities=[
            make_priority("x", 0.9, cpu=1.0, mem=1000),
            make_priority("y", 0.2, active=False),
            make_priority("z", 0.7),
            make_priority("w", 0.6),
            make_priority("v", 0.1, active=False, fr=0.2),
        ],
        primaries={"x": "a", "y": "b", "z": "b", "w": "a", "v": "a"},
        standbys={"x": "c", "y": "a", "z": "b"},
        samples={
            "a": [sample("a", 4, 1, 4000, 1000)],
            "b": [sample("b", 4, 2, 4000, 2000)],
            "c": [sample("c", 2, 1, 2000, 1000)],
        },
        alive={"a": True, "b": True, "c": False},
        faults={"v": 1},
        intervals={"v": 10.0},
    )
    actions = run_cycle(state, PolicyConfig()).actions
    # x: standby on dead c -> best node not a with room: b (2 free) -> move c->b (b: 1 free).
    # z: standby on its primary's node b -> give back 0.5 on b, best not b: a -> move b->a.
    # y: passive now -> drop from a.
    # reserve: free 2.5 (a) + 1.5 (b) = 4/8 = 50% >= 20%.
    # w: active without standby; free after 3.5/8 ok; best not a: b (1.5 free) -> add on b.
    # y (no standby, no interval yet): initial 60*0.5/(0.05*20) = 30 s.
    # v: fault: 10 - 10*0.2 = 8 s; its primary a is 25% cpu / 25% mem used: no other rule.
    assert [type(a) for a in actions] == [
        MoveStandby,
        MoveStandby,
        DropStandby,
        AddStandby,
        SetCheckpointInterval,
        SetCheckpointInterval,
    ]
    move_x, move_z, drop_y, add_w, set_y, set_v = actions
    assert (move_x.operator, move_x.from_node, move_x.to_node) == ("x", "c", "b")
    assert move_x.reason.startswith("its node is dead")
    assert (move_z.operator, move_z.from_node, move_z.to_node) == ("z", "b", "a")
    assert move_z.reason.startswith("it shares node b with its primary")
    assert (drop_y.operator, drop_y.node) == ("y", "a")
    assert drop_y.reason == "now passive: P_eff 0.200 <= threshold 0.4"
    assert (add_w.operator, add_w.node) == ("w", "b")
    assert (set_y.operator, set_y.seconds) == ("y", pytest.approx(30.0))
    assert set_y.reason.startswith("initial: 60*0.5/(0.05*20)")
    assert (set_v.operator, set_v.seconds) == ("v", pytest.approx(8.0))
    assert set_v.to_dict() == {
        "action": "set_checkpoint_interval",
        "operator": "v",
        "seconds": set_v.seconds,
        "reason": set_v.reason,
    }
    assert apply_standby_actions(state.standbys, actions) == {"x": "b", "z": "a", "w": "b"}


def test_algorithm_2_drops_lowest_priority_when_the_reserve_is_crossed():
    # a and b: 4 cores each, 3.5 used -> 1/8 = 12.5% free < 20%.
    # Drop z (lowest P_eff, 1 core on a): free (1.5 + 0.5)/8 = 25% -> x keeps its standby.
    state = CycleInput(
        priorities=[make_priority("x", 0.9, cpu=0.25), make_priority("z", 0.7, cpu=1.0)],
        primaries={"x": "a", "z": "b"},
        standbys={"x": "b", "z": "a"},
        samples={"a": [sample("a", 4, 3.5, 4000, 0)], "b": [sample("b", 4, 3.5, 4000, 0)]},
        alive={"a": True, "b": True},
    )
    actions = run_cycle(state, PolicyConfig()).actions
    assert actions[0] == DropStandby(
        "z", "a", "reserve crossed (cpu 12% / mem 100% free vs reserve 20%); lowest P_eff"
    )
    # z is not re-added in the same cycle; it now relies on checkpoints.
    assert [type(a) for a in actions] == [DropStandby, SetCheckpointInterval]
    assert actions[1].operator == "z"


def test_algorithm_2_leaves_a_healthy_state_alone():
    # One active operator with a standby on another alive node, intervals already at the max.
    state = CycleInput(
        priorities=[make_priority("x", 0.9), make_priority("s", 0.1, active=False)],
        primaries={"x": "a", "s": "a"},
        standbys={"x": "b"},
        samples={"a": [sample("a", 4, 1, 4000, 0)], "b": [sample("b", 4, 1, 4000, 0)]},
        alive={"a": True, "b": True},
        intervals={"s": 60.0},
    )
    assert run_cycle(state, PolicyConfig()).actions == []


# Q's full scale with the defaults (five samples, lambda 0.5):
# 1 + 0.6065306597 + 0.3678794412 + 0.2231301601 + 0.1353352832 = 2.3328755442; a node with one
# sample scores its instant score times this. The move margin is a fifth of it: 0.4665751088.
# A standby of make_priority's default demand (0.5 cores, 500 MiB) on a 4-core, 4000 MiB node
# lowers Q by 2.3328755442 * (0.4*0.5/4 + 0.3*500/4000) = 2.3328755442*0.0875 = 0.2041266101.


def idle_cluster(*names):
    """One idle sample (4 cores, 4000 MiB) per node: every node's Q is 2.3328755442."""
    return {name: [sample(name, 4, 0, 4000, 0)] for name in names}


def test_algorithm_1_at_launch_prefers_the_node_the_plan_leaves_idle():
    # Three idle nodes tie at Q 2.33. x's primary goes on a (0.5 cores, 500 MiB) and another
    # stage's primary on b (1 core, 1000 MiB); neither runs yet, so the samples do not show them.
    # With this standby: c 2.3328755442 - 0.2041266101 = 2.1287489341;
    #   b 2.3328755442 * (1 - 0.4*1.5/4 - 0.3*1500/4000) = 2.3328755442*0.7375 = 1.7204957139.
    # So c, not b (b won the tie by name when the plan's own primaries were not counted).
    nodes = node_capacities(idle_cluster("a", "b", "c"), PolicyConfig())
    x = make_priority("x", 0.9)
    planned = {"a": (0.5, 500.0), "b": (1.0, 1000.0)}
    result = place_standbys([x], {"x": "a"}, nodes, PolicyConfig(), planned)
    assert result.standbys == {"x": "c"}
    # Free after the plan: cpu 3.5 + 3 + 3.5 = 10 of 12, mem 10000 of 12000 (83%).
    assert result.verdicts["x"] == StandbyVerdict(
        "x",
        "c",
        PLACED_AT_LAUNCH,
        "placed at launch: c has the highest Q with this standby among alive nodes other than "
        "its primary's (a) with room (c 2.13, b 1.72)",
        "kept after the launch plan: cpu 83% / mem 83% free vs reserve 20%",
    )
    # Without the planned primaries b and c tie and the name decides.
    unplanned = place_standbys([x], {"x": "a"}, nodes, PolicyConfig())
    assert unplanned.standbys == {"x": "b"}
    assert unplanned.verdicts["x"].reason.endswith("(b 2.13, c 2.13; a tie, broken by name)")


def test_algorithm_1_spreads_standbys_placed_in_the_same_run():
    # Idle a, b, c; x and y both have their primary on a (charged: 1 core, 1000 MiB). x first
    # (higher P_eff): b and c tie at 2.1287489341 -> b by name. y: b now runs x's standby,
    # 2.1287489341 - 0.2041266101 = 1.9246223240 with y's too, so c (2.1287489341) wins.
    nodes = node_capacities(idle_cluster("a", "b", "c"), PolicyConfig())
    ops = [make_priority("x", 0.9), make_priority("y", 0.8)]
    result = place_standbys(ops, {"x": "a", "y": "a"}, nodes, PolicyConfig(), {"a": (1.0, 1000.0)})
    assert result.standbys == {"x": "b", "y": "c"}
    assert result.verdicts["y"].reason.endswith("(c 2.13, b 1.92)")


def moved_away_state(age=None):
    """x's primary on a (busy), its standby on b (busy), c idle. One sample each:
    a: cpu 3/4 used, mem 2000/4000: 0.4*0.25 + 0.3*0.5 + 0.3 = 0.55 -> Q 1.2830815493
    b: cpu 3/4, mem 1000/4000: 0.4*0.25 + 0.3*0.75 + 0.3 = 0.625 -> Q 1.4580472151
    c: idle -> Q 2.3328755442; with x's standby 2.1287489341."""
    return CycleInput(
        priorities=[make_priority("x", 0.9)],
        primaries={"x": "a"},
        standbys={"x": "b"},
        samples={
            "a": [sample("a", 4, 3, 4000, 2000)],
            "b": [sample("b", 4, 3, 4000, 1000)],
            "c": [sample("c", 4, 0, 4000, 0)],
        },
        alive={"a": True, "b": True, "c": True},
        standby_age_s={} if age is None else {"x": age},
    )


def test_algorithm_2_moves_a_standby_to_a_clearly_better_node():
    # c with the standby 2.1287489341 > b's 1.4580472151 + margin 0.4665751088 = 1.9246223239.
    result = run_cycle(moved_away_state(age=120.0), PolicyConfig())
    reason = "Q 2.13 on c with this standby vs 1.46 on b: more than the move margin 0.47 higher"
    assert result.actions == [MoveStandby("x", "b", "c", reason)]
    # Free after: cpu a 1 + b 1.5 + c 3.5 = 6 of 12 (50%); mem 2000 + 3500 + 3500 = 9000 (75%).
    assert result.verdicts == {
        "x": StandbyVerdict(
            "x",
            "c",
            MOVED,
            f"moved from b: {reason}",
            "kept after this cycle: cpu 50% / mem 75% free vs reserve 20%",
        )
    }

    # The next cycle, once the samples show the move (b lost and c took 0.5 cores and 500 MiB),
    # does not move it back: b would have 0.4*0.375 + 0.3*0.875 + 0.3 = 0.7125 -> Q 1.6621738252,
    # 1.4580472151 with the standby, below c's 2.1287489341 (0.4*0.875 + 0.3*0.875 + 0.3).
    after = replace(
        moved_away_state(age=120.0),
        standbys={"x": "c"},
        samples={
            "a": [sample("a", 4, 3, 4000, 2000)],
            "b": [sample("b", 4, 2.5, 4000, 500)],
            "c": [sample("c", 4, 0.5, 4000, 500)],
        },
    )
    again = run_cycle(after, PolicyConfig())
    assert again.actions == []
    assert again.verdicts["x"].rule == KEPT
    assert again.verdicts["x"].reason == (
        "kept: the best other node, b would have Q 1.46 with this standby vs 2.13 on c, not "
        "more than the move margin 0.47 higher"
    )


def test_algorithm_2_does_not_chase_the_idleness_its_own_standby_takes():
    # b's only load is x's standby: 0.4*0.875 + 0.3*0.875 + 0.3 = 0.9125 -> Q 2.1287489341; c is
    # idle (2.33) but would be 2.1287489341 with the standby: no gain, no move.
    state = replace(
        moved_away_state(age=120.0),
        samples={
            "a": [sample("a", 4, 3, 4000, 2000)],
            "b": [sample("b", 4, 0.5, 4000, 500)],
            "c": [sample("c", 4, 0, 4000, 0)],
        },
    )
    result = run_cycle(state, PolicyConfig())
    assert result.actions == []
    assert result.verdicts["x"].reason == (
        "kept: the best other node, c would have Q 2.13 with this standby vs 2.13 on b, not "
        "more than the move margin 0.47 higher"
    )


def test_algorithm_2_lets_a_new_standby_settle_before_judging_a_move():
    result = run_cycle(moved_away_state(age=20.0), PolicyConfig())
    assert result.actions == []
    assert result.verdicts["x"].reason == (
        "kept: started 20 s ago; a standby runs 120 s on its node before a move is considered"
    )


def test_algorithm_2_keeps_a_standby_no_other_node_can_take():
    # Only a (the primary's) and b: nowhere else to go.
    state = replace(
        moved_away_state(),
        samples={"a": [sample("a", 4, 3, 4000, 2000)], "b": [sample("b", 4, 2, 4000, 1000)]},
        alive={"a": True, "b": True},
    )
    result = run_cycle(state, PolicyConfig())
    assert result.actions == []
    assert result.verdicts["x"].reason == (
        "kept: no alive node besides b and its primary's (a) has room for cpu 0.5, mem 500"
    )


def test_apply_standby_actions_refuses_stale_actions():
    with pytest.raises(ValueError):
        apply_standby_actions({"x": "a"}, [DropStandby("x", "b", "stale")])
    with pytest.raises(ValueError):
        apply_standby_actions({"x": "a"}, [AddStandby("x", "b", "twice")])


# ---------------------------------------------------------------- properties

NODE_NAMES = ["n0", "n1", "n2", "n3", "n4"]


@st.composite
def clusters(draw):
    """Alive-or-dead nodes with random load, operators with random demand and priority."""
    n_nodes = draw(st.integers(2, 5))
    names = NODE_NAMES[:n_nodes]
    samples = {}
    for name in names:
        cpu_total = draw(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
        mem_total = draw(st.sampled_from([1000.0, 4000.0, 8000.0]))
        cpu_used = draw(st.floats(0.0, 1.0)) * cpu_total
        mem_used = draw(st.floats(0.0, 1.0)) * mem_total
        samples[name] = [make_sample(name, cpu_total, cpu_used, mem_total, mem_used)]
    alive = {name: draw(st.booleans()) for name in names}
    ops = []
    for i in range(draw(st.integers(1, 8))):
        ops.append(
            make_priority(
                f"op{i}",
                draw(st.floats(0.0, 1.0)),
                cpu=draw(st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0])),
                mem=draw(st.sampled_from([100.0, 500.0, 1000.0])),
                active=draw(st.booleans()),
            )
        )
    primaries = {op.name: draw(st.sampled_from(names)) for op in ops}
    reserve = draw(st.floats(0.0, 0.9))
    return samples, alive, ops, primaries, reserve


def free_fractions(free_cpu, free_mem, total_cpu, total_mem):
    return sum(free_cpu.values()) / total_cpu, sum(free_mem.values()) / total_mem


@settings(max_examples=300, deadline=None)
@given(clusters(), st.booleans())
def test_algorithm_1_keeps_the_reserve_and_avoids_primaries(cluster, launching):
    samples, alive, ops, primaries, reserve = cluster
    config = replace(PolicyConfig(), resource_reserve=reserve)
    nodes = {
        n: capacity(n, 1.0, s[0].cpu_total, s[0].cpu_free, s[0].mem_total, s[0].mem_free, alive[n])
        for n, s in samples.items()
    }
    # At a launch the primaries are charged to their nodes first (planned).
    planned = {n: (0.0, 0.0) for n in samples}
    for op in ops:
        cpu, mem = planned[primaries[op.name]]
        planned[primaries[op.name]] = (cpu + op.cpu, mem + op.mem)
    result = place_standbys(ops, primaries, nodes, config, planned if launching else None)
    demand = {op.name: op for op in ops}
    free_cpu = {n: c.cpu_free for n, c in nodes.items() if c.alive}
    free_mem = {n: c.mem_free for n, c in nodes.items() if c.alive}
    if launching:
        for n in free_cpu:
            free_cpu[n] -= planned[n][0]
            free_mem[n] -= planned[n][1]
    for op_name, node in result.standbys.items():
        assert node != primaries[op_name]
        assert node in free_cpu, "standby on a dead node"
        assert demand[op_name].mode == "active"
        free_cpu[node] -= demand[op_name].cpu
        free_mem[node] -= demand[op_name].mem
    hosts = set(result.standbys.values())
    assert all(free_cpu[n] >= -1e-9 for n in hosts), "a node was overcommitted"
    assert all(free_mem[n] >= -1e-9 for n in hosts), "a node was overcommitted"
    if result.standbys:
        total_cpu = sum(nodes[n].cpu_total for n in free_cpu)
        total_mem = sum(nodes[n].mem_total for n in free_mem)
        cpu, mem = free_fractions(free_cpu, free_mem, total_cpu, total_mem)
        assert cpu >= reserve - 1e-9 and mem >= reserve - 1e-9
    placed_or_fallen = set(result.standbys) | {f.operator for f in result.fallbacks}
    assert placed_or_fallen == {op.name for op in ops if op.mode == "active"}
    assert set(result.verdicts) == set(result.standbys)
    assert all(v.node == result.standbys[op] for op, v in result.verdicts.items())


@settings(max_examples=300, deadline=None)
@given(clusters(), st.data())
def test_algorithm_2_keeps_the_reserve_and_avoids_primaries(cluster, data):
    samples, alive, ops, primaries, reserve = cluster
    config = replace(PolicyConfig(), resource_reserve=reserve)
    # Some operators already have standbys anywhere, including dead nodes and their primary's.
    standbys = {
        op.name: data.draw(st.sampled_from(list(samples))) for op in ops if data.draw(st.booleans())
    }
    state = CycleInput(ops, primaries, standbys, samples, alive)
    result = run_cycle(state, config)
    actions = result.actions
    after = apply_standby_actions(standbys, actions)
    # A verdict for exactly the standbys left, on the node each is left on.
    assert {op: v.node for op, v in result.verdicts.items()} == after

    for op_name, node in after.items():
        assert node != primaries[op_name], f"{op_name}'s standby is on its primary's node"
        assert alive[node], f"{op_name}'s standby is on dead node {node}"

    # Resource accounting: measured free on alive nodes, minus what was added, plus what was
    # released on alive nodes (capped at the node's total, as the measurement may not have
    # charged the whole estimate).
    demand = {op.name: op for op in ops}
    live = [n for n in samples if alive[n]]
    free_cpu = {n: samples[n][0].cpu_free for n in live}
    free_mem = {n: samples[n][0].mem_free for n in live}

    def release(node, op_name):
        if node in free_cpu:
            free_cpu[node] = min(samples[node][0].cpu_total, free_cpu[node] + demand[op_name].cpu)
            free_mem[node] = min(samples[node][0].mem_total, free_mem[node] + demand[op_name].mem)

    def take(node, op_name):
        free_cpu[node] -= demand[op_name].cpu
        free_mem[node] -= demand[op_name].mem

    for action in actions:
        if isinstance(action, DropStandby):
            release(action.node, action.operator)
        elif isinstance(action, MoveStandby):
            release(action.from_node, action.operator)
    for action in actions:
        if isinstance(action, AddStandby):
            take(action.node, action.operator)
        elif isinstance(action, MoveStandby):
            take(action.to_node, action.operator)

    total_cpu = sum(samples[n][0].cpu_total for n in live)
    total_mem = sum(samples[n][0].mem_total for n in live)
    if live and after:
        cpu, mem = free_fractions(free_cpu, free_mem, total_cpu, total_mem)
        assert cpu >= reserve - 1e-9 and mem >= reserve - 1e-9
    for action in actions:
        if isinstance(action, AddStandby | MoveStandby):
            assert demand[action.operator].mode == "active"
