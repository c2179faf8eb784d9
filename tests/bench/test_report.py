"""bench.md and bench.png from a bench.json-shaped dict."""

from bench.strategy import report


def run(strategy, recoveries, lost=0, dup=0):
    return {
        "strategy": strategy,
        "faults": [
            {
                "kind": "kill-driver",
                "at_s": 50.0 * (i + 1),
                "action": "promote",
                "downtime_s": None if r is None else r / 2,
                "recovery_time_s": r,
                "peak_p99_ms": None if r is None else 1000.0 * r,
                "note": "",
            }
            for i, r in enumerate(recoveries)
        ],  # fmt: skip
        "lost": lost,
        "duplicates": dup,
        "steady": {
            "p50_ms": 400.0,
            "p99_ms": 900.0,
            "throughput_eps": 99.0,
            "cpu_pct": 120.0,
            "rss_mb": 1500.0,
        },  # fmt: skip
        "series": {"t": [0, 1, 2], "throughput": [100, 0, 100], "p99_ms": [900, 1900, 900]},
    }


BENCH = {
    "settings": {"topology": "wordcount", "fault_kind": "kill-driver", "faults": 2},
    "runs": [run("restart-all", [20.0, 30.0]), run("adaptive", [2.0, 3.0]), run("x", [1.0, None])],
}


def test_ratios_divide_mean_recovery_by_restart_alls():
    restart_all, adaptive, unknown = BENCH["runs"]
    # restart-all: mean 25 s; adaptive: mean 2.5 s -> 10%; an unrecovered fault with no
    # watched time: n/a.
    assert report.ratio_text(adaptive, restart_all) == "10%"
    assert report.ratio_text(restart_all, restart_all) == "100%"
    assert report.ratio_text(unknown, restart_all) == "n/a"


def test_an_unrecovered_fault_makes_the_mean_a_bound():
    restart_all = run("restart-all", [None])
    restart_all["faults"][0]["watched_s"] = 55.0  # not back to normal within 55 s
    adaptive = run("adaptive", [5.5])
    assert report.recovery_bound(restart_all) == (55.0, True)
    assert report.ratio_text(adaptive, restart_all) == "< 10%"
    assert report.ratio_text(restart_all, adaptive) == "> 1000%"  # a bound over an exact value
    text = report.to_markdown({"settings": {}, "runs": [restart_all, adaptive]})
    assert "| restart-all | n/a | > 55.00 | n/a |" in text
    assert "| restart-all | 1: kill-driver | 50.0 | promote | n/a | n/a | > 55.0 |" in text


def test_markdown_has_a_row_per_strategy_and_per_fault():
    adaptive = run("adaptive", [2.0, 3.0])
    adaptive["faults"][0]["reprotect_s"] = 7.5  # a new standby caught up 7.5 s after promotion
    adaptive["faults"][0]["detected_after_s"] = 0.12  # the agent's exit report
    adaptive["steady"].update(
        pss_mb=1100.4, spares_cpu_pct=3.4, spares_rss_mb=912.5, spares_pss_mb=640.6
    )
    text = report.to_markdown({**BENCH, "runs": [BENCH["runs"][0], adaptive, BENCH["runs"][2]]})
    header = "| CPU % | RSS MB | PSS MB | spares CPU % | spares RSS MB | spares PSS MB |"
    assert header in text
    expected = (
        "| adaptive | 1.25 | 2.50 | 10% | 3000 | 0 | 0 | 400 | 900 | 99.0 | 120 | 1500 | 1100 "
        "| 3 | 912 | 641 |"
    )
    assert expected in text
    # A bench.json written before the spares and PSS were sampled has no such figures.
    summary = [line for line in text.splitlines() if line.startswith("| restart-all | 12.50 |")]
    assert len(summary) == 1 and summary[0].endswith("| 120 | 1500 | n/a | n/a | n/a | n/a |")
    restart_all = "| restart-all | 2: kill-driver | 100.0 | promote | n/a | 15.00 | 30.00 | 30000 |"
    assert restart_all + " n/a |  |" in text
    adaptive_row = "| adaptive | 1: kill-driver | 50.0 | promote | 0.12 | 1.00 | 2.00 | 2000 |"
    assert adaptive_row + " 7.5 |  |" in text
    assert "| x | n/a | n/a | n/a |" in text
    # restart-all keeps no spares; adaptive's memory counts its spares': 1500 + 912.5 MB RSS
    # against 1500 MB; restart-all's PSS was not sampled, so no PSS multiple.
    assert "Memory with idle warm spares, against restart-all's: adaptive RSS 1.61x" in text
    assert "PSS" not in text.split("Memory with idle warm spares")[1].splitlines()[0]


def test_output_still_catching_up_is_not_reported_as_plain_loss():
    behind = {**run("adaptive", [2.0]), "lost": 40, "drained": False, "drain_s": 300.0}
    text = report.to_markdown({"settings": {}, "runs": [behind]})
    assert "| 40 (not caught up after 300.0 s) |" in text


def test_png_is_written(tmp_path):
    report.plot_png(BENCH, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_flink_run_gets_the_backstop_vs_flink_table():
    flink = run("flink", [8.0, 12.0])
    flink["steady"]["p50_ms"] = 200.0
    flink["peer"] = {
        "flink_version": "2.3.0",
        "taskmanagers": 2,
        "parallelism": 1,
        "checkpoint_ms": 10000,
        "bundle_time_ms": 100,
        "failures": ["TaskManager lost", "TaskManager lost"],
        "bridge_p50_ms": 26.0,
        "bridge_p99_ms": 51.0,
        "extra_conf": {"heartbeat.timeout": "5000"},
    }
    adaptive = run("adaptive", [2.0, 3.0])  # mean 2.5 s of Flink's 10 s; p50 400 ms = 2x
    text = report.to_markdown({"settings": {}, "runs": [adaptive, flink]})
    assert "Backstop vs Flink 2.3.0" in text
    assert "exactly-once checkpoints every 10000 ms" in text
    assert "heartbeat.timeout 5000, 2 failure(s) in its exception history" in text
    assert "| RSS MB with spares | PSS MB with spares |" in text
    assert "| adaptive | 2.50 | 25% | 400 | 2.00x | 0 | 0 | 1500 | n/a |" in text
    assert "| flink | 10.00 | 100% | 200 | 1.00x | 0 | 0 | 1500 | n/a |" in text


def test_the_flink_table_says_where_each_faults_gap_went():
    flink = {**run("flink", [8.0, 12.0]), "peer": {"flink_version": "2.3.0"}}
    flink["faults"][0]["phases"] = {
        "detection_s": 0.27, "restart_delay_s": 0.5, "deployment_s": 1.4,
        "initialization_s": 9.9, "first_output_s": 0.61,
    }  # fmt: skip
    flink["faults"][1]["phases"] = {"detection_s": 0.8, "restart_delay_s": 0.51}
    text = report.to_markdown({"settings": {}, "runs": [run("adaptive", [2.0]), flink]})
    assert "| 1: kill-driver | 50.0 | 0.27 | 0.50 | 1.40 | 9.90 | 0.61 |" in text
    assert "| 2: kill-driver | 100.0 | 0.80 | 0.51 | n/a | n/a | n/a |" in text
    # Runs made before the phases were read have none: no table.
    del flink["faults"][0]["phases"], flink["faults"][1]["phases"]
    assert "Where Flink's gap went" not in report.to_markdown({"settings": {}, "runs": [flink]})


def test_without_a_flink_run_there_is_no_peer_table():
    assert "Backstop vs Flink" not in report.to_markdown(BENCH)


def test_the_flink_table_counts_backstops_idle_spares_as_flink_counts_its_spare():
    adaptive = run("adaptive", [2.0])
    adaptive["steady"].update(
        pss_mb=1000.0, spares_cpu_pct=3.0, spares_rss_mb=900.0, spares_pss_mb=600.0
    )
    flink = {**run("flink", [4.0]), "peer": {"flink_version": "2.1"}}
    flink["steady"]["pss_mb"] = 800.0
    # Sampled before spares and PSS were: its job's RSS alone, no PSS.
    older = run("restart-all", [20.0])
    lines = report.peer_lines([older, adaptive, flink], flink)
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    assert rows["| adaptive"].endswith("| 2400 | 1600 |")  # 1500 + 900, 1000 + 600
    assert rows["| restart-all"].endswith("| 1500 | n/a |")
    assert rows["| flink"].endswith("| 100% | 400 | 1.00x | 0 | 0 | 1500 | 800 |")


def test_the_header_names_the_policy_settings_of_the_runs():
    assert "stable window ? s.\n" in report.to_markdown(BENCH)
    settings = {**BENCH["settings"], "policy": [["warm_spares_per_node", "0"]]}
    text = report.to_markdown({**BENCH, "settings": settings})
    assert "stable window ? s, policy warm_spares_per_node=0.\n" in text
