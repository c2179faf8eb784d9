"""The Apache Kafka broker Backstop starts itself: its jars, its configuration, its process.

Backstop reads from and writes to Kafka. Where no cluster is given (`KAFKA_BOOTSTRAP_SERVERS`
unset) it runs Apache Kafka's own broker, the `kafka.Kafka` JVM process, in KRaft mode (broker
and controller in one process, no ZooKeeper): a private one on free ports for each test cluster,
one for the demo and the benchmarks. Nothing here is a mock or a Kafka-compatible lookalike.

- `fetch_broker_jars()` resolves `org.apache.kafka:kafka_2.13:KAFKA_VERSION` and its runtime
  dependencies from Maven Central with Maven, once, into `kafka_home()/KAFKA_VERSION/libs` (a
  stamp file lists the jars: later calls touch no network).
- `KafkaBroker(data_dir)` writes `server.properties`, formats the log directory (KRaft) on its
  first start, starts the JVM, waits until an AdminClient gets the cluster's metadata, and can
  stop, kill and start it again on the same ports and data (the faults of the tests).
- `kafka_bootstrap_servers()` is the configured cluster (`KAFKA_BOOTSTRAP_SERVERS`), if any.
- `python -m infra.kafka fetch | ensure | stop` (docs/KAFKA.md).

No Django imports: the launcher uses it before any settings exist.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from infra.processes import processes_matching
from spark_runtime.env import env

# Kafka 4.1: KRaft only (ZooKeeper is gone since 4.0), a broker that runs on Java 17 (Spark's
# Java here), new clusters formatted with transaction protocol 2. Pinned: the jar cache is per
# version (docs/KAFKA.md says why this one).
KAFKA_VERSION = "4.1.2"
SCALA_BINARY = "2.13"
# The broker logs through SLF4J 1.7 (Kafka's own distribution binds it to Log4j 2 as well).
LOG4J_VERSION = "2.25.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MIN_JAVA = 17
# A broker for tests and demos on a small machine: a small heap, the serial collector (one GC
# thread instead of one per core), out of memory ends the process (its supervisor starts it
# again) instead of leaving it limping.
JVM_OPTIONS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
NODE_ID = 1
STATE_FILE = "broker.json"
ROOT = Path(__file__).resolve().parent.parent

Say = Callable[[str], None]


def say_stderr(message: str) -> None:
    print(f"[kafka] {message}", file=sys.stderr, flush=True)


# --- settings ------------------------------------------------------------------------------


def parse_bootstrap_servers(raw: str) -> str:
    """`host:port[,host:port...]`, blanks removed; an empty value stays empty (unset)."""
    servers = [item.strip() for item in raw.split(",") if item.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port[,host:port...], got {raw!r}")
    return ",".join(servers)


def kafka_bootstrap_servers() -> str | None:
    """The Kafka cluster Backstop was pointed at (`KAFKA_BOOTSTRAP_SERVERS`), or None: then
    Backstop starts a broker of its own where it needs one."""
    return env("KAFKA_BOOTSTRAP_SERVERS", "", cast=parse_bootstrap_servers) or None


def kafka_home() -> Path:
    """Where the broker's jars are cached (per version) and the `ensure` broker lives."""
    return Path(env("BACKSTOP_KAFKA_HOME", str(ROOT / "var" / "kafka")))


# --- the jars ------------------------------------------------------------------------------

POM = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by infra/kafka.py: the Apache Kafka broker's runtime classpath. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>backstop</groupId>
  <artifactId>kafka-broker-classpath</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
      <scope>runtime</scope>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
      <scope>runtime</scope>
    </dependency>
  </dependencies>
</project>
"""

# Maven's "Downloaded from central: URL (size at speed)"
DOWNLOADED = re.compile(r"^(?:\[INFO\] )?Downloaded from [^:]+: (\S+) \(([^)]*?)(?: at [^)]*)?\)")


def size_mb(text: str) -> float:
    """Maven's size of a download ("910 kB", "2.1 MB", "12 B") in MB."""
    number, _, unit = text.partition(" ")
    scale = {"B": 1e-6, "kB": 1e-3, "KB": 1e-3, "MB": 1.0, "GB": 1e3}.get(unit.strip(), 0.0)
    try:
        return float(number) * scale
    except ValueError:
        return 0.0


def libs_dir(version: str = KAFKA_VERSION, home: Path | None = None) -> Path:
    return (home or kafka_home()) / version / "libs"


def cached_jars(version: str = KAFKA_VERSION, home: Path | None = None) -> list[Path] | None:
    """The jars of a completed fetch (its stamp file lists them), or None."""
    libs = libs_dir(version, home)
    stamp = libs.parent / "jars.txt"
    if not stamp.is_file():
        return None
    jars = [libs / name for name in stamp.read_text().split()]
    if not jars or not all(jar.is_file() and jar.stat().st_size > 0 for jar in jars):
        return None
    return jars


def fetch_broker_jars(
    version: str = KAFKA_VERSION, home: Path | None = None, say: Say = say_stderr
) -> list[Path]:
    """The jars of Apache Kafka's broker `version` and its runtime dependencies, fetched from
    Maven Central with Maven the first time (progress through `say`), from the cache after."""
    jars = cached_jars(version, home)
    if jars is not None:
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (mvn) is needed once to fetch the Kafka broker's jars: apt-get install maven"
        )
    folder = libs_dir(version, home).parent
    folder.mkdir(parents=True, exist_ok=True)
    pom = folder / "pom.xml"
    pom.write_text(POM.format(version=version, scala=SCALA_BINARY, log4j=LOG4J_VERSION))
    partial = folder / f"libs.partial-{os.getpid()}"  # renamed to libs/ once complete
    shutil.rmtree(partial, ignore_errors=True)
    log_path = folder / "maven.log"
    say(
        f"fetching Apache Kafka {version} (org.apache.kafka:kafka_{SCALA_BINARY}) and its "
        f"runtime dependencies from Maven Central into {folder / 'libs'} (once: about 65 MB "
        "with Maven's plugin)"
    )
    started = time.monotonic()
    argv = [
        mvn, "-B", "-f", str(pom), f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={partial}", "-DincludeScope=runtime",
    ]  # fmt: skip
    downloaded, downloaded_mb, reported_mb = 0, 0.0, 0.0
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder
        )
        for line in proc.stdout:
            log.write(line)
            found = DOWNLOADED.match(line.strip())
            if found is None:
                continue
            downloaded += 1
            downloaded_mb += size_mb(found[2])
            if downloaded_mb - reported_mb >= 4 or (found[1].endswith(".jar") and downloaded == 1):
                reported_mb = downloaded_mb
                say(
                    f"  {downloaded} files, {downloaded_mb:.0f} MB downloaded "
                    f"({found[1].rsplit('/', 1)[1]})"
                )
        code = proc.wait()
    if code != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"Maven could not fetch Kafka {version} (exit {code}):\n{tail}")
    names = sorted(path.name for path in partial.glob("*.jar"))
    libs = libs_dir(version, home)
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    (folder / "jars.txt").write_text("".join(f"{name}\n" for name in names))
    total_mb = sum((libs / name).stat().st_size for name in names) / 2**20
    say(
        f"{len(names)} jars, {total_mb:.0f} MB in {libs} ({downloaded} files downloaded, "
        f"{time.monotonic() - started:.0f} s; Maven's log: {log_path})"
    )
    return [libs / name for name in names]


@functools.cache
def java_runtime() -> tuple[str, str]:
    """(path, id) of the JVM the broker runs on: `$JAVA_HOME/bin/java` or `java` on PATH,
    checked to be Java 17 or newer (Kafka 4's broker needs it); the id names this very build
    (the class-data archive is valid for that build only)."""
    home = env("JAVA_HOME", None)
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise RuntimeError("Java 17 or newer is needed for the Kafka broker: no java found")
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr)
    major = int(found[1]) if found else 0
    major = int(found[2]) if major == 1 and found[2] else major  # "1.8.0" is Java 8
    if major < MIN_JAVA:
        raise RuntimeError(
            f"the Kafka {KAFKA_VERSION} broker needs Java {MIN_JAVA}+; {java} is {major}"
        )
    build = f"{os.path.realpath(java)}\n{done.stderr}".encode()
    return java, hashlib.sha256(build).hexdigest()[:8]


def class_archive(version: str = KAFKA_VERSION, home: Path | None = None) -> Path:
    """The broker's class-data archive for this Kafka version and this JDK (beside the jars):
    the classes a broker loads, dumped once; every later broker JVM maps them instead of
    loading and verifying them, and starts with about half the CPU (docs/KAFKA.md)."""
    return libs_dir(version, home).parent / f"classes-jdk-{java_runtime()[1]}.jsa"


def ensure_class_archive(
    version: str = KAFKA_VERSION, home: Path | None = None, say: Say = say_stderr
) -> Path | None:
    """Build the class-data archive if it is missing: a throwaway broker started, then stopped,
    which writes the archive as its JVM exits (a few seconds, once). None if that failed: the
    brokers then start without it."""
    archive = class_archive(version, home)
    if archive.is_file():
        return archive
    fetch_broker_jars(version, home, say)
    say(f"dumping the broker's classes into {archive} (once)")
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    options = (*JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={partial}")
    try:
        with tempfile.TemporaryDirectory(prefix="backstop-kafka-cds-") as tmp:
            broker = KafkaBroker(
                Path(tmp), version=version, home=home, say=lambda _: None, jvm_options=options
            )
            broker.start()
            broker.stop(grace_s=120)
        partial.rename(archive)
    except (OSError, RuntimeError) as exc:
        say(f"no class-data archive ({exc}); brokers start without it")
        partial.unlink(missing_ok=True)
        return None
    return archive


# --- the broker ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding (as
    `kafka-storage random-uuid`; never starting with '-', which reads as an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def cluster_metadata(bootstrap_servers: str, timeout_s: float = 3.0):
    """The cluster's metadata (confluent_kafka ClusterMetadata) or None when nothing answers."""
    admin = AdminClient(
        {"bootstrap.servers": bootstrap_servers, "socket.connection.setup.timeout.ms": 2000}
    )
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return None
    return metadata if metadata.brokers else None


LOG4J2 = """# Written by infra/kafka.py: the broker's log goes to its standard output.
status = warn
# The console appender writes every line at once: nothing to flush when the JVM exits.
shutdownHook = disable
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class KafkaBroker:
    """Apache Kafka's broker (`kafka.Kafka`) in KRaft mode, broker and controller in one JVM,
    with its data in `data_dir`: PLAINTEXT on 127.0.0.1:`port`, the controller's listener on
    `controller_port` (free ports when not given). The ports and the cluster id are kept in
    `data_dir/broker.json`, so a broker of the same directory starts again on the same ports
    and data: `stop()` or `kill()`, then `start()`.

    A single-node cluster: every internal topic has one replica (offsets, transactions),
    `min.insync.replicas=1`, and topics are not created on first use
    (`auto.create.topics.enable=false`, as on most production clusters: whoever writes to a
    topic creates it first, so Backstop needs nothing of a cluster that a real one would
    refuse)."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        controller_port: int | None = None,
        version: str = KAFKA_VERSION,
        home: Path | None = None,
        say: Say = say_stderr,
        jvm_options: tuple[str, ...] | None = None,
    ):
        self.data_dir = Path(data_dir)
        self.version = version
        self.home = home  # the jar cache (None: kafka_home())
        self.say = say
        # None: JVM_OPTIONS and the class-data archive (built on the first start if missing)
        self.jvm_options = jvm_options
        self.proc: subprocess.Popen | None = None
        # The broker's output when `start()` starts it (a ProcessGroup's child logs in the
        # group's log_dir: the launcher sets this to that file).
        self.log_path = self.data_dir / "broker.log"
        state = self._read_state()
        self.port = port or state.get("port") or free_port()
        self.controller_port = controller_port or state.get("controller_port") or free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.cluster_id = (
            self._formatted_cluster_id() or state.get("cluster_id") or new_cluster_id()
        )

    # where things are
    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        """Kafka's log directory: the topics' partitions and the KRaft metadata log."""
        return self.data_dir / "data"

    @property
    def pid(self) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc.pid
        return None

    def _formatted_cluster_id(self) -> str | None:
        """The cluster id the log directory was formatted with, if it was."""
        try:
            text = (self.log_dir / "meta.properties").read_text()
        except OSError:
            return None
        found = re.search(r"^cluster\.id=(\S+)", text, re.MULTILINE)
        return found[1] if found else None

    def _read_state(self) -> dict:
        try:
            return json.loads((self.data_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self) -> None:
        state = {
            "version": self.version,
            "bootstrap_servers": self.bootstrap_servers,
            "port": self.port,
            "controller_port": self.controller_port,
            "cluster_id": self.cluster_id,
        }
        (self.data_dir / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")

    # configuration
    def server_properties(self) -> str:
        cport = self.controller_port
        settings = {
            "process.roles": "broker,controller",
            "node.id": NODE_ID,
            "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{cport}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": self.log_dir,
            # one node: one replica of everything
            "num.partitions": 1,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            # fewer partitions of the internal topics than Kafka's 50: quicker first use
            "offsets.topic.num.partitions": 8,
            "transaction.state.log.num.partitions": 8,
            "group.initial.rebalance.delay.ms": 0,
            # A killed broker's registration lives until its session times out (Kafka's 9 s
            # default): only then may the restarted one register. 5 s takes a killed broker back
            # sooner; a heartbeat every second keeps Kafka's ratio (4 heartbeats may be lost).
            # Not shorter: a heartbeat waiting in the controller's queue for more than half the
            # interval times out (logged as an error on a busy machine, at 0.5 s).
            "broker.session.timeout.ms": 5000,
            "broker.heartbeat.interval.ms": 1000,
            "auto.create.topics.enable": "false",
            # a small machine
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
        }
        lines = [f"{key}={value}" for key, value in settings.items()]
        return "# Written by infra/kafka.py on every start.\n" + "\n".join(lines) + "\n"

    def prepare(self) -> None:
        """Fetch the jars if needed, write the configuration, format a new log directory."""
        fetch_broker_jars(self.version, self.home, say=self.say)
        if self.jvm_options is None:
            ensure_class_archive(self.version, self.home, say=self.say)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.server_properties())
        (self.data_dir / "log4j2.properties").write_text(LOG4J2)
        self._write_state()
        if not (self.log_dir / "meta.properties").exists():
            done = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "--cluster-id", self.cluster_id,
                           "--config", str(self.config_path)),
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(
                    f"formatting {self.log_dir} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"
                )

    def _java(self, main_class: str, *args: str) -> list[str]:
        options = self.jvm_options
        if options is None:
            archive = class_archive(self.version, self.home)
            options = (
                (*JVM_OPTIONS, f"-XX:SharedArchiveFile={archive}")
                if archive.is_file()
                else JVM_OPTIONS
            )
        return [
            java_runtime()[0], *options,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", self.classpath(), main_class, *args,
        ]  # fmt: skip

    def classpath(self) -> str:
        """The fetched jars in their stamp file's order: the same class path at every start
        (the class-data archive maps only for the class path it was dumped with)."""
        jars = cached_jars(self.version, self.home)
        if jars is None:
            raise RuntimeError(f"the Kafka {self.version} jars are not fetched: prepare() first")
        return os.pathsep.join(str(jar) for jar in jars)

    def argv(self) -> list[str]:
        """The command line (after `prepare()`): `java ... kafka.Kafka server.properties`."""
        return self._java("kafka.Kafka", str(self.config_path))

    # life cycle
    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        """Start the broker (its output in `log_path`) and return once it answers."""
        if self.pid is not None:
            return self
        self.stop_stale()
        self.prepare()
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own session: a Ctrl-C reaches its owner only
            )
        self.wait_ready(timeout_s)
        self.say(
            f"Apache Kafka {self.version} broker answers at {self.bootstrap_servers} "
            f"(pid {self.proc.pid}, {time.monotonic() - started:.1f} s; log {self.log_path})"
        )
        return self

    def answers(self, timeout_s: float = 3.0) -> bool:
        """Whether this broker (this cluster id) answers an AdminClient's metadata request."""
        if not port_open(self.port):
            return False
        metadata = cluster_metadata(self.bootstrap_servers, timeout_s)
        return metadata is not None and metadata.cluster_id == self.cluster_id

    def wait_ready(self, timeout_s: float = 90.0, proc: subprocess.Popen | None = None) -> None:
        """Wait until the broker answers; raise with its log's tail if its process exits."""
        proc = proc or self.proc
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"the Kafka broker exited with code {proc.returncode}:\n{self._log_tail()}"
                )
            if self.answers():
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"timed out after {timeout_s:.0f} s waiting for the Kafka broker at "
            f"{self.bootstrap_servers}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after `grace_s`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: no clean shutdown; the next start recovers the log."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop_for(self, seconds: float, hard: bool = True, timeout_s: float = 90.0) -> None:
        """The broker down for `seconds`: killed (`hard`) or stopped cleanly, then started
        again on the same ports and data; returns once it answers again."""
        self.kill() if hard else self.stop()
        time.sleep(seconds)
        self.start(timeout_s)

    def stop_stale(self, grace_s: float = 20.0) -> list[int]:
        """Stop a broker of this data directory that an earlier owner left running (a `java
        ... kafka.Kafka` naming this directory's server.properties): it would hold the lock on
        the log directory. Returns their pids."""
        config = str(self.config_path)
        own = self.pid
        stale = [
            process
            for process in processes_matching(lambda argv: "kafka.Kafka" in argv and config in argv)
            if process.pid != own
        ]
        for process in stale:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(stale, timeout=grace_s)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=30)
        for process in stale:
            self.say(f"stopped the broker running on {self.data_dir} (pid {process.pid})")
        return [process.pid for process in stale]

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- the command line ----------------------------------------------------------------------


def ensure(data_dir: Path) -> str:
    """The bootstrap address of the demo's and the benchmarks' broker: the configured cluster,
    or a broker of `data_dir` already answering, or one started now and left running."""
    configured = kafka_bootstrap_servers()
    if configured:
        say_stderr(f"using KAFKA_BOOTSTRAP_SERVERS={configured} (no broker started)")
        return configured
    broker = KafkaBroker(data_dir)
    if broker.answers():
        say_stderr(f"a broker answers at {broker.bootstrap_servers} ({data_dir})")
        return broker.bootstrap_servers
    broker.start()
    broker.proc = None  # left running: `python -m infra.kafka stop` ends it
    return broker.bootstrap_servers


def stop_ensured(data_dir: Path) -> None:
    """Stop the broker `ensure` left running on `data_dir`, if any."""
    if not KafkaBroker(data_dir).stop_stale():
        say_stderr(f"no broker runs on {data_dir}")


USAGE = """usage: python -m infra.kafka fetch | ensure | stop
  fetch   fetch the broker's jars (Apache Kafka {version}) from Maven Central once, with progress
  ensure  print the bootstrap address of a running broker: KAFKA_BOOTSTRAP_SERVERS when set,
          else the broker in {home}/broker, started (and left running) if it does not answer
  stop    stop that broker"""


def main(argv: list[str]) -> int:
    home = kafka_home()
    if argv == ["fetch"]:
        jars = fetch_broker_jars()
        archive = ensure_class_archive()
        say_stderr(
            f"Apache Kafka {KAFKA_VERSION}: {len(jars)} jars in {jars[0].parent}"
            + (f", class-data archive {archive.name}" if archive else "")
        )
        return 0
    if argv == ["ensure"]:
        print(ensure(home / "broker"))
        return 0
    if argv == ["stop"]:
        stop_ensured(home / "broker")
        return 0
    print(USAGE.format(version=KAFKA_VERSION, home=home), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
