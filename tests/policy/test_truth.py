"""Ground truth and comparison on inputs small enough to count by hand."""

import json

import pytest

from console.policy import truth


def test_wordcount_cells_are_the_words_counted_by_hand():
    entries = [{"text": "a b a"}, {"text": "B c"}, {"text": ""}]
    assert truth.wordcount_cells(entries) == {"a": 2, "b": 2, "c": 1}


def test_topn_cells_keep_the_n_most_frequent_items_per_window():
    # window 10 s: [0, 10000) holds x x y z z z; [10000, 20000) holds y.
    ts_items = [(1, "x"), (2, "x"), (3, "y"), (9999, "z"), (5000, "z"), (4000, "z"), (10000, "y")]
    entries = [{"ts": str(ts), "item": item} for ts, item in ts_items]
    assert truth.topn_cells(entries, window_seconds=10, n=2) == {
        "0|z": 3,
        "0|x": 2,
        "10000|y": 1,
    }


def test_topn_ties_are_broken_by_item_name():
    entries = [{"ts": "1", "item": name} for name in ("b", "a", "c")]
    assert truth.topn_cells(entries, window_seconds=10, n=2) == {"0|a": 1, "0|b": 1}


def test_result_cells_read_the_stored_hash():
    assert truth.result_cells("wordcount", {"a": "3"}) == {"a": 3}
    stored = {"0": json.dumps([["z", 3], ["x", 2]])}
    assert truth.result_cells("topn", stored) == {"0|z": 3, "0|x": 2}


def test_compare_counts_shortfalls_as_lost_and_excess_as_duplicates():
    expected = {"a": 5, "b": 2, "c": 1}
    actual = {"a": 4, "b": 4, "d": 1}  # a: 1 lost, b: 2 dup, c: 1 lost, d: 1 dup
    result = truth.compare(expected, actual)
    assert (result.lost, result.duplicates, result.cells, result.wrong_cells) == (2, 3, 3, 4)
    assert not result.exact
    assert truth.compare(expected, dict(expected)).exact


def test_unchecked_topology_is_refused_by_name():
    with pytest.raises(ValueError, match="traffic"):
        truth.expected_cells("traffic", [], {})


# --- auditing a running job's output --------------------------------------------------------

LINES = [("1000-0", {"id": "u1", "text": "a b a"}), ("1001-0", {"id": "u2", "text": "b c"}),
         ("1002-0", {"id": "u3", "text": "a c c"})]  # fmt: skip


def position(entry_id: str) -> str:
    """A version naming the input entry `entry_id` (k = 0), as the sink writes it."""
    ms, seq = entry_id.split("-")
    return f"{int(ms) * 1_000_000 + int(seq):020d}{0:06d}"


def test_wordcount_audit_compares_each_count_with_the_input_up_to_its_version():
    # The job consumed lines 1 and 2: a=2 (last seen in line 1), b=2 and c=1 (line 2).
    results = {"a": "2", "b": "2", "c": "1"}
    versions = {"a": position("1000-0"), "b": position("1001-0"), "c": position("1001-0")}
    assert truth.audit_wordcount(LINES, results, versions) == truth.Comparison(0, 0, 3, 0)
    # A failover that applied line 1 twice to a: one duplicate; b lost an occurrence.
    doubled = {"a": "4", "b": "1", "c": "1"}
    assert truth.audit_wordcount(LINES, doubled, versions) == truth.Comparison(1, 2, 3, 2)


def test_wordcount_audit_counts_a_word_missing_below_the_furthest_version_as_lost():
    # c's count (line 2) is stored; b, seen in line 2 too, is missing: its 2 occurrences are lost.
    results = {"a": "2", "c": "1"}
    versions = {"a": position("1000-0"), "c": position("1001-0")}
    assert truth.audit_wordcount(LINES, results, versions) == truth.Comparison(2, 0, 3, 1)


def test_wordcount_audit_through_an_intermediate_stream_counts_up_to_the_word_position():
    # The count stage read split's stream: entry 5000-0 carries line u3's word 0 ("a"), 5000-1
    # its word 2 ("c"). a=3 up to u3 word 0; c=1 (line 2) + 2 of u3 up to word 2 = 3.
    via = {5000 * 1_000_000: "u3-0", 5000 * 1_000_000 + 1: "u3-2", 4000 * 1_000_000: "u2-0"}
    results = {"a": "3", "c": "3", "b": "2"}
    versions = {"a": position("5000-0"), "c": position("5000-1"), "b": position("4000-0")}
    assert truth.audit_wordcount(LINES, results, versions, via) == truth.Comparison(0, 0, 3, 0)
    # c stored as 3 with a version naming u2's word 1 ("c"): the input up to there holds one c,
    # so 2 are duplicates; b (2, all before a's u3 word 0) is missing, so lost.
    via_short = {**via, 4000 * 1_000_000: "u2-1"}
    audit = truth.audit_wordcount(
        LINES, {"a": "3", "c": "3"}, {"a": versions["a"], "c": position("4000-0")}, via_short
    )
    assert (audit.lost, audit.duplicates) == (2, 2)


def test_topn_audit_checks_complete_windows_only():
    # 10 s windows; entries in windows 0, 10000 and 20000 ms; results up to window 30000, so
    # windows ending at or before 20000 are complete (0 and 10000).
    entries = [
        ("1-0", {"ts": "1000", "item": "x"}), ("2-0", {"ts": "2000", "item": "x"}),
        ("3-0", {"ts": "3000", "item": "y"}), ("4-0", {"ts": "12000", "item": "z"}),
        ("5-0", {"ts": "25000", "item": "q"}), ("6-0", {"ts": "31000", "item": "q"}),
    ]  # fmt: skip
    results = {
        "0": json.dumps([["x", 2], ["y", 1]]),
        "10000": json.dumps([["z", 2]]),  # one duplicate
        "20000": json.dumps([["q", 5]]),  # not complete yet: not judged
        "30000": json.dumps([["q", 1]]),
    }
    assert truth.audit_topn(entries, results, 10, 5) == truth.Comparison(0, 1, 3, 1)
    del results["0"]  # a complete window the results lack: its 3 events are lost
    assert truth.audit_topn(entries, results, 10, 5) == truth.Comparison(3, 1, 3, 3)


def test_user_output_audit_judges_settled_keys_and_keys_past_the_watermark_apart():
    settled = {"a": {"n": 2}, "b": {"n": 1}, "c": {"n": 5}}
    actual = {
        "a": [{"n": 2}],  # right
        # "b" missing: lost
        "c": [{"n": 7}],  # written past the watermark: right against the later reference
        "d": [{"n": 1}],  # past the watermark, a key the later reference lacks: a duplicate
        "e": [{"n": 1}, {"n": 1}],  # appended twice: one duplicate
    }
    later = {"c": {"n": 7}, "d": None, "e": {"n": 1}}
    audit = truth.audit_user_output(settled, later, actual)
    assert (audit.lost, audit.duplicates, audit.cells, audit.wrong_cells) == (1, 2, 4, 2)


def test_user_output_audit_can_leave_unwritten_keys_unjudged():
    """An appending aggregate writes a window only once the watermark passes it."""
    audit = truth.audit_user_output({"a": 1, "b": 2}, {}, {"a": [1]}, judge_lost=False)
    assert (audit.lost, audit.duplicates, audit.wrong_cells) == (0, 0, 0)
