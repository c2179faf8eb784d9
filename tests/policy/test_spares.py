"""How many warm spares each node keeps (console/policy/spares.py): pure, no database."""

from __future__ import annotations

from console.policy.config import PolicyConfig
from console.policy.resources import NodeCapacity
from console.policy.spares import (
    SPARE_MEM_MB,
    spare_needed,
    spares_wanted,
    stages_covered,
    standby_node_preference,
)


def node(name, score, mem_free=8000.0, alive=True):
    return NodeCapacity(name, 2.0, 8000.0, 1.8, mem_free, score, alive)


def test_every_alive_node_gets_the_configured_spares_when_there_is_room():
    nodes = {n.name: n for n in (node("a", 2.0), node("b", 1.0), node("dead", 3.0, alive=False))}
    config = PolicyConfig(warm_spares_per_node=2)
    assert spares_wanted(nodes, {}, config) == {"a": 2, "b": 2}


def test_spares_stop_at_the_reserve_best_q_first_and_running_ones_are_not_charged_again():
    # 16,000 MB in all, reserve 20% = 3,200 MB must stay free. 4,400 MB free leaves room for
    # two new spares of 600 MB (4,400 - 1,200 = 3,200), not three.
    nodes = {"a": node("a", 2.0, 2200.0), "b": node("b", 1.0, 2200.0)}
    config = PolicyConfig(warm_spares_per_node=2, resource_reserve=0.2)
    assert SPARE_MEM_MB == 600.0
    assert spares_wanted(nodes, {}, config) == {"a": 1, "b": 1}
    # One spare already runs on b (its memory is in b's measured usage): it is kept, and two
    # more fit, the best Q first.
    assert spares_wanted(nodes, {"b": 1}, config) == {"a": 2, "b": 1}


def test_no_spares_when_the_policy_says_none_and_extra_ones_are_trimmed():
    nodes = {"a": node("a", 2.0)}
    assert spares_wanted(nodes, {"a": 3}, PolicyConfig(warm_spares_per_node=0)) == {"a": 0}
    assert spares_wanted(nodes, {"a": 3}, PolicyConfig(warm_spares_per_node=1)) == {"a": 1}


def test_the_setting_is_bounded():
    import pytest

    from console.policy.config import PolicyConfigError

    for bad in (-1, 5, 1.5, True):
        with pytest.raises(PolicyConfigError, match="warm_spares_per_node"):
            PolicyConfig(warm_spares_per_node=bad).validate()


def test_a_supervisor_started_standby_prefers_a_node_with_a_spare_ready_then_q():
    ranked = ["n1", "n2", "n3", "n4"]  # by Q, best first
    spares = {"n3": {"idle": 1}, "n4": {"idle": 2}, "n1": {"idle": 0}}
    assert standby_node_preference(ranked, spares) == ["n3", "n4", "n1", "n2"]
    assert standby_node_preference(ranked, {}) == ranked
    # A node whose spare is still warming up comes after those with an idle one, before the rest.
    spares = {"n2": {"starting": 1}, "n4": {"idle": 1, "starting": 1}}
    assert standby_node_preference(ranked, spares) == ["n4", "n2", "n1", "n3"]


def test_a_spare_is_needed_until_one_is_idle_off_each_protected_stage_s_nodes():
    placements = {"count": ("n1", "n2")}
    assert spare_needed(placements, {})
    # On the primary's node: a kill of the driver would leave it usable, a node fault not.
    assert spare_needed(placements, {"n1": 1, "n3": 0})
    # On the standby's node: that node is the new primary's after a promotion.
    assert spare_needed(placements, {"n2": 1})
    assert not spare_needed(placements, {"n2": 1, "n3": 1})
    # Every protected stage needs one off its own nodes; one spare may cover several.
    placements["window"] = ("n3", "n1")
    assert spare_needed(placements, {"n3": 1})  # count's, not window's
    assert not spare_needed(placements, {"n2": 1, "n3": 1})
    assert not spare_needed(placements, {"n4": 1})


def test_a_stage_without_a_standby_is_covered_by_an_idle_spare_on_its_primary_s_node():
    # A failed primary restarts on its node: a spare elsewhere does not help it.
    assert spare_needed({"count": ("n1", None)}, {})
    assert spare_needed({"count": ("n1", None)}, {"n2": 1})
    assert not spare_needed({"count": ("n1", None)}, {"n1": 1})
    # Being restarted (no live replica): any node.
    assert not spare_needed({"count": (None, None)}, {"n3": 1})
    assert not spare_needed({}, {"n2": 1})
    # Every stage, protected or not, needs its cover.
    assert spare_needed({"a": ("n1", None), "b": ("n1", "n2")}, {"n1": 1})
    assert not spare_needed({"a": ("n1", None), "b": ("n1", "n2")}, {"n1": 1, "n3": 1})


def test_nodes_on_one_host_share_its_spares_on_their_best_q_node():
    nodes = {n.name: n for n in (node("n1", 1.0), node("n2", 3.0), node("n3", 2.0))}
    one_host = {"n1": "m", "n2": "m", "n3": "m"}
    config = PolicyConfig(warm_spares_per_node=1)
    assert spares_wanted(nodes, {}, config, one_host) == {"n1": 0, "n2": 1, "n3": 0}
    # Two per host: the second goes to another node of the host, the next best Q.
    assert spares_wanted(nodes, {}, PolicyConfig(warm_spares_per_node=2), one_host) == {
        "n1": 0,
        "n2": 1,
        "n3": 1,
    }
    # Without hosts every node is a host of its own, as before.
    assert spares_wanted(nodes, {}, config) == {"n1": 1, "n2": 1, "n3": 1}


def test_a_hosts_running_spare_stays_where_it_is_and_extra_ones_are_trimmed():
    nodes = {n.name: n for n in (node("n1", 3.0), node("n2", 2.0), node("n3", 1.0))}
    one_host = {"n1": "m", "n2": "m", "n3": "m"}
    config = PolicyConfig(warm_spares_per_node=1)
    # n3 has the worst Q now, but its spare is warm: kept, none started on n1.
    assert spares_wanted(nodes, {"n3": 1}, config, one_host) == {"n1": 0, "n2": 0, "n3": 1}
    # Three running (one per node, before they were seen to share a host): the best Q keeps its.
    assert spares_wanted(nodes, {"n1": 1, "n2": 1, "n3": 1}, config, one_host) == {
        "n1": 1,
        "n2": 0,
        "n3": 0,
    }


def test_hosts_fill_round_robin_and_a_node_without_a_host_is_its_own():
    nodes = {n.name: n for n in (node("a1", 4.0), node("a2", 3.0), node("b1", 2.0), node("c", 1.0))}
    hosts = {"a1": "A", "a2": "A", "b1": "B"}
    config = PolicyConfig(warm_spares_per_node=1)
    assert spares_wanted(nodes, {}, config, hosts) == {"a1": 1, "a2": 0, "b1": 1, "c": 1}


def test_a_hosts_new_spare_goes_where_it_covers_the_next_fault():
    nodes = {n.name: n for n in (node("n1", 3.0), node("n2", 2.0), node("n3", 1.0))}
    one_host = {"n1": "m", "n2": "m", "n3": "m"}
    # count's primary on n2, its standby on n1 (the best Q): a promotion's new standby goes to
    # n3, so n3 is where the one spare helps.
    placements = {"count": ("n2", "n1")}
    assert stages_covered(placements, nodes) == {"n1": 0, "n2": 0, "n3": 1}
    config = PolicyConfig(warm_spares_per_node=1)
    cover = stages_covered(placements, nodes)
    assert spares_wanted(nodes, {}, config, one_host, cover) == {"n1": 0, "n2": 0, "n3": 1}
    # A stage without a standby restarts in place: its primary's node covers it.
    assert stages_covered({"count": ("n2", None)}, nodes) == {"n1": 0, "n2": 1, "n3": 0}
    # No stage: nothing to cover, and Q decides.
    assert spares_wanted(nodes, {}, config, one_host, stages_covered({}, nodes))["n1"] == 1


def test_where_no_node_covers_every_stage_the_one_covering_most_gets_the_spare():
    nodes = {
        n.name: n for n in (node("n1", 4.0), node("n2", 3.0), node("n3", 9.0), node("n4", 1.0))
    }
    one_host = {name: "m" for name in nodes}
    placements = {"a": ("n1", "n2"), "b": ("n2", "n3"), "c": ("n1", None)}
    cover = stages_covered(placements, nodes)
    assert cover == {"n1": 2, "n2": 0, "n3": 1, "n4": 2}
    config = PolicyConfig(warm_spares_per_node=1)
    # n3 has the best Q but covers one stage; of the two covering two, n1 has the better Q.
    assert spares_wanted(nodes, {}, config, one_host, cover) == {"n1": 1, "n2": 0, "n3": 0, "n4": 0}


def test_a_host_over_its_limit_keeps_the_spare_that_covers():
    # Three spares, one per node (before the nodes were seen to share a host): the one kept is
    # off the stage's replicas, not the best Q's, which holds the standby.
    nodes = {n.name: n for n in (node("n1", 3.0), node("n2", 2.0), node("n3", 1.0))}
    one_host = {"n1": "m", "n2": "m", "n3": "m"}
    cover = stages_covered({"count": ("n2", "n1")}, nodes)
    config = PolicyConfig(warm_spares_per_node=1)
    running = {"n1": 1, "n2": 1, "n3": 1}
    assert spares_wanted(nodes, running, config, one_host, cover) == {"n1": 0, "n2": 0, "n3": 1}


def test_spares_still_warming_are_kept_but_charged_against_the_reserve():
    # 16,000 MB in all, reserve 20%: 4,400 MB free leaves room for two spares of 600 MB. One
    # warms up on b (not in the measured usage yet): one more fits, not two.
    nodes = {"a": node("a", 2.0, 2200.0), "b": node("b", 1.0, 2200.0)}
    config = PolicyConfig(warm_spares_per_node=2, resource_reserve=0.2)
    assert spares_wanted(nodes, {"b": 1}, config, measured={}) == {"a": 1, "b": 1}
    # Idle (measured), it costs nothing more: two more fit.
    assert spares_wanted(nodes, {"b": 1}, config, measured={"b": 1}) == {"a": 2, "b": 1}


def test_a_spare_asked_for_stays_on_its_node_after_the_hosts_started_ones():
    nodes = {n.name: n for n in (node("n1", 3.0), node("n2", 2.0), node("n3", 1.0))}
    one_host = {"n1": "m", "n2": "m", "n3": "m"}
    config = PolicyConfig(warm_spares_per_node=1)
    # Another job's cycle asked n1 for the host's spare a moment ago; this job's stages would
    # rather have it on n3. Its agent has not started it yet: it stays asked on n1.
    cover = stages_covered({"count": ("n2", "n1")}, nodes)
    assert spares_wanted(nodes, {}, config, one_host, cover) == {"n1": 0, "n2": 0, "n3": 1}
    wanted = spares_wanted(nodes, {}, config, one_host, cover, asked={"n1": 1})
    assert wanted == {"n1": 1, "n2": 0, "n3": 0}
    # A spare already started on the host wins over an ask elsewhere.
    wanted = spares_wanted(nodes, {"n2": 1}, config, one_host, cover, asked={"n1": 1})
    assert wanted == {"n1": 0, "n2": 1, "n3": 0}
    # An ask is charged against the reserve like a spare warming up: not measured yet.
    tight = {"a": node("a", 2.0, 2200.0), "b": node("b", 1.0, 2200.0)}
    reserve = PolicyConfig(warm_spares_per_node=2, resource_reserve=0.2)
    assert spares_wanted(tight, {}, reserve, measured={}, asked={"b": 1}) == {"a": 1, "b": 1}
