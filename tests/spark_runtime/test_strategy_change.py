"""Changing a running job's strategy in place (Supervisor.change_strategy) and which changes can
be made so (strategies.in_place_refusal): pure, no Django, no Spark."""

from __future__ import annotations

import itertools

import pytest

from spark_runtime.replicas import (
    HeartbeatSeen,
    KillReplica,
    ProcessExited,
    PromoteStandby,
    RestartJob,
    StartReplica,
)
from spark_runtime.strategies import get_strategy, in_place_refusal
from spark_runtime.supervision import Supervisor
from spark_runtime.topology import TOPOLOGIES, compile_stages


def running(strategy: str, topology: str = "wordcount") -> Supervisor:
    """A supervisor of `topology` cut by `strategy` (no operator chosen by the policy), every
    replica running."""
    definition = get_strategy(strategy)
    spec = TOPOLOGIES[topology]
    protected = {op.name for op in spec.operators} if definition.standbys == "all" else set()
    stages = {s.name: s.operators for s in compile_stages(spec, definition.chaining, protected)}
    sup = Supervisor("j", topology, stages, strategy, ["node-1", "node-2"])
    sup.start(0.0)
    for replica in list(sup.replicas.values()):
        reported = {"role": replica.role, "state": "running", "lag_s": 0.1, "batches": 1}
        sup.handle(HeartbeatSeen(replica.id, 1.0, reported))
    return sup


def test_a_strategy_that_protects_every_stage_adds_the_missing_standbys_on_another_node():
    sup = running("local-restart")
    assert sup.of_stage("count") and not sup.has_standby("count")
    (start,) = sup.change_strategy("active-all", 2.0)
    assert isinstance(start, StartReplica) and start.replica.role == "standby"
    # Placed away from its primary, seeded from it and with the new strategy's options.
    assert start.replica.node == "node-2" and start.replica.seed_from == "count-1"
    assert start.replica.cpu_priorities and sup.active_stages == {"count"}
    # What a failure leads to follows at once: the caught-up standby takes over.
    sup.handle(HeartbeatSeen(start.replica.replica_id, 3.0, {"role": "standby",
                                                             "state": "running", "lag_s": 0.1,
                                                             "batches": 2}))  # fmt: skip
    actions = sup.handle(ProcessExited("count-1", 4.0, code=-9))
    assert any(isinstance(a, PromoteStandby) for a in actions)


def test_a_strategy_without_standbys_stops_them_and_restarts_as_it_says():
    sup = running("active-all")
    assert sup.has_standby("count")
    assert sup.change_strategy("local-restart", 2.0) == [KillReplica("count-2")]
    assert not sup.has_standby("count") and sup.active_stages == set()
    assert sup.definition.name == "local-restart"
    actions = sup.handle(ProcessExited("count-1", 3.0, code=-9))
    assert actions and not any(isinstance(a, PromoteStandby | RestartJob) for a in actions)


def test_the_policys_strategy_keeps_the_standbys_there_are_and_the_same_one_changes_nothing():
    sup = running("active-all")
    assert sup.change_strategy("adaptive", 2.0) == []  # the next policy cycle decides
    assert sup.has_standby("count") and sup.active_stages == {"count"}
    assert sup.change_strategy("adaptive", 3.0) == []
    assert [what for _, what in sup.history if "strategy" in what] == [
        "strategy active-all -> adaptive"
    ]
    # Kept across a controller restart (the saved state).
    assert Supervisor.from_dict(sup.to_dict()).strategy == "adaptive"


@pytest.mark.parametrize(
    "topology, running_as, to, allowed",
    [
        ("wordcount", "adaptive", "active-all", True),
        ("wordcount", "adaptive", "local-restart", True),
        # restart-all's one stage is called `job`, the same operators in the same query.
        ("wordcount", "adaptive", "restart-all", True),
        ("wordcount", "restart-all", "active-all", True),
        ("topn", "adaptive", "active-all", True),
        ("topn", "restart-all", "adaptive", True),
        ("topn", "adaptive", "local-restart", False),  # each stateful operator apart
        # adaptive runs topn's two stateful operators apart where the policy protects one.
        ("topn", "local-restart", "adaptive", True),
        ("topn", "local-restart", "active-all", False),  # protects both: one stage
        ("traffic", "local-restart", "adaptive", True),
        ("traffic", "restart-all", "local-restart", False),
    ],
)
def test_a_strategy_is_changed_in_place_only_where_it_cuts_the_job_into_the_same_stages(
    topology, running_as, to, allowed
):
    sup = running(running_as, topology)
    refusal = in_place_refusal(TOPOLOGIES[topology], sup.stage_operators, sup.active_stages, to)
    # Independently: the stages `to` would compile the topology into (under adaptive, for
    # any choice of protected operators), against those running.
    definition = get_strategy(to)
    spec = TOPOLOGIES[topology]
    names = [op.name for op in spec.operators]
    if definition.standbys == "all":
        choices = [set(names)]
    elif definition.standbys == "policy":
        choices = [{n for n, bit in zip(names, bits, strict=True) if bit}
                   for bits in itertools.product((0, 1), repeat=len(names))]  # fmt: skip
    else:
        choices = [set()]
    running_cut = sorted(sup.stage_operators.values())
    cuts = [sorted(s.operators for s in compile_stages(spec, definition.chaining, c))
            for c in choices]  # fmt: skip
    assert (running_cut in cuts) == allowed
    assert (refusal is None) == allowed
    if not allowed:
        assert f"{to} cuts this job into other stages" in refusal
        assert "cannot change to" in refusal and "start a new job" in refusal


def test_restart_all_changed_to_a_standby_strategy_keeps_its_stage_and_promotes():
    """restart-all runs wordcount as one stage called `job`; active-all would call it `count`.
    The change keeps the running stage (its name, replica and checkpoint) and adds its standby,
    and a kill then promotes it instead of restarting the job."""
    sup = running("restart-all")
    assert sup.stages == ["job"]
    (start,) = sup.change_strategy("active-all", 2.0)
    assert sup.stages == ["job"] and start.replica.replica_id == "job-2"
    assert start.replica.role == "standby" and start.replica.seed_from == "job-1"
    sup.handle(HeartbeatSeen("job-2", 3.0, {"role": "standby", "state": "running",
                                            "lag_s": 0.1, "batches": 2}))  # fmt: skip
    actions = sup.handle(ProcessExited("job-1", 4.0, code=-9))
    assert any(isinstance(a, PromoteStandby) for a in actions)
    assert not any(isinstance(a, RestartJob) for a in actions)
