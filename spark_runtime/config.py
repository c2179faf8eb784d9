"""The Spark configuration of every data-plane process, kept in one place."""

from __future__ import annotations

import logging
import os
import sys

from spark_runtime.class_sharing import sharing_options
from spark_runtime.env import env

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
    # What the driver's status store keeps of finished jobs, stages, tasks and SQL executions,
    # for the UI and the status API, which Backstop does not use. Spark keeps 1000 jobs, 1000
    # stages, 100000 tasks and 1000 executions: a stage runs a few jobs per micro-batch, so its
    # heap grew for most of an hour before the oldest were dropped (docs/RESULTS.md, "Driver
    # memory over time").
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.ui.retainedTasks": "1000",
    "spark.sql.ui.retainedExecutions": "50",
    # Keep fewer old batches in the checkpoint: stages run long and checkpoints are local.
    "spark.sql.streaming.minBatchesToRetain": "20",
    # Checkpoint files (offset and commit logs, state-store files) through Hadoop's FileSystem
    # API rather than its FileContext API, Spark's default. Without Hadoop's native library
    # (PySpark ships none), FileContext's rename looks up symbolic links by running `readlink`
    # as a child process of the JVM: about 78 processes per micro-batch of a wordcount stage,
    # and the offset and commit logs' writes took 29 ms each instead of 9. Through FileSystem a
    # local file's rename is a rename(2) of the file and one of its checksum file, as atomic as
    # the checkpoint needs (docs/RESULTS.md, "Batch cost: where it goes").
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}

# The JVM options of every driver and executor (`BACKSTOP_JVM_OPTIONS` replaces them; empty:
# none). A stage's JVM runs small micro-batches for hours, where the JIT's second tier (C2)
# buys little: its profiling and compiling took a new process's whole first minute (wordcount
# fused at a 0.5 s trigger: 133, 80, 72 and 64% of a core in its first four 15 s windows, 54%
# after two minutes), and a promoted standby, which had run one batch in 12, paid it again right
# after a fault, beside the new standby starting. C1 alone compiles once, cheaply; the serial
# collector drops G1's concurrent threads and remembered sets (one heap of at most 1 GB per
# process). Measured with `python -m bench.dataplane.jvm_options` (docs/RESULTS.md, "JVM
# options").
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
JVM_OPTIONS_ENV = "BACKSTOP_JVM_OPTIONS"


def jvm_options() -> str:
    """The extra JVM options of a data-plane process: `BACKSTOP_JVM_OPTIONS` if set (empty:
    none), else JVM_OPTIONS."""
    return env(JVM_OPTIONS_ENV, JVM_OPTIONS).strip()


# On a standalone cluster (SPARK_MASTER=spark://...) every stage process is an application of
# its own: a primary, its standby and the warm spares all hold executors at once. Without a cap
# the first application takes every core of the cluster and the others wait for ever. Two
# one-core executors per application: with the master's default spreading, they land on two
# workers, so a lost worker leaves the query an executor to run its tasks again on.
CLUSTER_CONF = {
    "spark.cores.max": "2",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    # A task of a lost executor is run again elsewhere (4 is also Spark's default on a cluster).
    "spark.task.maxFailures": "4",
}


def spark_master() -> str:
    """The Spark master: env SPARK_MASTER, else local[2]."""
    return env("SPARK_MASTER", "") or DEFAULT_MASTER


SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


def spark_log_level(value: str) -> str:
    """`value` as one of Spark's log levels; ValueError naming them if it is not one."""
    level = value.strip().upper()
    if level not in SPARK_LOG_LEVELS:
        raise ValueError(f"one of {', '.join(SPARK_LOG_LEVELS)}, got {value!r:.20}")
    return level


def session_conf(master: str, extra_conf: dict | None = None) -> dict[str, str]:
    """Every setting a data-plane session starts with on `master`: the common ones and the
    JVM options (`jvm_options`; the driver's also map the machine's class-data archive, see
    spark_runtime/class_sharing.py), the cluster's on a standalone master, then `extra_conf`.

    On a cluster the executors' Python workers run the driver's interpreter path
    (`spark.pyspark.python`), so every worker host needs Backstop installed at the same path
    (the Docker image does this)."""
    conf = dict(SPARK_CONF)
    options = jvm_options()
    # The class-data archive is this machine's: the driver maps it, executors (on a cluster,
    # other hosts) do not. A JVM ignores TMPDIR: the driver's temporary files (Spark's
    # artifacts, the native libraries it unpacks) follow it here, into a stage process's
    # scratch directory (spark_runtime/scratch.py).
    driver = f"{options} {sharing_options()} {tmpdir_option()}".strip()
    if driver:
        conf["spark.driver.extraJavaOptions"] = driver
    if options:
        conf["spark.executor.extraJavaOptions"] = options
    if master.startswith("spark://"):
        conf.update(CLUSTER_CONF)
        conf["spark.pyspark.python"] = env("PYSPARK_PYTHON", "") or worker_python()
    conf.update(extra_conf or {})
    return conf


def tmpdir_option() -> str:
    """The JVM option that puts its temporary files in TMPDIR, if TMPDIR is set ("" else)."""
    tmpdir = env("TMPDIR", "")
    return f"-Djava.io.tmpdir={tmpdir}" if tmpdir else ""


# The console script of spark_runtime/python_worker.py (pyproject.toml, [project.scripts]).
WORKER_PYTHON_SCRIPT = "backstop-python-worker"


def worker_python() -> str:
    """The interpreter Spark's Python workers run: this interpreter through the
    `backstop-python-worker` script installed beside it, which imports PySpark compiled from
    site-packages instead of from Spark's zip (spark_runtime/python_worker.py says why); this
    interpreter itself where the script is not installed."""
    script = os.path.join(os.path.dirname(sys.executable), WORKER_PYTHON_SCRIPT)
    return script if os.access(script, os.X_OK) else sys.executable


def stage_env_overrides(redis_url: str) -> dict[str, str]:
    """What a stage process or warm spare is given on top of the stage environment
    (spark_runtime/stage_env.py), whoever starts it (a node agent, the local runner): the data
    plane's Redis, and the interpreter of Spark's Python workers (the operator's PYSPARK_PYTHON,
    else `worker_python`)."""
    return {"REDIS_URL": redis_url, "PYSPARK_PYTHON": env("PYSPARK_PYTHON", "") or worker_python()}


def ensure_python_env() -> None:
    """Make Spark's Python workers run this interpreter (they need pyarrow, pandas, redis)."""
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def build_session(app_name: str, extra_conf: dict | None = None):
    """Create (or reuse) the SparkSession of this process with the data-plane configuration.

    Also registers the Redis stream and Kafka data sources, so
    `spark.readStream.format("redis_stream")` and `format("backstop_kafka")` work right away.
    """
    ensure_python_env()
    from pyspark.sql import SparkSession

    from spark_runtime.kafka_source import KafkaPlanDataSource
    from spark_runtime.redis_source import RedisStreamDataSource

    master = spark_master()
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in session_conf(master, extra_conf).items():
        builder = builder.config(key, value)
    log.info("starting SparkSession %s on %s", app_name, master)
    spark = builder.getOrCreate()
    # INFO shows the scheduler's view (lost executors, tasks run again) when a stage is slow.
    # setLogLevel does nothing for the level the root logger already has (INFO, shown from WARN
    # up in a PySpark driver), so INFO is reached through another level first.
    try:
        level = spark_log_level(env("SPARK_LOG_LEVEL", "") or "WARN")
    except ValueError as exc:
        raise ValueError(f"environment variable SPARK_LOG_LEVEL: {exc}") from exc
    if level == "INFO":
        spark.sparkContext.setLogLevel("DEBUG")
    spark.sparkContext.setLogLevel(level)
    spark.dataSource.register(RedisStreamDataSource)
    spark.dataSource.register(KafkaPlanDataSource)
    return spark


def configure_logging() -> None:
    """Log format of the data plane's processes (stages, spares, generators, the runner); py4j's
    own chatter only from warnings up."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
