"""Clicks per user per 10-second window, from JSON-lines files to JSON files.

A plain Structured Streaming app (no Backstop imports): it reads the JSON-lines files that
appear in --in, counts each user's clicks per 10 s event-time window once the watermark has
passed the window, and appends one JSON line per closed window to --out. The file sink is
exactly-once: a restarted query rewrites a batch's files and commits them once (the committed
files are listed in --out/_spark_metadata).

    spark-submit window_counts.py --in DIR --out DIR [--checkpoint DIR]

Input lines: {"user": "u1", "page": "home", "ts": "2026-11-28T10:00:01.500Z"}
"""

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

parser = argparse.ArgumentParser()
parser.add_argument("--in", dest="source", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--checkpoint", default=None)
args = parser.parse_args()

spark = (
    SparkSession.builder.appName("window-counts")
    .config("spark.sql.session.timeZone", "UTC")
    .getOrCreate()
)

clicks = (
    spark.readStream.schema("user STRING, page STRING, ts TIMESTAMP")
    .option("maxFilesPerTrigger", 2)
    .json(args.source)
)
counts = (
    clicks.withWatermark("ts", "5 seconds")
    .groupBy("user", F.window("ts", "10 seconds"))
    .agg(F.count(F.lit(1)).alias("clicks"))
    .select(
        "user",
        F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
        "clicks",
    )
)
writer = counts.writeStream.format("json").outputMode("append").option("path", args.out)
if args.checkpoint:
    writer = writer.option("checkpointLocation", args.checkpoint)
query = writer.trigger(processingTime="1 second").start()
query.awaitTermination()
