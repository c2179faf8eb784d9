"""Word counts from one Kafka topic to another, written for Spark's own Kafka connector.

A plain Structured Streaming app (no Backstop imports). It reads lines of text from
--in-topic, counts the words (update mode) and writes each count that changed to --out-topic:
key the word, value the count as text. Under Backstop it runs unchanged: where Spark's Kafka
connector is not installed, the stage process serves `format("kafka")` itself (docs/JOBS.md).

    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:VERSION \
        kafka_word_counts.py --bootstrap HOST:PORT --in-topic lines --out-topic counts
"""

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

parser = argparse.ArgumentParser()
parser.add_argument("--bootstrap", required=True)
parser.add_argument("--in-topic", required=True)
parser.add_argument("--out-topic", required=True)
args = parser.parse_args()

spark = SparkSession.builder.appName("kafka-word-counts").getOrCreate()
lines = (
    spark.readStream.format("kafka")
    .option("kafka.bootstrap.servers", args.bootstrap)
    .option("subscribe", args.in_topic)
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", 500)
    .load()
)
words = lines.select(F.explode(F.split(F.col("value").cast("string"), r"\s+")).alias("word"))
counts = words.where(F.col("word") != "").groupBy("word").count()
query = (
    counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))
    .writeStream.format("kafka")
    .option("kafka.bootstrap.servers", args.bootstrap)
    .option("topic", args.out_topic)
    .outputMode("update")
    .queryName("word-counts")
    .start()
)
query.awaitTermination()
