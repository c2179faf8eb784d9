"""The periodic-collection benchmark's reading of a JVM's GC log and of its samples (pure: no
Spark is started)."""

from bench.dataplane.periodic_gc import label, parse_args, pauses, rss_at, variants
from spark_runtime.progress import percentiles

# Lines of a stage JVM's `-Xlog:gc` log as the benchmark's run of 2026-11-30 wrote them.
GC_LOG = """\
[0.005s][info][gc] Using Serial
[1.278s][info][gc] GC(0) Pause Young (Allocation Failure) 100M->23M(365M) 43.939ms
[1.801s][info][gc] GC(1) Pause Full (Metadata GC Threshold) 52M->24M(365M) 53.802ms
[4.319s][info][gc] GC(3) Pause Young (Allocation Failure) 129M->32M(365M) 9.853ms
[303.918s][info][gc] GC(160) Pause Full (System.gc()) 130M->110M(365M) 285.842ms
"""


def test_pauses_are_counted_by_kind_with_the_longest(tmp_path):
    log = tmp_path / "gc.log"
    log.write_text(GC_LOG)
    assert pauses(log) == {"Young": (2, 43.939), "Full": (2, 285.842)}


def test_an_empty_log_has_no_pause(tmp_path):
    log = tmp_path / "gc.log"
    log.write_text("[0.005s][info][gc] Using Serial\n")
    assert pauses(log) == {"Young": (0, 0.0), "Full": (0, 0.0)}


def test_the_batch_percentile_it_reports_is_the_nearest_rank():
    durations = list(range(200, 0, -1))  # 200..1 ms
    assert percentiles(durations, (50, 99)) == {"p50": 100, "p99": 198}
    assert percentiles(list(range(1, 101)), (99,))["p99"] == 99
    assert percentiles([7], (99,))["p99"] == 7


def test_rss_at_a_minute_is_the_first_sample_from_it():
    samples = [(0.5, 500.0), (2.1, 540.0), (4.9, 560.0), (5.4, 575.0)]
    assert rss_at(samples, 2) == 540.0
    assert rss_at(samples, 5) == 575.0
    assert rss_at(samples, 10) == 575.0  # past the run: its last sample


def test_extra_jvm_options_add_runs_at_the_first_interval():
    args = parse_args(["--intervals", "30min", "--extra-jvm-options=-Xms64m"])
    assert [label(*variant) for variant in variants(args)] == [
        "every 30min",
        "every 30min, -Xms64m",
    ]
    assert variants(parse_args([])) == [("30min", ""), ("5min", "")]
