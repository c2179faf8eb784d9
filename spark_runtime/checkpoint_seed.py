"""Checkpoint files: seeding a new standby from a consistent copy of its primary's checkpoint,
and clearing what a killed writer left behind.

A standby started after a promotion used to replay the whole input from an empty checkpoint,
so it could not take over for minutes. Instead it starts from a copy of its primary's latest
committed micro-batch C, per query of the stage (`{checkpoint}/{query index}/`):

- `offsets/` and `commits/` up to C: on start Spark sees commit C and runs C + 1 from the end
  offsets of C (MicroBatchExecution reads the latest offsets and commit files);
- `state/`: every file, except versioned state files (`V.changelog`, `V.zip`, `V.delta`,
  `V.snapshot` and their `.crc` sidecars) above version C + 1, which belong to the batch in flight
  (state version = batch id + 1); the RocksDB SST folders and `_metadata/` come along whole;
- `sources/` whole when present;
- `metadata` written anew with a fresh query id (Spark refuses a checkpoint that has offsets but
  no metadata file), so the primary and the standby never share a query id.

The primary keeps running while it is copied: Spark writes offsets and commits by rename, and
state files of version <= C + 1 are complete once commit C exists, so the copy is consistent as
long as it takes only what commit C covers. A file the primary's maintenance deletes meanwhile
(an old version) is skipped. The copy is built beside the target and renamed into place, so a
process killed while seeding leaves either no checkpoint or a whole one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid

log = logging.getLogger(__name__)

# `12`, `.12.crc`, `12.changelog`, `.12.changelog.crc`, `12.zip`...
VERSIONED = re.compile(r"^\.?(\d+)(\.(changelog|zip|delta|snapshot))?(\.crc)?$")
# Spark writes an offsets or commits entry N as `.N.<uuid>.tmp` (with `..N.<uuid>.tmp.crc`) and
# renames it to `N`; a process killed in between leaves these behind.
ORPHAN_TEMP = re.compile(r"^\..+\.tmp(\.crc)?$")


def remove_orphan_temp_files(query_dir: str) -> list[str]:
    """Delete the temp files a killed writer left in a query checkpoint's offsets and commits
    logs; return their names. Call it only while no query runs on `query_dir`.

    Spark (4.3 here) refuses to start batch 0 when the offsets folder is not empty
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) and counts such a temp file: a stage SIGKILLed
    while writing its first offsets entry then failed at every restart, for ever. The temp file
    was never renamed into the log, so Spark never read it: deleting it loses nothing.
    """
    removed = []
    for log_name in ("offsets", "commits"):
        folder = os.path.join(query_dir, log_name)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in names:
            if ORPHAN_TEMP.match(name):
                try:
                    os.remove(os.path.join(folder, name))
                except FileNotFoundError:
                    continue
                removed.append(f"{log_name}/{name}")
    if removed:
        log.warning("%s: removed temp files of an interrupted write: %s", query_dir, removed)
    return sorted(removed)


def latest_batch(query_dir: str, log_name: str) -> int | None:
    """The latest batch with an entry in a query checkpoint's `log_name` log (`offsets`,
    `commits`), or None."""
    try:
        names = os.listdir(os.path.join(query_dir, log_name))
    except FileNotFoundError:
        return None
    batches = [int(n) for n in names if n.isdigit()]
    return max(batches) if batches else None


def committed_batch(query_dir: str) -> int | None:
    """The latest batch with a commit file in a query checkpoint, or None."""
    return latest_batch(query_dir, "commits")


def _version(name: str) -> int | None:
    match = VERSIONED.match(name)
    return int(match.group(1)) if match else None


def _copy_file(source: str, target: str) -> bool:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        shutil.copy2(source, target)
    except FileNotFoundError:
        return False  # deleted by the primary's maintenance since it was listed
    return True


def copy_query_checkpoint(source: str, target: str) -> int | None:
    """Copy the part of one query's checkpoint that its latest commit covers; returns that
    batch id, or None (nothing copied) when the source has no committed batch."""
    batch = committed_batch(source)
    if batch is None or not os.path.exists(os.path.join(source, "offsets", str(batch))):
        return None
    skipped = 0
    for log_dir in ("offsets", "commits"):
        for name in os.listdir(os.path.join(source, log_dir)):
            version = _version(name)
            if version is not None and version <= batch:
                copied = _copy_file(
                    os.path.join(source, log_dir, name), os.path.join(target, log_dir, name)
                )
                skipped += not copied
    for folder, limit in (("state", batch + 1), ("sources", None)):
        root = os.path.join(source, folder)
        for directory, _, files in os.walk(root):
            for name in files:
                version = _version(name) if limit is not None else None
                if version is not None and version > limit:
                    continue  # the batch in flight
                relative = os.path.relpath(os.path.join(directory, name), source)
                skipped += not _copy_file(
                    os.path.join(source, relative), os.path.join(target, relative)
                )
    if skipped:
        log.info("seed %s: %s files vanished while copying (old versions)", source, skipped)
    # Spark's StreamMetadata file: only the query id, which must not be the primary's.
    with open(os.path.join(target, "metadata"), "w") as metadata:
        json.dump({"id": str(uuid.uuid4())}, metadata)
    return batch


def seed_checkpoint(source: str, target: str, queries: int) -> dict[str, int | None]:
    """Give a new replica (checkpoint `target`) a copy of `source`'s latest committed state, for
    query indexes 0..queries-1; returns the batch copied per query (None: started empty).

    A no-op when `target` already has a committed batch: a replica restarting resumes its own
    checkpoint, it is not re-seeded.
    """
    if any(committed_batch(os.path.join(target, str(i))) is not None for i in range(queries)):
        return {}
    staging = f"{target}.seeding"
    shutil.rmtree(staging, ignore_errors=True)
    copied = {}
    for index in range(queries):
        copied[str(index)] = copy_query_checkpoint(
            os.path.join(source, str(index)), os.path.join(staging, str(index))
        )
    shutil.rmtree(target, ignore_errors=True)  # a start that died before its first commit
    os.makedirs(staging, exist_ok=True)
    os.replace(staging, target)
    log.info("seeded %s from %s: batches %s", target, source, copied)
    return copied
