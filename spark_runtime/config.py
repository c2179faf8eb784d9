"""The Spark configuration of every data-plane process, kept in one place."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# Small shuffles: a stage handles a few thousand records per batch on a 2-core machine, and the
# default 200 shuffle partitions would mean 200 state-store instances per stateful operator.
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Python workers are reused between tasks: starting one costs about a second.
    "spark.python.worker.reuse": "true",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.numRecentProgressUpdates": "10",
    # Keep fewer old batches in the checkpoint: stages run long and checkpoints are local.
    "spark.sql.streaming.minBatchesToRetain": "20",
}


def spark_master() -> str:
    """The Spark master: env SPARK_MASTER, else local[2]."""
    return os.environ.get("SPARK_MASTER") or DEFAULT_MASTER


def ensure_python_env() -> None:
    """Make Spark's Python workers run this interpreter (they need pyarrow, pandas, redis)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def build_session(app_name: str, extra_conf: dict | None = None):
    """Create (or reuse) the SparkSession of this process with the data-plane configuration.

    Also registers the Redis stream data source, so `spark.readStream.format("redis_stream")`
    works right away.
    """
    ensure_python_env()
    from pyspark.sql import SparkSession

    from spark_runtime.redis_source import RedisStreamDataSource

    builder = SparkSession.builder.appName(app_name).master(spark_master())
    for key, value in {**SPARK_CONF, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    log.info("starting SparkSession %s on %s", app_name, spark_master())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(RedisStreamDataSource)
    return spark


def configure_logging() -> None:
    """Log format of the data plane's processes (stages, spares, generators, the runner); py4j's
    own chatter only from warnings up."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
