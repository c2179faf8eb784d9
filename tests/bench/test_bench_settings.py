"""The benchmark's settings refuse what it cannot run, naming the option."""

from pathlib import Path

import pytest

from bench.strategy.harness import BenchSettings
from bench.strategy.run import policy_for_runs
from console.models import Policy


def settings(**changes):
    values = {
        "topology": "wordcount", "strategies": ("adaptive",), "faults": 2,
        "fault_kind": "kill-driver", "rate": 50.0, "warmup_s": 20.0, "duration_s": 90.0,
        "out": Path("."),
    }  # fmt: skip
    return BenchSettings(**{**values, **changes})


def test_the_peer_and_the_operator_exception_fault_are_accepted():
    bench = settings(peer="flink", fault_kind="operator-exception")
    assert bench.peer == "flink" and bench.schedule == [50.0, 80.0]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"peer": "storm"}, "--peer: one of flink"),
        ({"peer_conf": (("heartbeat.timeout", "5000"),)}, "--flink-conf: only with --peer flink"),
        ({"fault_kind": "kill-everything"}, "--fault-kind: one of kill-driver, kill-node, "),
        ({"faults": 5}, "--faults: 0 to 4"),
        ({"strategies": ("fastest",)}, "--strategies: comma-separated"),
        ({"policy": (("spares", "0"),)}, "--policy: spares is not a policy field"),
        ({"policy": (("warm_spares_per_node", "none"),)}, "warm_spares_per_node is an integer"),
        ({"source": "files"}, "--source: one of redis, kafka"),
        ({"trigger": "continuous"}, "--trigger: one of microbatch, realtime"),
        ({"trigger": "realtime"}, "--trigger realtime is refused: Spark's real-time mode reads"),
    ],
)
def test_bad_settings_are_refused_naming_the_option(changes, message):
    with pytest.raises(ValueError, match=message):
        settings(**changes)


@pytest.mark.django_db
def test_the_peer_runs_only_the_topologies_with_a_plain_python_ground_truth():
    with pytest.raises(ValueError, match="--peer runs wordcount, topn only"):
        settings(peer="flink", topology="traffic")


@pytest.mark.django_db
def test_a_policy_setting_holds_for_the_runs_and_the_one_before_comes_back():
    before = Policy.current()
    said = []
    with policy_for_runs((("warm_spares_per_node", "0"),), said.append):
        during = Policy.current()
        assert during.warm_spares_per_node == 0 and during.version == before.version + 1
        assert "bench --policy warm_spares_per_node=0" in during.reason
    after = Policy.current()
    assert after.version == before.version + 2 and after.reason == f"revert to v{before.version}"
    assert Policy.diff(before, after) == {}
    assert len(said) == 2


@pytest.mark.django_db
def test_a_policy_setting_out_of_bounds_is_refused_before_any_run():
    before = Policy.current().version
    refused = pytest.raises(RuntimeError, match="warm_spares_per_node")
    with refused, policy_for_runs((("warm_spares_per_node", "99"),), print):
        raise AssertionError("the runs must not start")
    assert Policy.current().version == before
