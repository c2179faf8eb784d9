"""The dry-run core behind `policy_explain`: file validation and the report (no Django)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.policy.config import PolicyConfig
from console.policy.explain import explain, format_table, parse_nodes, parse_operators
from spark_runtime.topology import WORDCOUNT_JOB

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"

NODE = {
    "name": "a",
    "cpu_total": 4,
    "cpu_used": 1,
    "mem_total": 4096,
    "mem_used": 1024,
    "disk_throughput": 0,
    "disk_max_throughput": 100,
    "bw_used": 0,
    "bw_total": 100,
}


def test_example_files_parse():
    nodes = parse_nodes(json.loads((EXAMPLES / "nodes.json").read_text()))
    assert list(nodes) == ["node-a", "node-b", "node-c"]
    assert [len(s) for s in nodes.values()] == [3, 2, 1]
    demands = parse_operators(json.loads((EXAMPLES / "operators.json").read_text()), WORDCOUNT_JOB)
    assert demands == {"count": {"cpu": 0.8, "mem": 1024.0}, "split": {"cpu": 0.4}}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "top level must be a non-empty list"),
        ([{**NODE, "name": ""}], "node 0.name must be a non-empty string"),
        ([{k: v for k, v in NODE.items() if k != "cpu_used"}], "node 0 ('a') is missing cpu_used"),
        ([{**NODE, "mem_total": "8G"}], "node 0 ('a').mem_total must be a finite number"),
        ([{**NODE, "bw_used": True}], "node 0 ('a').bw_used must be a finite number"),
        ([{**NODE, "cpu_used": -1}], "node 0 ('a').cpu_used must be >= 0"),
        ([NODE, NODE], "node 1 ('a'): duplicate node name"),
        ([{**NODE, "gpu": 1}], "node 0 ('a'): unknown fields ['gpu']"),
        ([{**NODE, "history": [{"cpu_total": 4}]}], "node 0 ('a').history[0] is missing cpu_used"),
    ],
)
def test_bad_nodes_name_the_node_and_field(document, message):
    with pytest.raises(ValueError) as info:
        parse_nodes(document)
    assert message in str(info.value)


def test_bad_operators_name_the_operator():
    with pytest.raises(ValueError, match="'cuont' is not in topology 'wordcount'"):
        parse_operators({"cuont": {"cpu": 1}}, WORDCOUNT_JOB)
    with pytest.raises(ValueError, match="'count'.cpu must be a finite number"):
        parse_operators({"count": {"cpu": "lots"}}, WORDCOUNT_JOB)
    with pytest.raises(ValueError, match="only 'cpu' and/or 'mem'"):
        parse_operators({"count": {"gpu": 1}}, WORDCOUNT_JOB)


def test_report_on_two_nodes_by_hand():
    # Two equal nodes a, b (Q tie -> by name): primaries dealt a, b, a, b in topological order
    # (source a, split b, count a, sink b). Cluster 8 cores, 8192 MiB.
    # count: R = 0.5*0.5/8 + 0.5*512/8192 = 0.03125 + 0.03125 = 0.0625;
    #        P = 0.2 + 0.01875 + 0.3 = 0.51875 -> active; standby on b (a is its primary).
    # split: R = 0.5*0.3/8 + 0.5*256/8192 = 0.01875 + 0.015625 = 0.034375;
    #        P = 0.04 + 0.0103125 + 0.3 = 0.3503125; P_eff = 0.3603125 -> active; standby on a.
    # Intervals: C_initial = 60*0.5/(0.05*20) = 30 s for every operator.
    nodes = parse_nodes([NODE, {**NODE, "name": "b"}])
    report = explain(WORDCOUNT_JOB, nodes, PolicyConfig(priority_threshold=0.35))
    ops = {o["name"]: o for o in report["operators"]}
    assert [ops[n]["primary"] for n in ("source", "split", "count", "sink")] == ["a", "b", "a", "b"]
    assert ops["count"]["P"] == pytest.approx(0.51875)
    assert (ops["count"]["mode"], ops["count"]["standby"]) == ("active", "b")
    assert ops["split"]["P_eff"] == pytest.approx(0.3603125)
    assert (ops["split"]["mode"], ops["split"]["standby"]) == ("active", "a")
    assert ops["source"]["standby"] is None and ops["source"]["mode"] == "passive"
    assert {o["checkpoint_interval_s"] for o in report["operators"]} == {30.0}
    # Q of each node: 0.4*0.75 + 0.3*0.75 + 0.15 + 0.15 = 0.825, one sample scaled to the full
    # window of five: 0.825 * 2.3328755442 = 1.9246223240.
    assert [n["Q"] for n in report["nodes"]] == [pytest.approx(1.9246223240)] * 2
    assert report["cluster"] == {"cpu_total": 8.0, "mem_total": 8192.0}
    json.dumps(report)


def test_default_threshold_keeps_the_stateless_split_passive():
    # Same cluster as above: split P_eff 0.3603125 <= 0.4 (default), count 0.52875 > 0.4.
    nodes = parse_nodes([NODE, {**NODE, "name": "b"}])
    ops = {o["name"]: o for o in explain(WORDCOUNT_JOB, nodes, PolicyConfig())["operators"]}
    assert (ops["split"]["mode"], ops["split"]["standby"]) == ("passive", None)
    assert (ops["count"]["mode"], ops["count"]["standby"]) == ("active", "b")


def test_table_is_aligned():
    nodes = parse_nodes(json.loads((EXAMPLES / "nodes.json").read_text()))
    text = format_table(explain(WORDCOUNT_JOB, nodes, PolicyConfig()))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("operator"))
    count = next(line for line in lines if line.startswith("count"))
    # Columns line up: the mode column starts at the same offset in the header and a row.
    assert count.index("active") == header.index("mode")
    assert any(line.startswith("node-a") for line in lines)
