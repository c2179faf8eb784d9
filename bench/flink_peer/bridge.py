"""The bridge from a job's Redis input stream to files that Flink's FileSource reads.

PyFlink cannot define a source in Python, and Flink has no Redis Streams connector on PyPI; its
FileSource in continuous mode is the replayable source that PyFlink ships. So the bridge copies
the stream, in order, into a directory of line files (one JSON object per entry: the entry's
fields, as the generator wrote them), one file per read of the stream (at most every
`ROLL_S`). Each file is written under a hidden name and renamed when complete (the FileSource
skips names starting with "."), so Flink never reads half a file.

The file's name is the stream id of its first entry (zero-padded, so names sort in stream
order); a restarted bridge goes on after the last id of the newest file, so it neither skips nor
repeats an entry. The bridge adds latency of its own: it is measured and reported with the
Flink figures (`bridge_delay`), not hidden in them.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from spark_runtime import keys

log = logging.getLogger(__name__)

ROLL_S = 0.05  # the longest an entry waits in the bridge before its file is written
READ_COUNT = 2000


def file_name(stream_id: str) -> str:
    """`{ms:015d}-{seq:06d}.jsonl` for stream id `ms-seq`: names sort as ids do."""
    ms, seq = stream_id.split("-")
    return f"{int(ms):015d}-{int(seq):06d}.jsonl"


def last_bridged_id(directory: Path) -> str:
    """The stream id of the last entry in the newest complete file, or "0-0" (start)."""
    files = sorted(p for p in directory.glob("*.jsonl") if not p.name.startswith("."))
    if not files:
        return "0-0"
    lines = files[-1].read_text().splitlines()
    return json.loads(lines[-1])["_stream_id"]


def write_file(directory: Path, entries: list[tuple[str, dict]]) -> Path:
    """Write `entries` (stream id, fields) as one complete file; returns its path."""
    target = directory / file_name(entries[0][0])
    hidden = directory / f".{target.name}.tmp"
    with hidden.open("w") as out:
        for stream_id, fields in entries:
            out.write(json.dumps({**fields, "_stream_id": stream_id}) + "\n")
    hidden.rename(target)
    return target


def bridge_once(client, job: str, directory: Path, after: str, block_ms: int) -> tuple[str, int]:
    """Copy the entries after `after` (waiting up to `block_ms` for some) into one file;
    returns the last id copied (`after` when there was none) and how many were copied."""
    found = client.xread({keys.input_stream(job): after}, count=READ_COUNT, block=block_ms)
    if not found:
        return after, 0
    entries = found[0][1]
    write_file(directory, entries)
    return entries[-1][0], len(entries)


def bridge_delays(directory: Path) -> list[float]:
    """Seconds each bridged entry waited before its file was complete (file time - event
    time): the share of the Flink peer's latency that is the bridge's, not Flink's."""
    delays = []
    for path in directory.glob("*.jsonl"):
        written = path.stat().st_mtime
        for line in path.read_text().splitlines():
            ts = json.loads(line).get("ts")
            if ts is not None:
                delays.append(written - int(ts) / 1000.0)
    return delays


def run_bridge(client, job: str, directory: Path, stop=lambda: False) -> int:
    """Copy the input stream of `job` into `directory` until `stop()`; returns the entries
    copied by this run."""
    directory.mkdir(parents=True, exist_ok=True)
    after = last_bridged_id(directory)
    log.info("bridging %s into %s after %s", keys.input_stream(job), directory, after)
    copied = 0
    while not stop():
        started = time.monotonic()
        after, count = bridge_once(client, job, directory, after, block_ms=1000)
        if count:
            copied += count
            # Let a few more entries arrive, so that files are not one entry each.
            time.sleep(max(0.0, ROLL_S - (time.monotonic() - started)))
    return copied
