"""The environment of a stage process: what the data plane reads, and nothing else (no Django).

A stage process (a primary, a standby, a warm spare, the input generator, the class-data
archive's builder) runs users' job code. It is started (spark_runtime/launch.py) by a node
agent or the local runner, whose own environment holds the console's secrets: SECRET_KEY (which
signs sessions and password-reset links), DATABASE_URL, EMAIL_URL, METRICS_TOKEN,
OIDC_CLIENT_SECRET. Inherited, they would let a job read the database or forge an admin's
session. `stage_environment` is the one place that builds a stage's environment: from an
allow-list of names the data plane, Spark and Python read, plus the names an operator adds in
BACKSTOP_STAGE_ENV (comma-separated, e.g. the credentials of S3A checkpoints,
AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY); the console's secrets never, even when listed there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Extra names an operator lets through to stage processes (comma-separated).
EXTRA_ENV = "BACKSTOP_STAGE_ENV"

# The process basics, the JVM and Python, and the settings of the data plane a stage reads.
STAGE_NAMES = frozenset(
    {
        # The process: where programs, the home directory, temporary files and the locale are.
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
        "LD_LIBRARY_PATH",
        # Java and Hadoop (the checkpoints' file system).
        "JAVA_HOME", "JAVA_TOOL_OPTIONS", "HADOOP_HOME", "HADOOP_CONF_DIR", "HADOOP_USER_NAME",
        # Python: where the project and its packages are.
        "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING", "PYTHONHASHSEED", "VIRTUAL_ENV",
        # The data plane: its Redis and Kafka, its files and the JVM's options.
        "REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS", "BACKSTOP_VAR_DIR", "BACKSTOP_JOBS_DIR",
        "BACKSTOP_CHECKPOINT_ROOT", "BACKSTOP_CHECKPOINT_MIN_FREE_MB", "BACKSTOP_JVM_OPTIONS",
        "BACKSTOP_CDS_ARCHIVE", "BACKSTOP_NODE",
    }
)  # fmt: skip
# Spark's and PySpark's own settings (SPARK_HOME, SPARK_MASTER, SPARK_LOG_LEVEL,
# PYSPARK_PYTHON ...) and the locale's categories.
STAGE_PREFIXES = ("SPARK_", "PYSPARK_", "LC_")
# The console's secrets and its own connections: never given to a stage process.
NEVER = frozenset(
    {
        "SECRET_KEY", "DATABASE_URL", "EMAIL_URL", "EMAIL_HOST_PASSWORD", "METRICS_TOKEN",
        "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DJANGO_SETTINGS_MODULE",
        "OIDC_CLIENT_SECRET",
    }
)  # fmt: skip


def stage_environment(parent: Mapping[str, str] | None = None, **overrides: str) -> dict[str, str]:
    """The environment of a stage process started from a process with environment `parent`
    (default: this process's): the allowed names of `parent` (STAGE_NAMES, STAGE_PREFIXES and
    those listed in its BACKSTOP_STAGE_ENV), then `overrides`; never a name of NEVER."""
    parent = os.environ if parent is None else parent
    extra = {name.strip() for name in parent.get(EXTRA_ENV, "").split(",") if name.strip()}
    allowed = {
        name: value
        for name, value in parent.items()
        if name in STAGE_NAMES or name in extra or name.startswith(STAGE_PREFIXES)
    }
    environment = {**allowed, **overrides}
    return {name: value for name, value in environment.items() if name not in NEVER}
