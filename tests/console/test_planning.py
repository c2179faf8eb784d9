"""Stage placement per strategy (no database: pure planning from node samples)."""

import pytest

from console.policy.config import PolicyConfig
from console.policy.resources import NodeSample
from console.services.planning import plan_job, rank_nodes
from spark_runtime.topology import get_topology


def sample(name, cpu_used, mem_used, cpu_total=2.0, mem_total=8000.0):
    return NodeSample(
        name,
        cpu_total=cpu_total,
        cpu_used=cpu_used,
        mem_total=mem_total,
        mem_used=mem_used,
        disk_throughput=0.0,
        disk_max_throughput=100.0,
        bw_used=0.0,
        bw_total=1000.0,
    )


# node-1 idle, node-2 half busy, node-3 busiest: Q order node-1, node-2, node-3.
HISTORY = {
    "node-1": [sample("node-1", 0.0, 0.0)],
    "node-2": [sample("node-2", 1.0, 4000.0)],
    "node-3": [sample("node-3", 1.6, 6400.0)],
}


def test_nodes_are_ranked_by_q():
    assert rank_nodes(HISTORY, PolicyConfig()) == ["node-1", "node-2", "node-3"]


def test_restart_all_runs_one_fused_stage_without_standby():
    plan = plan_job(get_topology("wordcount"), "restart-all", HISTORY, PolicyConfig())
    assert [(s.name, s.operators, s.primary_node, s.standby_node) for s in plan.stages] == [
        ("job", ("split", "count"), "node-1", None)
    ]


def test_local_restart_spreads_stages_without_standbys():
    plan = plan_job(get_topology("topn"), "local-restart", HISTORY, PolicyConfig())
    # One stage per stateful operator; window_count (0.5 cores + 512 MiB) outweighs topn
    # (0.3 + 256): it gets the best node.
    assert {s.name: (s.operators, s.primary_node, s.standby_node) for s in plan.stages} == {
        "window_count": (("window_count",), "node-1", None),
        "topn": (("topn",), "node-2", None),
    }


def test_active_all_gives_every_stage_a_standby_on_another_node():
    plan = plan_job(get_topology("wordcount"), "active-all", HISTORY, PolicyConfig())
    for stage in plan.stages:
        assert stage.standby_node is not None
        assert stage.standby_node != stage.primary_node


def test_adaptive_chains_the_stateless_split_into_the_protected_count_stage():
    # With the default threshold 0.4 the stateless split is passive and count is active: split
    # chains into count's stage, whose protection follows count (its highest priority).
    plan = plan_job(get_topology("wordcount"), "adaptive", HISTORY, PolicyConfig())
    (stage,) = plan.stages
    assert (stage.name, stage.operators) == ("count", ("split", "count"))
    assert {p.name: p.mode for p in plan.priorities}["split"] == "passive"
    assert stage.standby_node == "node-2"  # best Q that is not the stage primary's
    assert "count is active" in stage.reason and "Algorithm 1" in stage.reason


def test_adaptive_launch_does_not_pass_over_an_agent_that_just_started():
    # The demo launches its job as soon as one Celery worker answers, so a node agent may have
    # sent one sample while the others sent five. node-1 and node-3 are idle, node-2 runs a little
    # (cpu 0.4/2, mem 800/8000: 0.4*0.8 + 0.3*0.9 + 0.3 = 0.89 -> Q 0.89*2.3328755442 = 2.076).
    # node-3's one idle sample is scaled to the full window: Q 2.333, like node-1 (unscaled it was
    # 1.0 and the standby went to the busier node-2). node-1 wins the primary by name; count's
    # standby (0.5 cores, 512 MiB) then prefers node-3 (2.333 - 2.333*(0.4*0.25 + 0.3*0.064)
    # = 2.055) to node-2 (2.076 - 0.278 = 1.798).
    history = {
        "node-1": [sample("node-1", 0.0, 0.0)] * 5,
        "node-2": [sample("node-2", 0.4, 800.0)] * 5,
        "node-3": [sample("node-3", 0.0, 0.0)],
    }
    plan = plan_job(get_topology("wordcount"), "adaptive", history, PolicyConfig())
    assert plan.node_scores["node-3"] == pytest.approx(plan.node_scores["node-1"])
    (stage,) = plan.stages
    assert (stage.primary_node, stage.standby_node) == ("node-1", "node-3")
    assert stage.standby_verdict.rule == "placed at launch"
    assert stage.standby_verdict.reason.endswith("with room (node-3 2.05, node-2 1.80)")
    assert stage.standby_verdict.reason in stage.reason


def test_adaptive_cuts_stateful_operators_apart_only_where_protection_differs():
    # Both topn operators are active by default: one stage (two queries), one standby.
    (both,) = plan_job(get_topology("topn"), "adaptive", HISTORY, PolicyConfig()).stages
    assert both.operators == ("window_count", "topn") and both.standby_node
    # A threshold between their priorities (0.646 and 0.639) protects window_count only.
    config = PolicyConfig(priority_threshold=0.642)
    stages = {s.name: s for s in plan_job(get_topology("topn"), "adaptive", HISTORY, config).stages}
    assert stages["window_count"].standby_node and stages["topn"].standby_node is None
    assert stages["topn"].operators == ("topn",)


def test_adaptive_falls_back_to_checkpoints_when_the_reserve_is_reached():
    busy = {
        "node-1": [sample("node-1", 1.9, 7800.0)],
        "node-2": [sample("node-2", 1.9, 7800.0)],
    }
    plan = plan_job(get_topology("wordcount"), "adaptive", busy, PolicyConfig())
    assert all(s.standby_node is None for s in plan.stages)
    assert "fell back" in plan.stage("count").reason


def test_no_alive_node_is_an_error():
    with pytest.raises(ValueError, match="no node is alive"):
        plan_job(get_topology("wordcount"), "adaptive", {}, PolicyConfig())


def test_unknown_strategy_is_an_error():
    with pytest.raises(ValueError, match="strategy"):
        plan_job(get_topology("wordcount"), "yolo", HISTORY, PolicyConfig())


def test_exit_status_and_actions_read_as_sentences():
    from console.services.control.record import (
        describe_actions,
        exit_returncode,
        exit_status,
    )
    from spark_runtime.replicas import KillReplica, PromoteStandby, ReplicaSpec, StartReplica

    assert exit_status(-9, "ProcessExited") == "killed by SIGKILL"
    assert exit_status(3, "ProcessExited") == "exited with code 3 (fenced by a newer primary)"
    assert exit_status(None, "HeartbeatMissed") == "heartbeat missed"
    assert exit_status(None, "ProcessExited", reported=True).startswith("exited (its code unknown")
    assert exit_returncode('{"returncode": "-9"}') == -9
    assert exit_returncode('{"returncode": ""}') is None
    assert exit_returncode(None) is None
    spec = ReplicaSpec("j", "wordcount", "count", "standby", "count-3", "node-3")
    assert describe_actions(
        [KillReplica("count-1"), PromoteStandby("count-2", "count"), StartReplica(spec)]
    ) == (
        "make sure count-1 is gone; promote standby count-2 of count; "
        "start standby count-3 on node-3"
    )
