"""Redis key names, spelled out: running systems hold data under them, so building them in a
new way must not change a byte (infra.keys and spark_runtime.keys share one prefix)."""

from __future__ import annotations

import inspect

import pytest

from infra import keys as control_keys
from spark_runtime import keys as data_keys


def test_control_plane_keys_are_unchanged():
    assert control_keys.node_heartbeat("node-1") == "backstop:node:node-1:hb"
    assert control_keys.node_metrics("node-1") == "backstop:node:node-1:metrics"
    assert control_keys.agent_events() == "backstop:agent-events"
    assert control_keys.controller_lease("wc-7") == "backstop:wc-7:controller-lease"
    assert control_keys.controller_state("wc-7") == "backstop:wc-7:controller-state"
    assert control_keys.replica_activity("wc-7") == "backstop:wc-7:activity"
    assert control_keys.agent_events_cursor("wc-7") == "backstop:wc-7:agent-events-cursor"
    assert control_keys.fault_carried_out(42) == "backstop:fault:42:carried-out"
    assert control_keys.paused_groups("node-2") == "backstop:node:node-2:paused"
    assert control_keys.kafka_conditions("wc-7") == "backstop:wc-7:kafka-conditions"
    assert control_keys.job_activity("wc-7") == "backstop:wc-7:io-activity"
    assert control_keys.job_alerts("wc-7") == "backstop:wc-7:alerts"
    assert control_keys.job_strays("wc-7") == "backstop:wc-7:strays"
    assert control_keys.reconcile_failures("wc-7") == "backstop:wc-7:reconcile-failures"
    assert control_keys.controller_stats("h:1:ab") == "backstop:controller:h:1:ab:stats"
    assert control_keys.controller_job_keys("wc-7") == [
        "backstop:wc-7:controller-state", "backstop:wc-7:controller-cycle",
        "backstop:wc-7:reconcile-failures", "backstop:wc-7:kafka-conditions",
        "backstop:wc-7:exits", "backstop:wc-7:exit-tails", "backstop:wc-7:interval-requests",
        "backstop:wc-7:agent-events-cursor", "backstop:wc-7:io-activity", "backstop:wc-7:alerts",
        "backstop:wc-7:strays",
    ]  # fmt: skip
    assert (
        control_keys.ingest_cursor("backstop:wc-7:progress")
        == "backstop:wc-7:progress:ingest-cursor"
    )


def test_data_plane_keys_are_unchanged():
    assert data_keys.PREFIX == "backstop"
    assert data_keys.job_prefix("wc-7") == "backstop:wc-7:"
    assert data_keys.input_stream("wc-7") == "backstop:wc-7:in"
    assert data_keys.channel_stream("wc-7", "split") == "backstop:wc-7:s:split"
    assert data_keys.result_versions("wc-7") == "backstop:wc-7:results:ver"
    assert data_keys.dead_seen("wc-7") == "backstop:wc-7:dead:seen"
    assert data_keys.heartbeat("wc-7", "count-1") == "backstop:wc-7:hb:count-1"
    assert data_keys.flink_task_fault("wc-7") == "backstop:wc-7:flink:task-fault"
    assert data_keys.spare_control("node-1", "sp-3") == "backstop:node:node-1:spare:sp-3"
    assert (
        data_keys.spare_warmup_stream("node-1", "sp-3") == "backstop:node:node-1:spare:sp-3:warmup"
    )
    assert data_keys.spare_warmup_lock("host-a") == "backstop:host:host-a:spare-warming"
    assert data_keys.spares_wanted("node-1") == "backstop:node:node-1:spares:wanted"
    assert data_keys.spare_asked("node-1") == "backstop:node:node-1:spares:asked"
    assert data_keys.spare_refill_hold() == "backstop:spares:refill-hold"
    assert data_keys.spare_needed() == "backstop:spares:needed"
    assert data_keys.spare_plans() == "backstop:spares:plans"


def key_functions(module):
    """The key-building functions of a keys module (those returning one key name)."""
    return [
        fn
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if fn.__module__ == module.__name__
        and name not in ("make_key", "delete_job_keys", "ingest_cursor", "controller_job_keys")
    ]


@pytest.mark.parametrize("module", [control_keys, data_keys], ids=lambda m: m.__name__)
def test_every_key_starts_with_the_one_prefix(module):
    for fn in key_functions(module):
        args = [f"a{i}" for i in range(len(inspect.signature(fn).parameters))]
        assert fn(*args).startswith(f"{data_keys.PREFIX}:"), fn.__name__
