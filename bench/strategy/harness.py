"""What every run of the strategy benchmark shares, Backstop's strategies'
(bench/strategy/run.py) and the Flink peer's (bench/flink_peer/peer.py): the settings of an
invocation (workload, fault schedule, how faults are judged), the resource sampler, the
comparison with ground truth (console/policy/truth.py) and the measurement of a run's progress
records (the console's recovery judgement, console/policy/recovery.py, and
bench/strategy/measure.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.flink_peer.cluster import OPTIONS as FLINK_OPTIONS
from bench.flink_peer.cluster import FlinkSettings, flink_settings
from bench.strategy import measure
from bench.strategy.topics import SOURCES, TRIGGERS
from console.models import Policy, RegisteredTopology
from console.policy import truth
from console.policy.config import PolicyConfig
from console.policy.fault_params import KAFKA_BROKER
from console.policy.recovery import RecoverySettings, measure_faults
from console.services.jobs import REALTIME_REFUSAL
from console.services.topologies import job_topology
from infra.node_metrics import ProcessTracker
from spark_runtime import keys as data_keys
from spark_runtime import user_plan
from spark_runtime.activity import pss_mb
from spark_runtime.jobdef import resolve_topology
from spark_runtime.strategies import STRATEGIES

FAULT_KINDS = ("kill-driver", "kill-node", "operator-exception", KAFKA_BROKER)
# The longest broker outage a run asks for: the job's batches wait the broker out, and a run's
# faults are spaced at most a minute or so apart.
MAX_OUTAGE_S = 120.0
# Other stream processors the benchmark can run the same workload on (bench/flink_peer/peer.py),
# after Backstop's strategies.
PEERS = ("flink",)
# Why `--trigger realtime` is refused: the job service's reason, without its field prefix.
REALTIME_REASON = REALTIME_REFUSAL.removeprefix("trigger: ")


@dataclass(frozen=True)
class BenchSettings:
    """One invocation: a topology, the strategies to compare and the shared workload."""

    topology: str
    strategies: tuple[str, ...]
    faults: int
    fault_kind: str
    rate: float
    warmup_s: float
    duration_s: float
    out: Path
    stable_window_s: float = 10.0
    seed: int = 7
    target: str | None = None
    drain_timeout_s: float = 300.0
    peer: str | None = None
    # The peer's configuration beyond its defaults (Flink: (key, value) pairs, over everything).
    peer_conf: tuple[tuple[str, str], ...] = ()
    # The Flink peer's profile (bench/flink_peer/cluster.py PROFILES) and the settings given as
    # options over it, (FlinkSettings field, value) pairs: recorded in bench.json's settings.
    flink_profile: str = "default"
    flink_options: tuple[tuple[str, object], ...] = ()
    # Policy settings for the runs, (field, value as given) pairs (`policy_for_runs`).
    policy: tuple[tuple[str, str], ...] = ()
    # Where each run's job reads its input and writes its results (bench/strategy/topics.py):
    # `redis` (its own input stream and results hash) or `kafka` (a topic of its own for each,
    # on the benchmark's broker); and the job's trigger (`realtime` is refused with the reason).
    source: str = "redis"
    trigger: str = "microbatch"
    # A kafka-broker fault stops the benchmark's own broker this long (infra/kafka_outage.py).
    outage_s: float = 20.0

    def __post_init__(self):
        problems = []
        if self.peer is not None and self.peer not in PEERS:
            problems.append(f"--peer: one of {', '.join(PEERS)}")
        if self.peer_conf and self.peer != "flink":
            problems.append("--flink-conf: only with --peer flink")
        if self.flink_profile != "default" and self.peer != "flink":
            problems.append("--flink-profile: only with --peer flink")
        for name, _ in self.flink_options:
            if self.peer != "flink":
                problems.append(f"{FLINK_OPTIONS.get(name, name)}: only with --peer flink")
        try:
            flink_settings(self.flink_profile, self.flink_options, self.peer_conf)
        except ValueError as exc:
            problems.append(str(exc))
        if self.source not in SOURCES:
            problems.append(f"--source: one of {', '.join(SOURCES)}")
        if self.trigger not in TRIGGERS:
            problems.append(f"--trigger: one of {', '.join(TRIGGERS)}")
        elif self.trigger == "realtime":
            problems.append(f"--trigger realtime is refused: {REALTIME_REASON}")
        if self.peer is not None and self.topology not in truth.CHECKED_TOPOLOGIES:
            problems.append(f"--peer runs {', '.join(truth.CHECKED_TOPOLOGIES)} only")
        if self.topology not in truth.CHECKED_TOPOLOGIES and not has_reference(self.topology):
            problems.append(
                f"--topology: one of {', '.join(truth.CHECKED_TOPOLOGIES)}, or a registered job "
                "with a reference function"
            )
        for name, text in self.policy:
            if name not in Policy.threshold_field_names():
                problems.append(f"--policy: {name} is not a policy field")
                continue
            try:
                policy_value(name, text)
            except ValueError as exc:
                problems.append(str(exc))
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown or not self.strategies:
            problems.append(f"--strategies: comma-separated, from {', '.join(STRATEGIES)}")
        if self.fault_kind not in FAULT_KINDS:
            problems.append(f"--fault-kind: one of {', '.join(FAULT_KINDS)}")
        if self.fault_kind == KAFKA_BROKER and (self.source != "kafka" or self.peer is not None):
            problems.append(
                "--fault-kind kafka-broker: only with --source kafka and without --peer (it "
                "stops the broker the benchmark started for its jobs)"
            )
        if not 1 <= self.outage_s <= MAX_OUTAGE_S:
            problems.append(f"--outage: 1 to {MAX_OUTAGE_S:g} s")
        if not 0 <= self.faults <= 4:
            problems.append("--faults: 0 to 4")
        if not 1 <= self.rate <= 5000:
            problems.append("--rate: 1 to 5000 events/s")
        if self.warmup_s < 15:
            problems.append("--warmup: at least 15 s (the reference window needs steady output)")
        if self.faults and self.duration_s / (self.faults + 1) < self.stable_window_s + 15:
            problems.append(
                f"--duration: faults are spaced duration/(faults+1) apart; that must be at least "
                f"{self.stable_window_s + 15:g} s (stable window + 15 s) to see each recovery"
            )
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def flink(self) -> FlinkSettings:
        """The Flink peer's settings: the profile's, the options over them, --flink-conf last."""
        return flink_settings(self.flink_profile, self.flink_options, self.peer_conf)

    @property
    def fault_params(self) -> dict | None:
        """The params of each fault's request: the outage's length for kafka-broker, else the
        kind's defaults."""
        return {"duration_s": self.outage_s} if self.fault_kind == KAFKA_BROKER else None

    @property
    def input_s(self) -> float:
        """Seconds the generator writes input: the warm-up plus the measured duration."""
        return self.warmup_s + self.duration_s

    @property
    def events(self) -> int:
        return int(self.rate * self.input_s)

    @property
    def schedule(self) -> list[float]:
        return measure.fault_schedule(self.warmup_s, self.duration_s, self.faults)

    def recovery_settings(self, band: float) -> RecoverySettings:
        """How this run's faults are judged: the console's measurement, with "normal" learned
        from the steady window (warm-up to first fault) and this run's stable window."""
        steady_start, steady_end = self.steady_s
        return RecoverySettings(
            band=band,
            stable_window_s=self.stable_window_s,
            reference_window_s=steady_end - steady_start,
            warmup_s=self.warmup_s,
        )

    @property
    def steady_s(self) -> tuple[float, float]:
        """The steady window (seconds after the input started): after the warm-up, before the
        first fault (or the end of the input)."""
        return self.warmup_s, self.schedule[0] if self.schedule else self.input_s


@dataclass
class ResourceSampler:
    """Samples the CPU (% of one core), RSS and PSS (MiB) of a job's processes once a second in
    a background thread: `find_processes()` lists them (for a Backstop job: its stage processes
    and their JVMs, `stage_processes_of`). Samples are (time, CPU, RSS, PSS or None)."""

    find_processes: Callable[[], list]
    samples: list[tuple[float, float, float, float | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="bench-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        tracker = ProcessTracker(self.find_processes)
        while not self._stop.wait(1.0):
            procs = tracker.current()
            cpu, rss = tracker.usage(procs)
            self.samples.append((time.time(), cpu, rss, pss_mb(procs)))

    def mean_between(
        self, start: float, end: float
    ) -> tuple[float | None, float | None, float | None]:
        """Mean (CPU %, RSS MiB, PSS MiB) of the samples taken in [start + 2 s, end), rounded to
        a tenth; None for a figure with no sample (PSS: none where the platform has no PSS)."""
        # The first sample of a new process reads 0 % CPU; skip the first two seconds.
        window = [(c, r, p) for t, c, r, p in self.samples if start + 2 <= t < end]
        if not window:
            return None, None, None
        pss = [p for _, _, p in window if p is not None]
        return (
            round(sum(c for c, _, _ in window) / len(window), 1),
            round(sum(r for _, r, _ in window) / len(window), 1),
            round(sum(pss) / len(pss), 1) if pss else None,
        )


def has_reference(topology: str) -> bool:
    """True for a registered user job (NAME: its newest version; NAME@V: that version) that
    ships a reference function."""
    name, _, number = topology.partition("@")
    versions = RegisteredTopology.objects.filter(name=name)
    if number.isdigit():
        versions = versions.filter(version=int(number))
    version = versions.order_by("-version").first()
    return version is not None and bool(version.shape.get("has_reference"))


def policy_value(name: str, text: str):
    """`text` as the type of policy field `name` (its default's), for --policy."""
    default = getattr(PolicyConfig(), name)
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--policy: {name} is true or false, not {text!r}")
        return text.lower() in ("true", "1")
    try:
        return type(default)(text)
    except ValueError:
        kind = {int: "an integer", float: "a number"}.get(type(default), type(default).__name__)
        raise ValueError(f"--policy: {name} is {kind}, not {text!r}") from None


def topology_params(topology_name: str) -> dict:
    """The topology's operator params, merged (topn: window_seconds and n), as the ground truth
    and the Flink peer's job take them."""
    _, topology = job_topology(topology_name)
    return {name: value for op in topology.operators for name, value in op.params.items()}


def compare_redis(
    client, job_key: str, topology_name: str, params: dict
) -> tuple[truth.Comparison, object]:
    """A job's results against ground truth from its whole input: (comparison, results)."""
    entries = client.xrange(data_keys.input_stream(job_key))
    topology = resolve_topology(topology_name)
    if topology.job is not None:
        expected = user_plan.expected_results(topology.job, entries)
        actual = user_plan.actual_results(topology.job, client, job_key)
        return truth.compare_records(expected, actual), actual
    expected = truth.expected_cells(topology_name, [fields for _, fields in entries], params)
    actual = truth.result_cells(topology_name, client.hgetall(data_keys.results(job_key)))
    return truth.compare(expected, actual), actual


def drain(
    client,
    job_key: str,
    topology: str,
    params: dict,
    timeout_s: float,
    say,
    compare_now: Callable[[], tuple[truth.Comparison, object]] | None = None,
) -> tuple[truth.Comparison, float]:
    """Wait until the results equal the ground truth, or stop changing for 90 s (a restart
    under load can take a minute), or `timeout_s`; returns the comparison and the wait.
    `compare_now()`: (comparison, results) as they are now; by default the job's Redis results
    against its Redis input (`compare_redis`)."""
    if compare_now is None:

        def compare_now():
            return compare_redis(client, job_key, topology, params)

    started = time.time()
    last, last_change = None, started
    while True:
        comparison, actual = compare_now()
        if comparison.exact:
            # A late duplicate would show up as an overshoot: look once more.
            time.sleep(3)
            return compare_now()[0], time.time() - started
        if actual != last:
            last, last_change = actual, time.time()
        if time.time() - last_change > 90 or time.time() - started > timeout_s:
            say(f"      results still differ after waiting: {comparison}")
            return comparison, time.time() - started
        time.sleep(2)


def measure_progress(
    records: list, bench: BenchSettings, t0: float, injected_at: list[float], input_stage: str
) -> tuple[dict, list, dict]:
    """What one run's progress records say, measured the same way for every run (Backstop's
    strategies and the Flink peer): steady figures, each fault's measurement and the plotted
    series. `t0`: when the input started; `injected_at`: each fault's time (epoch s)."""
    config = Policy.current().to_config()
    steady_window = (t0 + bench.steady_s[0], t0 + bench.steady_s[1])
    steady = measure.steady_figures(records, *steady_window, input_stage)
    measured = measure_faults(
        records,
        injected_at,
        input_started_at=t0,
        end=t0 + bench.input_s,
        watch_ended=True,
        settings=bench.recovery_settings(config.recovery_band),
    )
    series = measure.downsample_series(
        records, t0, t0 + bench.input_s + 60, input_end=t0 + bench.input_s
    )
    return steady, measured, series


def fault_row(figures, t0: float, kind: str, target: str, detail: str, action: str) -> dict:
    """One fault's row of bench.json (the console's per-episode figures are added by Backstop's
    runs)."""
    return {
        "kind": kind,
        "at_s": round(figures.fault_at - t0, 1),
        "target": target,
        "injected": detail,
        "action": action,
        "downtime_s": figures.downtime_s,
        "recovery_time_s": figures.recovery_time_s,
        "peak_p99_ms": figures.peak_p99_ms,
        "note": figures.note,
        "watched_s": figures.watched_s,
    }
