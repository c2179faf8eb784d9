"""Figure builders: small literal inputs in, assertions on traces and shapes out. No database."""

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from console.dash.common import ACTIVE, FAULT, PASSIVE, RECOVERY, count_of
from console.dash.job import figures as job_figures
from console.dash.overview import figures as overview_figures
from console.dash.placement import figures as placement_figures
from console.dash.recoveries import figures as recovery_figures
from console.dash.resources import figures as resource_figures
from console.policy.config import PolicyConfig

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _ts(value) -> pd.Timestamp:
    stamp = pd.Timestamp(value)
    return stamp if stamp.tzinfo else stamp.tz_localize(UTC)


def _hlines(fig):
    return [s for s in fig.layout.shapes if s.type == "line" and s.y0 == s.y1]


def _node(name, q, state="up", cpu_util=0.5, mem_util=0.5, cpu_total=4.0, mem=8192.0, **idle):
    return {
        "name": name,
        "state": state,
        "q_score": q,
        "cpu_util": cpu_util,
        "mem_util": mem_util,
        "cpu_total": cpu_total,
        "mem_total_mb": mem,
        "cpu_idle": idle.get("cpu_idle", None if cpu_util is None else 1 - cpu_util),
        "mem_idle": idle.get("mem_idle", None if mem_util is None else 1 - mem_util),
        "disk_idle": idle.get("disk_idle", 0.9),
        "bw_idle": idle.get("bw_idle", 0.8),
    }


# --- overview ------------------------------------------------------------------------------


def test_utilisation_figure_plots_percent_and_marks_the_reserve_limit():
    frame = pd.DataFrame(
        {"at": [T0, T0 + timedelta(seconds=5)], "cpu": [0.25, 0.5], "mem": [0.1, 0.2]}
    )
    fig = overview_figures.utilisation_figure(frame, reserve=0.2)
    assert [t.name for t in fig.data] == ["CPU", "Memory"]
    assert list(fig.data[0].y) == [25.0, 50.0]
    assert [line.y0 for line in _hlines(fig)] == [80.0]


def test_throughput_figure_has_one_line_per_job():
    frame = pd.DataFrame({"at": [T0, T0, T0], "job_id": [1, 2, 2], "value": [10.0, 20.0, 30.0]})
    fig = overview_figures.throughput_figure(frame, {1: "a", 2: "b"})
    assert [t.name for t in fig.data] == ["a", "b"]
    assert list(fig.data[1].y) == [20.0, 30.0]


# --- job page ------------------------------------------------------------------------------

OPERATORS = [
    {"name": "left", "kind": "source", "upstream": [], "mode": "passive", "priority": 0.1},
    {"name": "right", "kind": "source", "upstream": [], "mode": "passive", "priority": 0.1},
    {
        "name": "join",
        "kind": "join",
        "upstream": ["left", "right"],
        "mode": "active",
        "priority": 0.7,
    },
    {"name": "sink", "kind": "sink", "upstream": ["join"], "mode": "passive", "priority": 0.2},
]


def test_dag_positions_put_each_operator_one_layer_after_its_deepest_input():
    positions = job_figures.dag_positions(OPERATORS)
    assert {name: x for name, (x, _) in positions.items()} == {
        "left": 0.0,
        "right": 0.0,
        "join": 1.0,
        "sink": 2.0,
    }
    assert positions["left"][1] != positions["right"][1]


def test_dag_figure_colours_operators_by_mode_and_labels_priority():
    fig = job_figures.dag_figure(OPERATORS, threshold=0.4)
    by_colour = {t.marker.color: list(t.text) for t in fig.data}
    assert by_colour[ACTIVE] == ["<b>join</b><br>P=0.70"]
    assert len(by_colour[PASSIVE]) == 3
    assert any("P=0.20" in label for label in by_colour[PASSIVE])
    # One arrow per edge.
    assert len(fig.layout.annotations) == 3


def test_history_figure_has_a_legend_entry_per_operator_and_the_threshold():
    frame = pd.DataFrame(
        {
            "at": [T0, T0 + timedelta(seconds=5), T0],
            "stage": ["join", "join", "sink"],
            "name": ["priority", "priority", "checkpoint_interval_s"],
            "value": [0.6, 0.7, 12.0],
        }
    )
    fig = job_figures.history_figure(frame, ["join", "sink"], threshold=0.4)
    assert [t.name for t in fig.data if t.showlegend] == ["join", "sink"]
    join_priority = next(t for t in fig.data if t.name == "join" and t.yaxis == "y")
    assert list(join_priority.y) == [0.6, 0.7]
    assert [line.y0 for line in _hlines(fig)] == [0.4]


# --- placement ------------------------------------------------------------------------------


def test_cluster_free_weights_each_node_by_its_capacity():
    nodes = [
        _node("big", 1.0, cpu_util=0.5, cpu_total=6.0, mem_util=0.0),
        _node("small", 1.0, cpu_util=1.0, cpu_total=2.0, mem_util=None),
    ]
    free = placement_figures.cluster_free(nodes)
    assert free["cpu"] == pytest.approx(1 - (3.0 + 2.0) / 8.0)
    assert free["mem"] == pytest.approx(1.0)  # only the node that reported counts


def test_nodes_are_ordered_by_q_with_unknown_last():
    nodes = [_node("a", 0.5), _node("b", None), _node("c", 1.5)]
    assert [n["name"] for n in placement_figures.by_q(nodes)] == ["c", "a", "b"]


def test_idle_figure_draws_the_reserve_line_and_the_cluster_bars():
    nodes = [_node("a", 2.0, cpu_util=0.6, mem_util=0.3), _node("b", 1.0, cpu_util=0.2)]
    fig = placement_figures.idle_figure(nodes, reserve=0.25)
    assert [line.y0 for line in _hlines(fig)] == [25.0]
    cpu = fig.data[0]
    assert list(cpu.x) == ["a", "b", "cluster"]
    assert cpu.y[0] == pytest.approx(40.0)
    assert cpu.y[2] == pytest.approx(60.0)  # 1 - (0.6*4 + 0.2*4) / 8
    disk = fig.data[2]
    assert disk.y[2] is None  # no cluster figure for disk


def test_q_figure_lists_nodes_highest_q_first_and_marks_down_nodes():
    nodes = [_node("a", 0.5), _node("b", 1.5, state="down")]
    fig = placement_figures.q_figure(nodes, scale=2.33)
    bar = fig.data[0]
    assert list(bar.y) == ["b", "a"]
    assert list(bar.marker.color)[0] == FAULT
    # The whole scale is shown and its top marked: a Q of 1.5 reads as fairly idle, not "over".
    assert fig.layout.xaxis.range == (0, pytest.approx(2.33 * 1.05))
    assert [shape.x0 for shape in fig.layout.shapes] == [2.33]
    assert "2.33 = fully idle" in fig.layout.title.text


def test_q_scale_note_says_what_q_adds_up_and_its_range():
    # Defaults: five samples weighted e^(-0.5k) = 1, 0.61, 0.37, 0.22, 0.14; their sum 2.33 is
    # the Q of a node idle on every resource in all five.
    note = placement_figures.q_scale_note(PolicyConfig().to_dict())
    assert "newest 5 samples" in note
    assert "0.4·CPU idle + 0.3·memory idle + 0.15·disk idle + 0.15·bandwidth idle" in note
    assert "weighted 1, 0.61, 0.37, 0.22, 0.14 (decay λ = 0.5)" in note
    assert "Q runs from 0 to 2.33" in note and "values above 1 are normal" in note
    # Three samples without decay: Q runs from 0 to 3.
    note = placement_figures.q_scale_note({**PolicyConfig().to_dict(), "q_samples": 3,
                                           "q_decay_lambda": 0.0})  # fmt: skip
    assert "weighted 1, 1, 1" in note and "Q runs from 0 to 3.00" in note


def _standby(node, rule="", reason="", reserve="", primary="a"):
    return {"job_id": 1, "job": "wc", "stage": "count", "replica_id": "wc/count-2",
            "state": "running", "node": node, "primary_node": primary, "rule": rule,
            "reason": reason, "reserve": reserve, "judged_at": None}  # fmt: skip


def test_standby_explanations_rank_the_node_among_alive_nodes_and_keep_the_verdict():
    # Alive nodes by Q: c 2.2, b 1.7, a 1.3; d is down (its Q is not ranked).
    nodes = [_node("a", 1.3), _node("b", 1.7), _node("c", 2.2), _node("d", 2.3, state="down")]
    kept = "kept: the best other node, c would have Q 1.95 with this standby vs 1.70 on b, ..."
    rows = placement_figures.standby_explanations(
        [
            _standby("b", "kept", kept, "kept after this cycle: cpu 58% / mem 75% free vs 20%"),
            _standby("d"),
        ],
        nodes,
    )
    on_b, on_d = rows
    assert (on_b["q"], on_b["q_rank"], on_b["rule"], on_b["reason"]) == (1.7, "#2 of 3", "kept",
                                                                           kept)  # fmt: skip
    assert on_b["reserve"].startswith("kept after this cycle")
    # A standby the policy has not judged yet (the supervisor's replacement) says so.
    assert (on_d["q_rank"], on_d["rule"]) == ("not ranked (down or no Q)", "not judged yet")
    assert on_d["reason"].startswith("No policy verdict yet")
    assert on_d["reserve"] == "—"


# --- recoveries -----------------------------------------------------------------------------


def _episode(**fields):
    base = {
        "id": 1,
        "job_id": 1,
        "detected_at": T0,
        "recovered_at": T0 + timedelta(seconds=20),
        "downtime_s": 4.0,
        "recovery_time_s": 20.0,
    }
    return {**base, **fields}


def test_episode_windows_split_downtime_and_catch_up():
    downtime, recovery = recovery_figures.episode_windows(_episode(), now=T0 + timedelta(hours=1))
    assert downtime == (T0, T0 + timedelta(seconds=4))
    assert recovery == (T0 + timedelta(seconds=4), T0 + timedelta(seconds=20))


def test_open_episode_is_shaded_until_now():
    now = T0 + timedelta(seconds=30)
    episode = _episode(recovered_at=None, downtime_s=None, recovery_time_s=None)
    downtime, recovery = recovery_figures.episode_windows(episode, now=now)
    assert downtime == (T0, now)
    assert recovery is None


def test_timeline_figure_shades_windows_and_marks_faults_at_the_given_times():
    series = pd.DataFrame(
        {
            "at": [T0 - timedelta(seconds=5), T0, T0 + timedelta(seconds=5)],
            "job_id": [1, 1, 1],
            "name": ["throughput_eps", "throughput_eps", "latency_p99_ms"],
            "value": [100.0, 0.0, 900.0],
        }
    )
    fault_at = T0 - timedelta(seconds=1)
    faults = [
        {
            "id": 7,
            "job_id": 1,
            "at": fault_at,
            "kind": "kill-driver",
            "target": "count",
            "outcome": "injected",
        }
    ]
    jobs = [{"id": 1, "name": "wc", "strategy": "adaptive"}]
    fig = recovery_figures.timeline_figure(jobs, series, [_episode()], faults, now=T0)

    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    downtime = [r for r in rects if r.fillcolor == FAULT]
    catch_up = [r for r in rects if r.fillcolor == RECOVERY]
    assert len(downtime) == 2 and len(catch_up) == 2  # both panels
    assert {(_ts(r.x0), _ts(r.x1)) for r in downtime} == {(_ts(T0), _ts(T0 + timedelta(seconds=4)))}
    assert {(_ts(r.x0), _ts(r.x1)) for r in catch_up} == {
        (_ts(T0 + timedelta(seconds=4)), _ts(T0 + timedelta(seconds=20)))
    }
    vlines = [s for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1]
    assert {_ts(v.x0) for v in vlines} == {_ts(fault_at)}
    markers = next(t for t in fig.data if t.name == "fault")
    assert list(markers.hovertext) == ["kill-driver on count (injected)"]
    throughput = next(t for t in fig.data if t.name == "throughput (ev/s)")
    assert list(throughput.y) == [100.0, 0.0]


def test_timelines_of_two_jobs_sit_side_by_side():
    series = pd.DataFrame(columns=["at", "job_id", "name", "value"])
    jobs = [
        {"id": 1, "name": "a", "strategy": "adaptive"},
        {"id": 2, "name": "b", "strategy": "restart-all"},
    ]
    fig = recovery_figures.timeline_figure(jobs, series, [], [], now=T0)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["a · adaptive", "b · restart-all"]
    assert fig.layout.xaxis2.domain[0] > fig.layout.xaxis.domain[1]


def test_strategy_figure_shows_mean_downtime_and_recovery_per_strategy():
    rows = [
        {"strategy": "adaptive", "downtime_s": 2.0, "recovery_time_s": 8.0},
        {"strategy": "restart-all", "downtime_s": 24.0, "recovery_time_s": None},
    ]
    fig = recovery_figures.strategy_figure(rows)
    assert list(fig.data[0].x) == ["adaptive", "restart-all"]
    assert list(fig.data[0].y) == [2.0, 24.0]
    assert list(fig.data[1].text) == ["8.0", ""]


# --- resources ------------------------------------------------------------------------------


def test_resources_figure_has_four_panels_with_one_line_per_node_in_percent():
    frame = pd.DataFrame(
        {
            "at": [T0, T0, T0],
            "node_id": [1, 2, 1],
            "name": ["cpu_util", "cpu_util", "net_util"],
            "value": [0.5, 0.25, 0.1],
        }
    )
    fig = resource_figures.resources_figure(frame, {1: "node-a", 2: "node-b"})
    assert len(fig.data) == 2 * 4
    assert [t.name for t in fig.data if t.showlegend] == ["node-a", "node-b"]
    cpu_a = next(t for t in fig.data if t.name == "node-a" and t.yaxis == "y")
    net_a = next(t for t in fig.data if t.name == "node-a" and t.yaxis == "y4")
    assert list(cpu_a.y) == [50.0]
    assert list(net_a.y) == [pytest.approx(10.0)]
    # A node keeps its colour in every panel.
    assert len({t.line.color for t in fig.data if t.name == "node-a"}) == 1


def test_counts_are_said_in_the_singular_for_one():
    assert count_of(1, "job") == "1 job"
    assert count_of(0, "job") == "0 jobs"
    assert count_of(1, "primary", "primaries") == "1 primary"
    assert count_of(3, "primary", "primaries") == "3 primaries"
