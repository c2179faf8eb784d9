"""Record a real throughput/latency series across a stop and restart of a streaming query.

The recovery detector (`console.policy.recovery`) is tested on this recording so that it sees the
shape a real Spark query produces (slow first batches, a catch-up batch after restart, jitter),
not only synthetic curves.

What it does:

1. Starts a local[2] SparkSession with the RocksDB state store (changelog checkpointing on).
2. Runs `rate` source (RATE rows/s) -> groupBy(value % 10).count() -> noop sink, trigger 0.5 s,
   checkpointing into a temporary directory. A StreamingQueryListener records, for every
   micro-batch, the wall-clock time the progress event arrived, numInputRows, inputRowsPerSecond,
   processedRowsPerSecond and batchDuration.
3. After RUN_S seconds it stops the query (the "fault"), waits GAP_S seconds, restarts the same
   query from the same checkpoint (the rate source then catches up on the rows it owes) and runs
   RUN_S seconds more.
4. Resamples the batches onto a regular BUCKET_S (1 s) grid and writes
   `recorded_restart_series.json` next to this file.

Resampling (why and how): the detector needs an outage to be visible as samples, not as missing
samples. For each bucket, throughput = rows of the batches that completed in the bucket divided by
the bucket width (0 when none completed); the latency proxy = the longest batch duration (ms) of
those batches, or, when none completed, the time since the last batch completed (ms), because
every event waiting in that bucket has been waiting at least that long. Times are seconds since
the first query start.

Run it (about 1 minute; needs Java 17):

    cd /work/main
    PYSPARK_PYTHON=/work/main/.venv/bin/python .venv/bin/python tests/data/record_series.py
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

RATE = 1000  # rows per second from the rate source
TRIGGER = "0.5 seconds"
RUN_S = 25.0  # seconds each run lasts
GAP_S = 3.0  # seconds between stop and restart
BUCKET_S = 1.0  # resampling grid (the rate source releases rows once per second)
OUTPUT = Path(__file__).with_name("recorded_restart_series.json")


class BatchRecorder(StreamingQueryListener):
    """Collects one row per finished micro-batch; Spark calls it from a listener thread."""

    def __init__(self, clock_origin: float):
        self.origin = clock_origin
        self.rows: list[dict] = []
        self.lock = threading.Lock()

    def onQueryStarted(self, event):  # noqa: N802 (Spark's method names)
        pass

    def onQueryProgress(self, event):  # noqa: N802
        progress = event.progress
        row = {
            "t": time.time() - self.origin,
            "batch_id": progress.batchId,
            "num_input_rows": progress.numInputRows,
            "input_rows_per_second": progress.inputRowsPerSecond,
            "processed_rows_per_second": progress.processedRowsPerSecond,
            "batch_duration_ms": progress.batchDuration,
        }
        with self.lock:
            self.rows.append(row)

    def onQueryIdle(self, event):  # noqa: N802
        pass

    def onQueryTerminated(self, event):  # noqa: N802
        pass


def start_query(spark: SparkSession, checkpoint: str):
    """Start the recorded query: rate -> stateful count -> noop sink."""
    counts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", RATE)
        .load()
        .groupBy((F.col("value") % 10).alias("key"))
        .count()
    )
    return (
        counts.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=TRIGGER)
        .start()
    )


def resample(rows: list[dict], end: float) -> dict:
    """Put finished batches on a regular grid (see the module docstring for the rules)."""
    ordered = sorted(rows, key=lambda r: r["t"])
    phase = grid_phase(ordered)
    times, throughput, latency = [], [], []
    last_done = None
    i = 0
    hi = phase
    # Only whole buckets that end before the run ended: a partial last bucket would look empty.
    while hi + BUCKET_S <= end:
        lo, hi = hi, hi + BUCKET_S
        in_bucket = []
        while i < len(ordered) and ordered[i]["t"] < hi:
            if ordered[i]["t"] >= lo:
                in_bucket.append(ordered[i])
            i += 1
        times.append(round(hi, 3))
        if in_bucket:
            throughput.append(sum(r["num_input_rows"] for r in in_bucket) / BUCKET_S)
            latency.append(float(max(r["batch_duration_ms"] for r in in_bucket)))
            last_done = in_bucket[-1]["t"]
        else:
            throughput.append(0.0)
            latency.append(0.0 if last_done is None else round((hi - last_done) * 1000.0, 1))
    return {"times": times, "throughput": throughput, "latency_ms": latency}


def grid_phase(ordered: list[dict]) -> float:
    """Offset of the first bucket edge so that the steady batch cadence falls mid-bucket.

    The rate source releases rows once per second, so data-carrying batches finish about once
    per second at a fixed phase. Putting bucket edges half a bucket away from that phase keeps
    normal jitter from producing artificial empty or double buckets.
    """
    # Circular mean of the completion phases: a plain median breaks when they straddle 0.
    angles = [2 * math.pi * (r["t"] % BUCKET_S) / BUCKET_S for r in ordered if r["num_input_rows"]]
    if not angles:
        return 0.0
    mean_angle = math.atan2(sum(map(math.sin, angles)), sum(map(math.cos, angles)))
    phase = (mean_angle / (2 * math.pi)) * BUCKET_S
    return (phase + BUCKET_S / 2) % BUCKET_S


def main() -> None:
    """Run the stop/restart scenario and write the JSON recording."""
    checkpoint_dir = tempfile.mkdtemp(prefix="backstop-record-")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("backstop-record-series")
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark_version = spark.version
    try:
        origin = time.time()
        recorder = BatchRecorder(origin)
        spark.streams.addListener(recorder)
        query = start_query(spark, checkpoint_dir)
        time.sleep(RUN_S)
        stop_time = time.time() - origin
        query.stop()
        stopped_at = time.time() - origin
        time.sleep(GAP_S)
        restart_time = time.time() - origin
        query = start_query(spark, checkpoint_dir)
        time.sleep(RUN_S)
        query.stop()
        end = time.time() - origin
        # Listener events are delivered asynchronously; give the last ones a moment to land.
        time.sleep(1.0)
        with recorder.lock:
            rows = list(recorder.rows)
    finally:
        spark.stop()
        shutil.rmtree(checkpoint_dir, ignore_errors=True)

    series = resample(rows, end)
    document = {
        "description": "rate source (1000 rows/s) -> groupBy count (RocksDB state store) -> noop, "
        "trigger 0.5 s, local[2]; query stopped, then restarted from the same checkpoint. "
        "Produced by tests/data/record_series.py.",
        "pyspark_version": spark_version,
        "bucket_s": BUCKET_S,
        "rows_per_second": RATE,
        "stop_time_s": round(stop_time, 3),
        "stop_returned_s": round(stopped_at, 3),
        "restart_time_s": round(restart_time, 3),
        "end_s": round(end, 3),
        **series,
        "batches": rows,
    }
    OUTPUT.write_text(json.dumps(document, indent=1) + "\n")
    print(
        f"wrote {OUTPUT}: {len(rows)} batches, stop at {stop_time:.1f} s, "
        f"restart at {restart_time:.1f} s, end at {end:.1f} s"
    )


if __name__ == "__main__":
    main()
