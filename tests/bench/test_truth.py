"""Ground truth and comparison on inputs small enough to count by hand."""

import json

import pytest

from console.bench import truth


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
