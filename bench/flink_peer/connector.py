"""Flink's Kafka connector for the peer's job (`manage.py bench --source kafka --peer flink`).

PyFlink's pip package ships no connector jars. The peer's job reads and writes Kafka with
Flink's own KafkaSource and KafkaSink, from `org.apache.flink:flink-sql-connector-kafka` (the
fat jar meant for PyFlink and SQL: the connector with its Kafka client shaded in). Connector
releases are versioned `<connector>-<Flink minor>`; Maven Central serves none for Flink 2.3, the
PyFlink installed (env.FLINK_VERSION). 5.0.0-2.2, the newest, built for Flink 2.2, runs on 2.3:
the peer's job reads and writes through it (tests/bench/flink_peer/test_kafka_job.py).

`fetch_kafka_connector()` copies the jar out of Maven Central with Maven once, into
`var/flink/connectors/` (progress through `say`, Maven's output to `maven.log` beside it), and
returns the cached jar afterwards without starting Maven. The job gets it as a pipeline jar
(`job.py --connector-jar`, `env.add_jars`), shipped with the job to the cluster; nothing in the
installed package is changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from bench.flink_peer.env import PROJECT_ROOT
from infra.kafka import DEPENDENCY_PLUGIN, DOWNLOADED, size_mb

KAFKA_CONNECTOR_GROUP = "org.apache.flink"
KAFKA_CONNECTOR_ARTIFACT = "flink-sql-connector-kafka"
KAFKA_CONNECTOR_VERSION = "5.0.0-2.2"
KAFKA_CONNECTOR = f"{KAFKA_CONNECTOR_GROUP}:{KAFKA_CONNECTOR_ARTIFACT}:{KAFKA_CONNECTOR_VERSION}"
CONNECTOR_DIR = PROJECT_ROOT / "var" / "flink" / "connectors"


def connector_jar(directory: Path = CONNECTOR_DIR, version: str = KAFKA_CONNECTOR_VERSION) -> Path:
    """Where the connector's jar is cached."""
    return directory / f"{KAFKA_CONNECTOR_ARTIFACT}-{version}.jar"


def maven_argv(mvn: str, version: str, output_dir: Path) -> list[str]:
    """Maven's command that copies the connector's jar (no dependencies: it is a fat jar) into
    `output_dir`, failing on a checksum that does not match."""
    return [
        mvn, "-B", "--strict-checksums", f"{DEPENDENCY_PLUGIN}:copy",
        f"-Dartifact={KAFKA_CONNECTOR_GROUP}:{KAFKA_CONNECTOR_ARTIFACT}:{version}:jar",
        f"-DoutputDirectory={output_dir}",
    ]  # fmt: skip


def fetch_kafka_connector(
    say=print, directory: Path = CONNECTOR_DIR, version: str = KAFKA_CONNECTOR_VERSION
) -> Path:
    """The connector's jar: from the cache, else fetched from Maven Central once (about 11 MB,
    plus Maven's dependency plugin into ~/.m2 the first time)."""
    jar = connector_jar(directory, version)
    if jar.is_file() and jar.stat().st_size > 0:
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (mvn) is needed once to fetch Flink's Kafka connector: apt-get install maven"
        )
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    log_path = directory / "maven.log"
    say(f"Flink's Kafka connector: fetching {KAFKA_CONNECTOR_GROUP}:{KAFKA_CONNECTOR_ARTIFACT}:"
        f"{version} from Maven Central into {directory} (once, about 11 MB)")  # fmt: skip
    started = time.monotonic()
    downloaded, downloaded_mb = 0, 0.0
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            maven_argv(mvn, version, partial),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=directory,
        )
        for line in proc.stdout:
            log.write(line)
            line = line.strip()
            if line.startswith(("Downloading from", "[INFO] Downloading from")) and (
                jar.name in line
            ):
                say(f"  downloading {jar.name} ...")
            found = DOWNLOADED.match(line)
            if found is None:
                continue
            downloaded += 1
            downloaded_mb += size_mb(found[2])
            name = found[1].rsplit("/", 1)[1]
            if name.endswith(".jar"):
                say(f"  {name}: {found[2]} ({downloaded} files, {downloaded_mb:.1f} MB so far)")
        code = proc.wait()
    copied = partial / jar.name
    if code != 0 or not copied.is_file():
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(
            f"Maven could not fetch {KAFKA_CONNECTOR_ARTIFACT} {version} (exit {code}):\n{tail}"
        )
    copied.rename(jar)
    shutil.rmtree(partial, ignore_errors=True)
    say(f"Flink's Kafka connector: {jar} ({jar.stat().st_size / 2**20:.1f} MB, "
        f"{time.monotonic() - started:.0f} s; Maven's log: {log_path})")  # fmt: skip
    return jar
