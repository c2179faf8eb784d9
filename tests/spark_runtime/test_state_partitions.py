"""Reading a checkpoint's number of state partitions, and when it is not changed (spark_runtime/
state_partitions.py; the repartitioning itself runs on real Spark in test_user_jobs.py)."""

from __future__ import annotations

import json

from spark_runtime.state_partitions import match_partitions, recorded_partitions


def write_batches(query_dir, offsets: int, commits: int, partitions: str = "3") -> None:
    """Offsets entries 0..offsets-1 (as Spark writes them) and commits 0..commits-1."""
    (query_dir / "offsets").mkdir(parents=True)
    (query_dir / "commits").mkdir()
    (query_dir / "state" / "0" / "0").mkdir(parents=True)
    for batch in range(offsets):
        metadata = {"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": partitions}}
        (query_dir / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(metadata)}\n{{}}\n")
    for batch in range(commits):
        (query_dir / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_the_number_comes_from_the_newest_offsets_entry(tmp_path):
    assert recorded_partitions(tmp_path / "none") is None
    write_batches(tmp_path / "q", offsets=3, commits=3)
    assert recorded_partitions(tmp_path / "q") == 3
    (tmp_path / "q" / "offsets" / "10").write_text("v1\nnot json\n")
    assert recorded_partitions(tmp_path / "q") is None


def test_nothing_is_changed_without_state_with_the_same_number_or_an_uncommitted_batch(tmp_path):
    # No Spark is needed for any of these: `spark` is never touched.
    assert match_partitions(None, str(tmp_path / "stateless"), 4) is None
    write_batches(tmp_path / "same", offsets=2, commits=2, partitions="4")
    assert match_partitions(None, str(tmp_path / "same"), 4) == "4 partitions"
    write_batches(tmp_path / "crashed", offsets=3, commits=2)
    assert match_partitions(None, str(tmp_path / "crashed"), 4) == (
        "kept 3 partitions, not 4: its last batch is not committed"
    )
