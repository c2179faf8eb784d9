"""Checkpoint interval formulas and the Spark mapping."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.policy.checkpoint import (
    INTERVAL_PENDING_TIMEOUT_S,
    ReplicaInterval,
    adjust_interval,
    initial_interval,
    interval_rollout,
    spark_settings_for_interval,
    stage_interval,
    state_store_confs,
)
from console.policy.config import PolicyConfig


def test_initial_interval_by_hand():
    config = PolicyConfig()
    # T=60, T_checkpoint=0.5, T_recover=20: 60*0.5/(0.05*20) = 30/1 = 30
    assert initial_interval(0.05, config) == pytest.approx(30.0)
    # 30/(0.5*20) = 30/10 = 3
    assert initial_interval(0.5, config) == pytest.approx(3.0)
    # 30/(1*20) = 1.5
    assert initial_interval(1.0, config) == pytest.approx(1.5)
    # 30/(0.001*20) = 1500 -> clamped to the 60 s maximum; fr=0 is floored to 0.001
    assert initial_interval(0.001, config) == 60.0
    assert initial_interval(0.0, config) == 60.0
    # with a 2 s minimum, 1.5 is raised to 2
    assert initial_interval(1.0, replace(config, checkpoint_min_s=2.0)) == 2.0


def test_every_rule_by_hand():
    # 10 + 10*(1-0.2) = 18; cpu 0.9 > 0.8: 18*0.9/0.8 = 20.25; mem 0.5 <= 0.8: no change;
    # 6 slow tasks > 3: 20.25 + 20.25*(6-3)/3 = 40.5; within [1, 60].
    decision = adjust_interval(
        10.0, fault=False, fr=0.2, cpu_util=0.9, mem_util=0.5, slow_tasks=6, config=PolicyConfig()
    )
    assert decision.seconds == pytest.approx(40.5)
    assert len(decision.rules) == 3
    assert decision.rules[0].startswith("no fault")
    assert decision.rules[1].startswith("cpu 0.90 > 0.8")
    assert decision.rules[2].startswith("slow tasks 6 > 3")
    assert decision.reason == "; ".join(decision.rules)


def test_fault_shortens_and_memory_lengthens():
    # fault: 10 - 10*0.2 = 8; mem 0.96 > 0.8: 8*0.96/0.8 = 9.6
    decision = adjust_interval(
        10.0, fault=True, fr=0.2, cpu_util=0.1, mem_util=0.96, slow_tasks=3, config=PolicyConfig()
    )
    assert decision.seconds == pytest.approx(9.6)
    assert [r.split(" ")[0] for r in decision.rules] == ["fault:", "mem"]


def test_clamping_is_reported():
    # 50 + 50*(1-0.1) = 95 -> 60
    high = adjust_interval(
        50.0, fault=False, fr=0.1, cpu_util=0, mem_util=0, slow_tasks=0, config=PolicyConfig()
    )
    assert high.seconds == 60.0
    assert high.rules[-1] == "clamped 95 to [1, 60]"
    # 1 - 1*0.5 = 0.5 -> 1
    low = adjust_interval(
        1.0, fault=True, fr=0.5, cpu_util=0, mem_util=0, slow_tasks=0, config=PolicyConfig()
    )
    assert low.seconds == 1.0


def test_spark_settings_by_hand():
    # 30 s interval, 1 s trigger: a full snapshot every 30 batches, maintenance every 30 s.
    assert spark_settings_for_interval(30.0, trigger_s=1.0) == {
        "trigger_interval": "1 seconds",
        "trigger_interval_s": 1.0,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "30",
        "spark.sql.streaming.stateStore.maintenanceInterval": "30s",
    }
    # 0.5 s interval: the trigger shrinks to 0.5 s, a snapshot every batch, maintenance 1 s.
    short = spark_settings_for_interval(0.5, trigger_s=1.0)
    assert short["trigger_interval"] == "500 milliseconds"
    assert short["trigger_interval_s"] == 0.5
    assert short["spark.sql.streaming.stateStore.minDeltasForSnapshot"] == "1"
    assert short["spark.sql.streaming.stateStore.maintenanceInterval"] == "1s"
    # 120 s with a 2 s trigger: 60 batches; maintenance stays at Spark's 60 s default.
    long = spark_settings_for_interval(120.0, trigger_s=2.0)
    assert long["trigger_interval"] == "2 seconds"
    assert long["spark.sql.streaming.stateStore.minDeltasForSnapshot"] == "60"
    assert long["spark.sql.streaming.stateStore.maintenanceInterval"] == "60s"
    with pytest.raises(ValueError):
        spark_settings_for_interval(0.0, trigger_s=1.0)


bounds = st.tuples(
    st.floats(min_value=0.01, max_value=100.0), st.floats(min_value=0.01, max_value=3000.0)
).map(lambda t: (t[0], t[0] + t[1]))


@given(
    bounds,
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(0, 1000),
    st.booleans(),
    st.floats(min_value=0.001, max_value=0.999),
)
def test_interval_stays_within_bounds(bound, position, fr, cpu, mem, slow, fault, fr0):
    low, high = bound
    config = replace(PolicyConfig(), checkpoint_min_s=low, checkpoint_max_s=high)
    current = low + position * (high - low)
    decision = adjust_interval(
        current, fault=fault, fr=fr, cpu_util=cpu, mem_util=mem, slow_tasks=slow, config=config
    )
    assert low <= decision.seconds <= high
    assert low <= initial_interval(fr0, config) <= high


# --- interval_rollout: bringing an interval to running replicas --------------------------------


def replica(rid, role, seconds=60.0, since=0.0, running=True, pending=None, stage="wc"):
    return ReplicaInterval(rid, stage, role, running, seconds, since, pending)


NOW = 1000.0


def rollout(replicas, wanted=None, quiet=True, gap=300.0):
    return interval_rollout(wanted or {"wc": 10.0}, replicas, NOW, gap, quiet)


def test_the_standby_takes_a_new_interval_first_and_alone():
    (action,) = rollout([replica("wc-1", "primary"), replica("wc-2", "standby")])
    assert (action.replica_id, action.stage, action.seconds) == ("wc-2", "wc", 10.0)
    assert action.reason.startswith("wc-2 (standby): checkpoint interval 60 s -> 10 s")


def test_the_primary_goes_once_its_standby_runs_the_new_interval():
    standby_done = replica("wc-2", "standby", seconds=10.0, since=NOW - 5)
    (action,) = rollout([replica("wc-1", "primary"), standby_done])
    assert action.replica_id == "wc-1"


def test_nothing_while_a_request_is_pending_or_a_partner_is_not_running():
    pending = replica("wc-2", "standby", pending=NOW - 10)
    assert rollout([replica("wc-1", "primary"), pending]) == []
    restarting = replica("wc-2", "standby", seconds=10.0, since=NOW - 5, running=False)
    assert rollout([replica("wc-1", "primary"), restarting]) == []
    # A request unanswered for longer than the timeout is sent again.
    stale = replica("wc-2", "standby", pending=NOW - INTERVAL_PENDING_TIMEOUT_S - 1)
    assert [a.replica_id for a in rollout([replica("wc-1", "primary"), stale])] == ["wc-2"]


def test_small_changes_recent_changes_and_busy_moments_wait():
    near = replica("wc-1", "primary", seconds=12.0)  # within the 1.5x factor of 10 s
    assert rollout([near]) == []
    assert rollout([replica("wc-1", "primary", since=NOW - 60)]) == []  # changed a minute ago
    assert rollout([replica("wc-1", "primary")], quiet=False) == []
    assert [a.seconds for a in rollout([replica("wc-1", "primary", seconds=None)])] == [10.0]


def test_stages_roll_out_independently():
    replicas = [replica("a-1", "primary", stage="a"), replica("b-1", "primary", stage="b")]
    actions = rollout(replicas, wanted={"a": 10.0, "b": 60.0})
    assert [(a.replica_id, a.seconds) for a in actions] == [("a-1", 10.0)]


def test_a_stage_takes_its_most_protective_operator_interval_and_state_store_settings():
    assert stage_interval([30.0, 12.0, 0.0, None]) == 12.0
    assert stage_interval([0.0]) is None
    assert state_store_confs(30.0, 0.5) == {
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "60",  # 30 s / 0.5 s trigger
        "spark.sql.streaming.stateStore.maintenanceInterval": "30s",
    }
