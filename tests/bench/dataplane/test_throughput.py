"""The throughput ramp's pure parts (bench.dataplane.throughput): which operators a strategy
protects in the ramp, and how the capacity of a protected job is reported against restart-all's.
The ramp itself runs real Spark stages for minutes; its figures are in docs/RESULTS.md."""

from bench.dataplane.throughput import best_text, capacity_ratio, protected_operators


def ramp(strategy, passed_rates, failed_rate=None, topology="wordcount", fed=None):
    """A ramp's result: steps passed at `passed_rates` (fed in full, or at `fed` for the last),
    then one failed at `failed_rate`."""
    steps = [{"rate": r, "achieved": r, "p99": 1.0, "passed": True} for r in passed_rates]
    if fed is not None:
        steps[-1]["achieved"] = fed
    if failed_rate is not None:
        steps.append({"rate": failed_rate, "achieved": failed_rate, "p99": 7.0, "passed": False})
    best = steps[len(passed_rates) - 1]["achieved"] if passed_rates else None
    return {
        "topology": topology,
        "strategy": strategy,
        "best": best,
        "steps": steps,
        "input_bound": fed is not None,
    }


def test_adaptive_protects_the_stateful_count_and_restart_all_nothing():
    # wordcount's count keeps state across batches; split is stateless (docs/POLICY.md).
    assert protected_operators("wordcount", "adaptive") == {"count"}
    assert protected_operators("wordcount", "restart-all") == frozenset()
    assert protected_operators("wordcount", "local-restart") == frozenset()


def test_both_ceilings_reached_give_a_plain_share():
    results = [ramp("restart-all", [400, 800], 1600), ramp("adaptive", [400], 800)]
    assert capacity_ratio(results) == (
        "- wordcount: adaptive sustains 50% of restart-all's highest rate (both ceilings reached)."
    )


def test_a_share_against_a_ceiling_not_reached_says_it_is_a_bound():
    # adaptive passed every step the generator could feed: its ceiling is higher.
    results = [ramp("restart-all", [400], 800), ramp("adaptive", [400, 800], fed=700)]
    assert capacity_ratio(results) == (
        "- wordcount: adaptive sustains 175% of restart-all's highest rate "
        "(adaptive's ceiling was not reached: at least this much)."
    )
    results = [ramp("restart-all", [400, 800, 1600]), ramp("adaptive", [400], 800)]
    assert "25%" in capacity_ratio(results)
    assert "at most this much" in capacity_ratio(results)
    both = [ramp("restart-all", [400, 800]), ramp("adaptive", [400, 800])]
    assert "neither ceiling was reached" in capacity_ratio(both)


def test_no_share_without_both_strategies_or_a_passing_baseline():
    assert capacity_ratio([ramp("adaptive", [400], 800)]) == ""
    assert capacity_ratio([ramp("restart-all", [], 400), ramp("adaptive", [], 400)]) == ""


def test_the_highest_rate_is_the_rate_fed_and_a_bound_when_no_step_failed():
    assert best_text(ramp("adaptive", [400], 800), 400) == "400/s"
    assert best_text(ramp("adaptive", [400, 800]), 400) == ">= 800/s (every step passed)"
    assert best_text(ramp("adaptive", [400, 800], fed=700), 400) == (
        ">= 700/s (no step failed; the generator fed no more)"
    )
    assert best_text(ramp("adaptive", [], 400), 400) == "< 400/s"
