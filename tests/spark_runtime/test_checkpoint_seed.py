"""Seeding a standby's checkpoint from its primary's (spark_runtime/checkpoint_seed.py) on a
hand-built checkpoint layout: only what the latest commit covers is copied. The Spark side (a
seeded standby that resumes and takes over) is in test_failover.py."""

from __future__ import annotations

import json
import os

from spark_runtime.checkpoint_seed import (
    committed_batch,
    remove_orphan_temp_files,
    seed_checkpoint,
)


def touch(root, *parts, text="x"):
    path = os.path.join(root, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


def listing(root):
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


def primary_checkpoint(root):
    """Query 0 with batches 3..6 planned, 3..5 committed (6 in flight), RocksDB changelogs for
    state versions 4..7, a snapshot at 5, SSTs and metadata."""
    q = os.path.join(root, "0")
    touch(q, "metadata", text='{"id":"primary-query-id"}')
    for batch in (3, 4, 5, 6):
        touch(q, "offsets", str(batch), text=f"offsets {batch}")
        touch(q, "offsets", f".{batch}.crc")
    for batch in (3, 4, 5):
        touch(q, "commits", str(batch))
        touch(q, "commits", f".{batch}.crc")
    for version in (4, 5, 6, 7):
        touch(q, "state", "0", "0", f"{version}.changelog")
        touch(q, "state", "0", "0", f".{version}.changelog.crc")
    touch(q, "state", "0", "0", "5.zip")
    touch(q, "state", "0", "0", "SSTs", "000008-abc.sst")
    touch(q, "state", "0", "_metadata", "metadata")
    touch(q, "state", "0", "0", "_metadata", "schema")
    touch(q, "offsets", ".7.tmp")  # a temp file of a write in progress


def test_the_copy_stops_at_the_latest_commit_and_its_state_version(tmp_path):
    source, target = str(tmp_path / "primary"), str(tmp_path / "standby")
    primary_checkpoint(source)
    assert seed_checkpoint(source, target, queries=1) == {"0": 5}
    assert committed_batch(os.path.join(target, "0")) == 5
    assert listing(target) == sorted(
        [f"0/offsets/{b}" for b in (3, 4, 5)]
        + [f"0/offsets/.{b}.crc" for b in (3, 4, 5)]
        + [f"0/commits/{b}" for b in (3, 4, 5)]
        + [f"0/commits/.{b}.crc" for b in (3, 4, 5)]
        # State version = batch + 1: versions up to 6 (commit 5), not 7 (batch 6 in flight).
        + [f"0/state/0/0/{v}.changelog" for v in (4, 5, 6)]
        + [f"0/state/0/0/.{v}.changelog.crc" for v in (4, 5, 6)]
        + ["0/state/0/0/5.zip", "0/state/0/0/SSTs/000008-abc.sst"]
        + ["0/state/0/_metadata/metadata", "0/state/0/0/_metadata/schema"]
        + ["0/metadata"]
    )
    # Spark needs the metadata file beside the logs; the copy runs under a new query id.
    with open(os.path.join(target, "0", "metadata")) as handle:
        query_id = json.load(handle)["id"]
    assert query_id != "primary-query-id" and len(query_id) == 36
    with open(os.path.join(target, "0", "offsets", "5")) as handle:
        assert handle.read() == "offsets 5"


def test_a_replica_with_its_own_commits_is_not_reseeded_and_an_empty_source_starts_empty(
    tmp_path,
):
    source, target = str(tmp_path / "primary"), str(tmp_path / "standby")
    primary_checkpoint(source)
    touch(target, "0", "commits", "9")
    assert seed_checkpoint(source, target, queries=1) == {}
    assert committed_batch(os.path.join(target, "0")) == 9
    empty = str(tmp_path / "empty")
    fresh = str(tmp_path / "fresh")
    assert seed_checkpoint(empty, fresh, queries=2) == {"0": None, "1": None}
    assert listing(fresh) == []
    assert not os.path.exists(fresh + ".seeding")


def test_temp_files_of_an_interrupted_write_are_removed_and_nothing_else(tmp_path):
    q = str(tmp_path / "0")
    touch(q, "metadata", text='{"id":"q"}')
    touch(q, "offsets", "0")
    touch(q, "offsets", ".0.crc")
    touch(q, "offsets", ".1.16fa0bab-dbc0-4fd2-916d-9e65ce05f2e7.tmp", text="")
    touch(q, "offsets", "..1.16fa0bab-dbc0-4fd2-916d-9e65ce05f2e7.tmp.crc", text="")
    touch(q, "commits", ".0.0f0e.tmp", text="")
    touch(q, "state", "0", "0", ".1.changelog.abc.tmp")  # the state store's own business
    removed = remove_orphan_temp_files(q)
    assert removed == [
        "commits/.0.0f0e.tmp",
        "offsets/..1.16fa0bab-dbc0-4fd2-916d-9e65ce05f2e7.tmp.crc",
        "offsets/.1.16fa0bab-dbc0-4fd2-916d-9e65ce05f2e7.tmp",
    ]
    assert listing(q) == [
        "metadata", "offsets/.0.crc", "offsets/0", "state/0/0/.1.changelog.abc.tmp",
    ]  # fmt: skip
    assert remove_orphan_temp_files(q) == []  # idempotent
    assert remove_orphan_temp_files(str(tmp_path / "missing")) == []
