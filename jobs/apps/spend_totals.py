"""Two queries over one input: each user's running spend, and every large purchase.

A plain Structured Streaming app (no Backstop imports) with two queries:

- `totals`: each user's running total and count of purchases, in update mode, written by
  foreachBatch to one JSON file per micro-batch (`--out/totals/batch-<id>.json`). A batch
  that runs again after a restart rewrites its own file with the same rows, so the newest
  file holding a user has the user's total;
- `large`: every purchase of at least --large, appended to JSON files in `--out/large` by
  the exactly-once file sink.

    spark-submit spend_totals.py --in DIR --out DIR [--large AMOUNT]

Input lines: {"user": "u1", "amount": 12, "ts": "2026-11-28T10:00:01.500Z"}
"""

import argparse
import json
import os

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

parser = argparse.ArgumentParser()
parser.add_argument("--in", dest="source", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--large", type=int, default=80)
args = parser.parse_args()

spark = (
    SparkSession.builder.appName("spend-totals")
    .config("spark.sql.session.timeZone", "UTC")
    .getOrCreate()
)
purchases = (
    spark.readStream.schema("user STRING, amount INT, ts TIMESTAMP")
    .option("maxFilesPerTrigger", 2)
    .json(args.source)
)

totals_dir = os.path.join(args.out, "totals")
os.makedirs(totals_dir, exist_ok=True)


def write_totals(batch, batch_id):
    """Write the batch's changed totals to its own file, atomically (write, then rename)."""
    rows = [row.asDict() for row in batch.collect()]
    final = os.path.join(totals_dir, f"batch-{batch_id}.json")
    with open(final + ".tmp", "w") as out:
        json.dump(rows, out)
    os.replace(final + ".tmp", final)


totals = (
    purchases.groupBy("user")
    .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("purchases"))
    .writeStream.queryName("totals")
    .outputMode("update")
    .foreachBatch(write_totals)
    .trigger(processingTime="1 second")
    .start()
)
large = (
    purchases.where(F.col("amount") >= args.large)
    .select("user", "amount", F.date_format("ts", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("ts"))
    .writeStream.queryName("large")
    .format("json")
    .option("path", os.path.join(args.out, "large"))
    .trigger(processingTime="1 second")
    .start()
)
spark.streams.awaitAnyTermination()
