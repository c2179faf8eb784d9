"""The old version's check of the new one's results during a result-preserving upgrade
(spark_runtime/result_check.py), with hand-made values: no Spark, no Redis."""

from __future__ import annotations

from spark_runtime.result_check import HISTORY, ResultCheck
from spark_runtime.sink import HashRow, version


def row(key: str, value: int, pos: int) -> HashRow:
    return HashRow(version(pos), key, str(value))


def stored(value: int, pos: int) -> tuple[str, str]:
    return str(value), version(pos)


def test_greens_value_is_compared_with_blues_value_in_force_at_its_version():
    # A count per key: blue saw "a" at input 10 (count 1) and 20 (count 2), its batch read up
    # to 25. Green wrote count 1 at 12: blue's value at 12 is the one from 10.
    check = ResultCheck()
    check.note_blue_values("results", [row("a", 1, 10), row("a", 2, 20)], version(25))
    check.compare_values("results", {"a": stored(1, 12)})
    assert (check.compared, check.differing) == (1, 0)
    # The same value of green is compared once, however often it is looked up.
    check.compare_values("results", {"a": stored(1, 12)})
    assert check.compared == 1
    # Green's next value, 3 at 22, against blue's 2 (from 20): a difference, named.
    check.compare_values("results", {"a": stored(3, 22)})
    assert (check.compared, check.differing) == (2, 1)
    assert check.report()["examples"] == ["results 'a': old 2, new 3"]


def test_what_blue_cannot_vouch_for_is_not_compared():
    check = ResultCheck()
    check.note_blue_values("results", [row("a", 5, 30)], version(40))
    # Green is ahead of blue: blue has not read up to 45, its value there is unknown.
    check.compare_values("results", {"a": stored(6, 45)})
    # A value from before blue's first one since the hand-over (blue wrote it itself).
    check.compare_values("results", {"a": stored(4, 25)})
    # Never written, or a key blue computed nothing for.
    check.compare_values("results", {"a": None, "b": stored(1, 31)})
    assert (check.compared, check.differing) == (0, 0)
    # Once blue has read that far, green's 6 at 45 is compared with blue's newest up to 45.
    check.note_blue_values("results", [row("a", 6, 44)], version(50))
    check.compare_values("results", {"a": stored(6, 45)})
    assert (check.compared, check.differing) == (1, 0)


def test_blue_keeps_a_few_values_of_a_key_and_looks_keys_up_in_turn():
    check = ResultCheck()
    rows = [row("a", n, n) for n in range(1, 20)]
    check.note_blue_values("results", rows, version(20))
    assert len(check.blue_values[("results", "a")]) == HISTORY
    # Green at 5: older than every value blue still keeps, so not comparable.
    check.compare_values("results", {"a": stored(5, 5)})
    assert check.compared == 0
    check.note_blue_values("results", [row(k, 1, 21) for k in "bcde"], version(21))
    looked_up = check.keys_to_look_up("results", 2) + check.keys_to_look_up("results", 2)
    looked_up += check.keys_to_look_up("results", 2)
    assert set(looked_up) == set("abcde")


def test_records_appended_once_per_key_are_paired_whichever_side_comes_first():
    check = ResultCheck()
    window = {"key": "u1|10", "clicks": "3"}
    check.note_appended("out", "u1|10", window, by_blue=True)
    check.note_appended("out", "u2|10", {"key": "u2|10", "clicks": "1"}, by_blue=False)
    assert check.compared == 0
    check.note_appended("out", "u1|10", dict(window), by_blue=False)
    check.note_appended("out", "u2|10", {"key": "u2|10", "clicks": "2"}, by_blue=True)
    assert (check.compared, check.differing) == (2, 1)
    assert check.examples == ["out 'u2|10': old clicks=2, key=u2|10, new clicks=1, key=u2|10"]


def test_a_value_versioned_by_its_batch_holds_only_until_the_batch_before_the_next_value():
    # A user job's rows carry their batch's end offset. Blue's batches end at 10, 20 and 30;
    # key "a" changed in the first (1) and the third (2): some input in (20, 30] changed it,
    # so blue's 1 is the key's value up to 20 only.
    check = ResultCheck()
    check.note_blue_values("results", [row("a", 1, 10)], version(10))
    check.note_blue_values("results", [row("b", 1, 20)], version(20))
    check.note_blue_values("results", [row("a", 2, 30)], version(30))
    check.compare_values("results", {"a": stored(1, 15)})  # green's batch ended at 15
    assert (check.compared, check.differing) == (1, 0)
    check.compare_values("results", {"a": stored(2, 25)})  # blue cannot say what "a" was at 25
    assert check.compared == 1
    check.compare_values("results", {"a": stored(2, 30)})
    assert (check.compared, check.differing) == (2, 0)
