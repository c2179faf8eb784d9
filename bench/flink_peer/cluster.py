"""A Flink standalone cluster on this machine, started from the PyFlink package's own scripts.

One JobManager and `taskmanagers` TaskManagers of one slot each, each a foreground process
(`bin/jobmanager.sh start-foreground`, `bin/taskmanager.sh start-foreground`) in a session of
its own, so that a TaskManager and the Python workers it starts can be killed together, by pid,
as a lost container would be. The configuration is written to a directory of the run (Flink's
defaults, plus what is listed in `flink_config`); nothing in the installed package is changed.

Runs in the project's environment: it only starts processes and talks to the REST API.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.flink_peer.env import PROJECT_ROOT, FlinkEnv

JOB_SCRIPT = PROJECT_ROOT / "bench" / "flink_peer" / "job.py"


# Integer.MAX_VALUE: the attempts Flink itself gave its fixed-delay strategy when it was the default
# with checkpointing (Flink's docs, "Task Failure Recovery", up to 1.18). Flink's own default for
# the key is 1, which would fail the job at its second restart: a killed TaskManager costs
# several attempts (deployments to its slot fail until it is declared lost).
FIXED_DELAY_ATTEMPTS = 2_147_483_647
RESTART_STRATEGIES = ("exponential-delay", "fixed-delay")


@dataclass(frozen=True)
class FlinkSettings:
    """How the peer runs: the settings that decide Flink's recovery and latency (each one an
    option of `manage.py bench`, `OPTIONS`), the rest Flink's defaults. The field defaults are
    the `default` profile: what the peer ran with before the profiles existed (issue 46)."""

    parallelism: int = 1
    spare_taskmanagers: int = 1
    # The profile the values came from (`PROFILES`), recorded with the run.
    profile: str = "default"
    # Flink's docs leave the interval to the user; 10 s is a common production choice (and what
    # a recovery replays at most). Exactly-once mode, Flink's default checkpoint mode.
    checkpoint_ms: int = 10_000
    # How soon a lost TaskManager is noticed: Flink's defaults (configuration page, heartbeat
    # options: a target is unreachable after rpc-failure-threshold failed heartbeat RPCs, i.e.
    # interval x threshold, or after the timeout without an answer).
    heartbeat_interval_ms: int = 10_000
    heartbeat_timeout_ms: int = 50_000
    heartbeat_rpc_failure_threshold: int = 2
    # Flink's default with checkpointing (since 1.19): exponential delay from 1 s ("Task Failure
    # Recovery"). The delay is the fixed delay of fixed-delay, the initial backoff of
    # exponential-delay; the other exponential-delay keys keep Flink's defaults.
    restart_strategy: str = "exponential-delay"
    restart_delay_ms: int = 1000
    # How often the job's FileSource looks for the bridge's new files (bench/flink_peer/job.py;
    # a job argument, not a cluster setting).
    discovery_ms: int = 100
    # PyFlink sends records to its Python workers in bundles, finished at most every
    # bundle.time (default 1000 ms, tuned for throughput): 100 ms is a latency-minded setting.
    bundle_time_ms: int = 100
    # How long a task's output buffer may wait before it is sent on (Flink's default, 100 ms).
    buffer_timeout_ms: int = 100
    taskmanager_memory: str = "1024m"
    jobmanager_memory: str = "1024m"
    # Further configuration (key, value), applied last: it overrides every setting above
    # (`manage.py bench --flink-conf KEY=VALUE`).
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        problems = []
        if self.profile not in PROFILES:
            problems.append(f"--flink-profile: one of {', '.join(PROFILES)}")
        if self.restart_strategy not in RESTART_STRATEGIES:
            problems.append(f"--flink-restart-strategy: one of {', '.join(RESTART_STRATEGIES)}")
        # Flink's own lower bound for the checkpoint interval is 10 ms.
        for name, least in (("checkpoint_ms", 10), ("heartbeat_interval_ms", 1),
                            ("heartbeat_timeout_ms", 1), ("restart_delay_ms", 0),
                            ("discovery_ms", 1), ("bundle_time_ms", 1),
                            ("buffer_timeout_ms", 0)):  # fmt: skip
            if getattr(self, name) < least:
                problems.append(f"{OPTIONS[name]}: at least {least}")
        threshold = self.heartbeat_rpc_failure_threshold
        if threshold != -1 and threshold < 1:
            problems.append(f"{OPTIONS['heartbeat_rpc_failure_threshold']}: -1 (off) or at least 1")
        interval = dict(self.extra).get("execution.checkpointing.interval")
        if interval is not None:
            try:
                duration_ms(interval)
            except ValueError as exc:
                problems.append(f"--flink-conf execution.checkpointing.interval: {exc}")
        if self.heartbeat_timeout_ms < self.heartbeat_interval_ms:
            problems.append(
                f"{OPTIONS['heartbeat_timeout_ms']}: at least {OPTIONS['heartbeat_interval_ms']}"
            )
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def taskmanagers(self) -> int:
        return self.parallelism + self.spare_taskmanagers


# The settings `manage.py bench` takes as options: field -> option.
OPTIONS = {
    name: "--flink-" + name.replace("_", "-")
    for name in (
        "checkpoint_ms",
        "heartbeat_interval_ms",
        "heartbeat_timeout_ms",
        "heartbeat_rpc_failure_threshold",
        "restart_strategy",
        "restart_delay_ms",
        "discovery_ms",
        "bundle_time_ms",
        "buffer_timeout_ms",
    )
}

# What a Flink user who cares about recovery would set, from Flink's documentation (2.x key
# names; docs/RESULTS.md, "Backstop vs Flink", and docs/BENCHMARKS.md, "Backstop vs Apache
# Flink"):
TUNED = {
    # "Checkpointing" (execution.checkpointing.interval): the interval bounds what a restore
    # replays, and the replayed records' latency is the peak after a fault. 1 s, the low end of
    # 1-2 s: Backstop's runs commit every micro-batch (0.3-0.5 s triggers), and the state here (a
    # few hundred keys, hashmap backend, local files) makes a checkpoint cheap.
    "checkpoint_ms": 1000,
    # Configuration page, heartbeat options: detection after interval x rpc-failure-threshold
    # failed heartbeat RPCs (a killed process's RPCs fail at once), 1 s here instead of 20 s;
    # the timeout, for a target that stops answering, 5 s instead of 50 s. The docs warn that a
    # threshold this low can produce false positives on a flaky network: this is loopback.
    "heartbeat_interval_ms": 1000,
    "heartbeat_timeout_ms": 5000,
    "heartbeat_rpc_failure_threshold": 1,
    # "Task Failure Recovery", Fixed Delay Restart Strategy: every restart waits the same 500 ms
    # (with FIXED_DELAY_ATTEMPTS attempts). Flink's default exponential delay grows with every
    # failed attempt and only resets after reset-backoff-threshold (1 h) without a failure, so
    # successive faults 50 s apart wait longer and longer; the docs recommend it to spare
    # external systems an avalanche of restarts, which this single job does not have.
    "restart_strategy": "fixed-delay",
    "restart_delay_ms": 500,
    # The FileSource's continuous discovery (DataStream FileSource, monitorContinuously): new
    # bridge files are looked for every 50 ms, the bridge's own roll (bridge.ROLL_S).
    "discovery_ms": 50,
    # Not set (left as in the default profile), each for a reason:
    # - execution.checkpointing.unaligned.enabled ("Unaligned Checkpoints"): it lets checkpoints
    #   pass backpressure; it does not shorten a recovery, and at 50 events/s there is none.
    # - execution.checkpointing.local-backup.enabled / execution.state-recovery.from-local
    #   (state.backend.local-recovery before Flink 2; "Large State Tuning", Task-Local
    #   Recovery): a local copy of the state helps a task restored on the same TaskManager; a
    #   killed TaskManager takes its copy with it (the job moves to the spare), and the state
    #   here is kilobytes on local disk already.
    # - bundle time and buffer timeout: latency settings, already latency-minded (100 ms).
}
PROFILES = {"default": {}, "tuned": TUNED}


def flink_settings(
    profile: str = "default",
    options: tuple[tuple[str, object], ...] = (),
    extra: tuple[tuple[str, str], ...] = (),
) -> FlinkSettings:
    """The settings of `profile`, with the explicitly given `options` (field, value) over its
    values and `extra` (--flink-conf) over everything in the configuration."""
    if profile not in PROFILES:
        raise ValueError(f"--flink-profile: one of {', '.join(PROFILES)}")
    unknown = [name for name, _ in options if name not in OPTIONS]
    if unknown:
        raise ValueError(f"not a Flink option: {', '.join(unknown)}")
    return FlinkSettings(
        profile=profile, **{**PROFILES[profile], **dict(options)}, extra=tuple(extra)
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shipped_java_opts(flink_home: Path) -> str:
    """The JVM options of the package's default configuration (`env.java.opts.all`: the
    --add-opens Flink needs on Java 17)."""
    text = (flink_home / "conf" / "config.yaml").read_text()
    match = re.search(r"^\s+all:\s*(--add-.*)$", text, flags=re.MULTILINE)
    return match.group(1).strip() if match else ""


def flink_config(
    env: FlinkEnv, settings: FlinkSettings, rest_port: int, rpc_port: int, data_dir: Path
) -> dict[str, str]:
    """The cluster's configuration (flat keys, as Flink 2's config.yaml accepts them)."""
    return {
        "env.java.opts.all": shipped_java_opts(env.flink_home),
        "jobmanager.rpc.address": "localhost",
        "jobmanager.rpc.port": str(rpc_port),
        "jobmanager.bind-host": "localhost",
        "jobmanager.memory.process.size": settings.jobmanager_memory,
        "jobmanager.execution.failover-strategy": "region",
        "taskmanager.bind-host": "localhost",
        "taskmanager.host": "localhost",
        "taskmanager.numberOfTaskSlots": "1",
        "taskmanager.memory.process.size": settings.taskmanager_memory,
        "rest.address": "localhost",
        "rest.bind-address": "localhost",
        "rest.port": str(rest_port),
        "parallelism.default": str(settings.parallelism),
        "execution.checkpointing.dir": (data_dir / "checkpoints").as_uri(),
        "python.executable": str(env.python),
        "python.client.executable": str(env.python),
        "python.fn-execution.bundle.time": str(settings.bundle_time_ms),
        "execution.buffer-timeout.interval": f"{settings.buffer_timeout_ms} ms",
        "io.tmp.dirs": str(data_dir / "tmp"),
        **recovery_config(settings),
        **dict(settings.extra),
    }


def recovery_config(settings: FlinkSettings) -> dict[str, str]:
    """The keys of the settings that decide recovery (Flink 2.x names: `restart-strategy.type`
    was `restart-strategy` before 1.17). The checkpoint interval is also the job's own
    (`job.py --checkpoint-ms`, taken from the configuration: `checkpoint_interval_ms`)."""
    config = {
        "execution.checkpointing.interval": f"{settings.checkpoint_ms} ms",
        "heartbeat.interval": f"{settings.heartbeat_interval_ms} ms",
        "heartbeat.timeout": f"{settings.heartbeat_timeout_ms} ms",
        "heartbeat.rpc-failure-threshold": str(settings.heartbeat_rpc_failure_threshold),
        "restart-strategy.type": settings.restart_strategy,
    }
    if settings.restart_strategy == "fixed-delay":
        config["restart-strategy.fixed-delay.delay"] = f"{settings.restart_delay_ms} ms"
        config["restart-strategy.fixed-delay.attempts"] = str(FIXED_DELAY_ATTEMPTS)
    else:
        config["restart-strategy.exponential-delay.initial-backoff"] = (
            f"{settings.restart_delay_ms} ms"
        )
    return config


DURATION_UNITS_MS = {
    "": 1, "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}  # fmt: skip


def duration_ms(text: str) -> int:
    """A Flink duration ("1000 ms", "2 s", "1min", a bare number of ms) in milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in DURATION_UNITS_MS:
        raise ValueError(f"not a Flink duration: {text!r}")
    return int(match.group(1)) * DURATION_UNITS_MS[match.group(2)]


def checkpoint_interval_ms(config: dict[str, str]) -> int:
    """The checkpoint interval of a cluster configuration, in ms (a --flink-conf value of
    execution.checkpointing.interval included)."""
    try:
        return duration_ms(config["execution.checkpointing.interval"])
    except ValueError as exc:
        raise ValueError(f"--flink-conf execution.checkpointing.interval: {exc}") from None


def replacement_name(name: str, taken: list[str]) -> str:
    """The resource id of the next TaskManager started in place of `name` (tm-1 -> tm-1-r1 ->
    tm-1-r2): a new id, since the JobManager may still hold the dead one's registration."""
    base = name.split("-r")[0]
    replacements = sum(1 for other in taken if other.startswith(f"{base}-r"))
    return f"{base}-r{replacements + 1}"


@dataclass
class FlinkCluster:
    """A running standalone cluster (use as a context manager); logs and state in `run_dir`."""

    env: FlinkEnv
    settings: FlinkSettings
    run_dir: Path
    say: object = print
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    rest_port: int = 0
    # The configuration the cluster got (config.yaml), once written.
    config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        # Flink takes paths as URIs and its processes may run elsewhere than the caller's cwd.
        self.run_dir = Path(self.run_dir).resolve()

    @property
    def conf_dir(self) -> Path:
        return self.run_dir / "conf"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "log"

    def _environment(self) -> dict[str, str]:
        environment = dict(os.environ)
        environment.update(
            FLINK_CONF_DIR=str(self.conf_dir),
            FLINK_LOG_DIR=str(self.log_dir),
            # The job imports bench.flink_peer.functions and spark_runtime (keys, progress).
            PYTHONPATH=str(PROJECT_ROOT),
            PATH=f"{self.env.python.parent}{os.pathsep}{environment.get('PATH', '')}",
        )
        return environment

    def write_config(self) -> None:
        self.rest_port = free_port()
        for directory in (self.conf_dir, self.log_dir, self.run_dir / "tmp"):
            directory.mkdir(parents=True, exist_ok=True)
        for shipped in (self.env.flink_home / "conf").glob("log4j*.properties"):
            shutil.copy(shipped, self.conf_dir / shipped.name)
        self.config = flink_config(
            self.env, self.settings, self.rest_port, free_port(), self.run_dir
        )
        (self.conf_dir / "config.yaml").write_text(
            "".join(f"{key}: {json.dumps(value)}\n" for key, value in self.config.items())
        )

    def _start(self, name: str, command: list[str]) -> None:
        log = (self.log_dir / f"{name}.out").open("ab")
        self.processes[name] = subprocess.Popen(
            command,
            env=self._environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self, timeout_s: float = 120) -> None:
        """Start the JobManager and the TaskManagers; wait until every slot is registered."""
        self.write_config()
        bin_dir = self.env.flink_home / "bin"
        self._start("jobmanager", ["bash", str(bin_dir / "jobmanager.sh"), "start-foreground"])
        for number in range(1, self.settings.taskmanagers + 1):
            self.start_taskmanager(f"tm-{number}")
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            registered = self._registered_taskmanagers()
            if registered >= self.settings.taskmanagers:
                self.say(f"Flink cluster up: REST on {self.rest_port}, {registered} TaskManagers")
                return
            for name, process in self.processes.items():
                if process.poll() is not None:
                    code = process.returncode
                    raise RuntimeError(f"Flink {name} exited ({code}): {self.log_dir}")
            time.sleep(1)
        raise RuntimeError(f"Flink cluster not up after {timeout_s:.0f} s: {self.log_dir}")

    def start_taskmanager(self, name: str) -> None:
        """Start a TaskManager whose resource id (its name in the REST API) is `name`."""
        script = self.env.flink_home / "bin" / "taskmanager.sh"
        self._start(
            name,
            ["bash", str(script), "start-foreground", "-D", f"taskmanager.resource-id={name}"],
        )

    def rest(self, path: str, method: str = "GET") -> dict:
        request = urllib.request.Request(f"http://localhost:{self.rest_port}{path}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else {}

    def _registered_taskmanagers(self) -> int:
        try:
            return len(self.rest("/taskmanagers")["taskmanagers"])
        except OSError:
            return 0

    def submit(self, job_args: list[str], timeout_s: float = 180) -> str:
        """Submit the peer job (detached) and wait until all its tasks run; returns its id."""
        command = [
            "bash", str(self.env.flink_home / "bin" / "flink"), "run", "--detached",
            "--python", str(JOB_SCRIPT),
            "--pyExecutable", str(self.env.python),
            "--pyClientExecutable", str(self.env.python),
            *job_args,
        ]  # fmt: skip
        completed = subprocess.run(
            command, env=self._environment(), capture_output=True, text=True, timeout=timeout_s
        )
        (self.log_dir / "submit.out").write_text(completed.stdout + completed.stderr)
        match = re.search(r"JobID ([0-9a-f]{32})", completed.stdout + completed.stderr)
        if completed.returncode != 0 or not match:
            raise RuntimeError(f"flink run failed ({completed.returncode}): {self.log_dir}")
        job_id = match.group(1)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.tasks_running(job_id):
                return job_id
            time.sleep(1)
        raise RuntimeError(f"Flink job {job_id} not running after {timeout_s:.0f} s")

    def tasks_running(self, job_id: str) -> bool:
        """Whether every task of the job is RUNNING."""
        vertices = self.rest(f"/jobs/{job_id}").get("vertices", [])
        return bool(vertices) and all(v["status"] == "RUNNING" for v in vertices)

    def job_status(self, job_id: str) -> dict:
        """The job's state and the failures it recovered from (Flink's exception history:
        one entry per failure, each with the exception's class name)."""
        state = self.rest(f"/jobs/{job_id}").get("state")
        try:
            history = self.rest(f"/jobs/{job_id}/exceptions?maxExceptions=50")["exceptionHistory"]
            failures = [entry.get("exceptionName", "?") for entry in history.get("entries", [])]
        except (OSError, KeyError) as exc:
            failures = [f"exception history not read: {exc}"]
        return {"state": state, "failures": failures}

    def busy_taskmanager(self) -> str:
        """A TaskManager that runs tasks of the job (a used slot), by resource id."""
        for manager in self.rest("/taskmanagers")["taskmanagers"]:
            if manager["freeSlots"] < manager["slotsNumber"]:
                return manager["id"]
        raise RuntimeError("no TaskManager runs a task")

    def kill_taskmanager(self, name: str) -> list[int]:
        """SIGKILL a TaskManager and every process of its session (its Python workers);
        returns the pids killed."""
        import psutil

        leader = self.processes[name].pid
        killed = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == leader:
                    proc.kill()
                    killed.append(proc.pid)
            except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
                continue
        self.processes[name].wait(timeout=10)
        return killed

    def replace_taskmanager(self, name: str) -> str:
        """Start a new TaskManager in place of the killed `name`, as a process manager
        (Kubernetes, systemd) would; it registers under a new resource id, which it returns."""
        new_name = replacement_name(name, list(self.processes))
        self.start_taskmanager(new_name)
        return new_name

    def live_processes(self) -> list:
        """Every live process of the cluster (JobManager, TaskManagers, Python workers), as the
        psutil processes found: looking a pid up again raced with a TaskManager's kill (the
        benchmark's resource sampler died on a pid gone in between)."""
        import psutil

        leaders = {p.pid for p in self.processes.values() if p.poll() is None}
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in leaders:
                    found.append(proc)
            except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
                continue
        return found

    def cancel(self, job_id: str) -> None:
        try:
            self.rest(f"/jobs/{job_id}?mode=cancel", method="PATCH")
        except OSError as exc:
            self.say(f"cancelling Flink job {job_id}: {exc}")

    def stop(self) -> None:
        """Stop every process this cluster started (by session), SIGTERM then SIGKILL."""
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            live = [p for p in self.processes.values() if p.poll() is None]
            for process in live:
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    continue
            deadline = time.time() + wait_s
            for process in live:
                try:
                    process.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    continue

    def __enter__(self) -> FlinkCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
