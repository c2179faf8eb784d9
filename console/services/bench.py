"""The side-by-side strategy benchmark (`manage.py bench`): the same seeded workload and the same
fault schedule under each strategy, one job after another, on a cluster this module starts.

Per strategy: launch the job through the normal services (planner, controller, node agents),
let the generator write `rate * (warmup + duration)` events, inject the faults at fixed offsets
from the first input event (through `request_fault`, as an operator would), sample the job's
processes' CPU and memory, wait until the output has caught up, compare the results with the
ground truth computed in plain Python from the input (console/bench/truth.py), stop the job, and
measure every fault from the recorded progress (console/bench/measure.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, User

from console.bench import measure, report, truth
from console.models import FaultInjection, Job, Node, Policy, RecoveryEpisode, RegisteredTopology
from console.policy.config import PolicyConfig
from console.policy.recovery import RecoverySettings, measure_faults
from console.roles import OPERATOR
from console.services.control.observe import load_supervisor
from console.services.demo_setup import DEMO_NODES, ensure_demo_nodes
from console.services.faults import FaultRefused, request_fault
from console.services.jobs import create_job, kill_job_processes, kill_warm_spares, stop_job
from console.services.policy import PolicyRejected, change_policy, revert_policy
from console.services.recovery import PROGRESS_READ_LIMIT, episode_measurement, input_started_at
from console.services.schedules import ensure_periodic_tasks
from console.services.topologies import job_topology
from spark_runtime import keys as data_keys
from spark_runtime import user_plan
from spark_runtime.activity import pss_mb
from spark_runtime.jobdef import resolve_topology
from spark_runtime.progress import read_progress
from spark_runtime.strategies import STRATEGIES
from spark_runtime.topology import SINK, SOURCE
from web.launcher import LocalCluster, ProcessGroup, start_redis_if_needed, wait_for
from workers.node_metrics import (
    ProcessTracker,
    argv_of,
    cmdline_arg,
    spare_processes,
    stage_processes,
    with_children,
)
from workers.redis_client import redis_client

FAULT_KINDS = ("kill-driver", "kill-node", "operator-exception")
BENCH_USER = "bench"
# Other stream processors the benchmark can run the same workload on (console/services/
# bench_flink.py), after Backstop's strategies.
PEERS = ("flink",)


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
    # The peer's configuration beyond its defaults (Flink: (key, value) pairs).
    peer_conf: tuple[tuple[str, str], ...] = ()
    # Policy settings for the runs, (field, value as given) pairs (`policy_for_runs`).
    policy: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        problems = []
        if self.peer is not None and self.peer not in PEERS:
            problems.append(f"--peer: one of {', '.join(PEERS)}")
        if self.peer_conf and self.peer != "flink":
            problems.append("--flink-conf: only with --peer flink")
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


def stage_processes_of(job_key: str) -> Callable[[], list]:
    """The stage processes of a Backstop job and their JVMs (what ResourceSampler samples)."""
    return lambda: with_children(stage_processes(job=job_key))


def is_backstop_worker(cmdline: list[str]) -> bool:
    """Whether a process is a Celery worker or beat of Backstop (`celery -A web ...`). A running
    Celery worker renames itself: `[celeryd: name:MainProcess] -active- (-A web worker ...)`,
    one string that `argv_of` splits, with its original arguments in parentheses."""
    args = [arg.strip("()") for arg in argv_of(cmdline)]
    celery = any("celery" in arg for arg in args[:3])
    return celery and cmdline_arg(args, "-A") == "web"


def other_backstop_workers() -> list[str]:
    """Celery workers of Backstop already running on this machine (e.g. the demo's)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if is_backstop_worker(cmdline):
            found.append(f"pid {proc.pid}: {' '.join(argv_of(cmdline))[:120]}")
    return found


class BenchCluster:
    """Redis (if none answers), the controller, beat and one agent per demo node, for the
    duration of a `with` block; logs in `log_dir`."""

    def __init__(self, log_dir: Path, say):
        self.group = ProcessGroup(log_dir, say=say)
        self.log_dir = log_dir
        self.say = say

    def __enter__(self) -> BenchCluster:
        busy = other_backstop_workers()
        if busy:
            raise RuntimeError(
                "other Backstop workers are running on this machine (stop the demo first: the "
                "benchmark needs the cores to itself and the node queues to its own agents): "
                + "; ".join(busy)
            )
        # Whatever started before a failure or a SIGTERM during start-up (Redis, the controller,
        # beat, agents) is stopped here: the `with` block's __exit__ does not run then.
        try:
            self.say("Redis: " + start_redis_if_needed(
                django_settings.REDIS_URL, self.group, self.log_dir / "redis"
            ))  # fmt: skip
            abandoned = end_abandoned_bench_jobs()
            if abandoned:
                self.say(f"ended {abandoned} job(s) an interrupted benchmark run left live")
            nodes = ensure_demo_nodes()
            ensure_periodic_tasks()
            # Agents start with the spare targets a previous run left in Redis: no spares until a
            # job that uses them asks (they would load the restart-all baseline).
            targets = redis_client()
            for node in nodes:
                targets.set(data_keys.spares_wanted(node.name), 0)
            LocalCluster(
                self.group,
                DEMO_NODES,
                node_mem_mb=nodes[0].mem_total_mb,
                beat_schedule=self.log_dir / "beat",
                worker_prefix="bench-",
            ).start(django_settings.REDIS_URL)
        except BaseException:
            self.__exit__()
            raise
        self.say(f"controller, beat and agents {', '.join(DEMO_NODES)} up (logs: {self.log_dir})")
        return self

    def __exit__(self, *exc) -> None:
        self.group.stop()
        kill_warm_spares(django_settings.REDIS_URL)


def end_abandoned_bench_jobs() -> int:
    """Mark failed (and kill the processes of) the benchmark's jobs that are still live: an
    interrupted run leaves them so, and the new run's watchdog would otherwise resume supervising
    them next to the new jobs. Only the benchmark user's jobs are touched."""
    abandoned = list(
        Job.objects.filter(status__in=Job.LIVE_STATUSES, created_by__username=BENCH_USER)
    )
    for job in abandoned:
        job.mark_failed("left live by an interrupted benchmark run")
    kill_job_processes({job.key for job in abandoned})
    return len(abandoned)


def bench_user() -> User:
    """The operator the benchmark's jobs and faults are recorded under."""
    user, created = User.objects.get_or_create(username=BENCH_USER)
    if created:
        user.set_unusable_password()
        user.save()
    user.groups.add(Group.objects.get_or_create(name=OPERATOR)[0])
    return user


def key_operator(job: Job) -> str:
    """The processing operator with the highest fault-tolerance priority (the key stage)."""
    return (
        job.operators.exclude(kind__in=(SOURCE, SINK))
        .order_by("-priority", "name")
        .values_list("name", flat=True)
        .first()
    )


def _wait_status(job: Job, statuses: tuple[str, ...], timeout_s: float, what: str) -> Job:
    def reached() -> bool:
        job.refresh_from_db(fields=["status", "status_reason"])
        return job.status in statuses

    wait_for(reached, timeout_s, what, poll_s=1)
    return job


def _sleep_until(when: float) -> None:
    time.sleep(max(0.0, when - time.time()))


def _inject(job: Job, kind: str, target: str, user: User) -> tuple[FaultInjection | None, str]:
    """Request one fault like an operator would and wait for the controller to inject it."""
    client = redis_client()
    try:
        if kind in ("kill-driver", "operator-exception"):
            fault = request_fault(job, kind, target_operator=target, requested_by=user)
        else:
            stage = job.operators.get(name=target).stage
            supervisor = load_supervisor(client, job)
            node_name = (
                supervisor.placement_by_stage().get(stage, (None,))[0] if supervisor else None
            )
            if node_name is None:
                return None, f"no primary of {stage} to take down"
            fault = request_fault(
                job, kind, target_node=Node.objects.get(name=node_name), requested_by=user
            )
    except FaultRefused as exc:
        return None, f"refused: {exc}"
    finally:
        client.close()

    def injected() -> bool:
        fault.refresh_from_db()
        return fault.outcome != FaultInjection.Outcome.PENDING

    wait_for(injected, 30, f"fault {fault.pk} to be injected", poll_s=0.2)
    return fault, fault.outcome_detail


def has_reference(topology: str) -> bool:
    """True for a registered user job whose newest version ships a reference function."""
    version = RegisteredTopology.objects.filter(name=topology).order_by("-version").first()
    return version is not None and bool(version.shape.get("has_reference"))


def _compare_now(
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
    client, job_key: str, topology: str, params: dict, timeout_s: float, say
) -> tuple[truth.Comparison, float]:
    """Wait until the results equal the ground truth, or stop changing for 90 s (a restart
    under load can take a minute), or `timeout_s`; returns the comparison and the wait."""
    started = time.time()
    last, last_change = None, started
    while True:
        comparison, actual = _compare_now(client, job_key, topology, params)
        if comparison.exact:
            # A late duplicate would show up as an overshoot: look once more.
            time.sleep(3)
            return _compare_now(client, job_key, topology, params)[0], time.time() - started
        if actual != last:
            last, last_change = actual, time.time()
        if time.time() - last_change > 90 or time.time() - started > timeout_s:
            say(f"      results still differ after waiting: {comparison}")
            return comparison, time.time() - started
        time.sleep(2)


def topology_params(topology_name: str) -> dict:
    """The topology's operator params, merged (topn: window_seconds and n), as the ground truth
    and the Flink peer's job take them."""
    _, topology = job_topology(topology_name)
    return {name: value for op in topology.operators for name, value in op.params.items()}


def run_strategy(bench: BenchSettings, strategy: str, target: str | None, say) -> tuple[dict, str]:
    """Run one strategy's job through the workload and the fault schedule; returns its
    bench.json run and the faults' target operator (chosen on the first run, kept after)."""
    user = bench_user()
    params = topology_params(bench.topology)
    job = create_job(
        name=f"bench-{bench.topology}-{strategy}-{time.strftime('%H%M%S')}",
        topology=bench.topology,
        strategy=strategy,
        params={"rate": bench.rate, "seed": bench.seed, "count": bench.events},
        user=user,
    )
    client = redis_client()
    launched = time.time()
    _wait_status(job, (Job.Status.RUNNING, Job.Status.FAILED), 300, f"job {job.pk} to run")
    if job.status != Job.Status.RUNNING:
        raise RuntimeError(f"job {job.pk} ({strategy}) failed to start: {job.status_reason}")
    target = target or key_operator(job)
    wait_for(lambda: client.xlen(data_keys.input_stream(job.key)) > 0, 60, "the first input")
    t0 = input_started_at(client, job.key)
    say(f"      job {job.pk} running after {t0 - launched:.0f} s; input started")
    sampler = ResourceSampler(stage_processes_of(job.key))
    sampler.start()
    # Warm spares serve any job on their node, so they are not the job's processes; they are
    # still what the strategy costs the machine, and are reported beside the job's own figures.
    spare_sampler = ResourceSampler(lambda: with_children(spare_processes()))
    spare_sampler.start()
    faults = []
    try:
        for number, at_s in enumerate(bench.schedule, start=1):
            _sleep_until(t0 + at_s)
            fault, detail = _inject(job, bench.fault_kind, target, user)
            say(f"      fault {number}/{bench.faults} at +{at_s:.0f} s: {bench.fault_kind} "
                f"on {target}: {detail}")  # fmt: skip
            faults.append((at_s, fault, detail))
        end = t0 + bench.input_s
        say(f"      input ends in {max(0, end - time.time()):.0f} s")
        _sleep_until(end)
        wait_for(
            lambda: client.xlen(data_keys.input_stream(job.key)) >= bench.events,
            120, "the generator to finish",
        )  # fmt: skip
        comparison, drain_s = drain(
            client, job.key, job.topology, params, bench.drain_timeout_s, say
        )
    finally:
        sampler.stop()
        spare_sampler.stop()
        stop_job(job, "benchmark run over")
        try:
            _wait_status(job, (Job.Status.STOPPED, Job.Status.FAILED), 60, f"job {job.pk} to stop")
        finally:
            kill_job_processes({job.key})
    input_count = client.xlen(data_keys.input_stream(job.key))
    client.close()
    run = {
        "strategy": strategy,
        "topology": bench.topology,
        "rate": bench.rate,
        "job": job.pk,
        "input_events": input_count,
        "lost": comparison.lost,
        "duplicates": comparison.duplicates,
        "result_cells": comparison.cells,
        # Seconds after the input ended until the results equalled the ground truth (or the
        # wait ended): `lost` of an undrained run is output still missing when the wait ended.
        "drain_s": round(drain_s, 1),
        "drained": comparison.exact,
        **measure_run(job, bench, t0, faults, target),
    }
    steady_start, steady_end = bench.steady_s
    steady, fault_rows = run["steady"], run["faults"]
    steady["cpu_pct"], steady["rss_mb"], steady["pss_mb"] = sampler.mean_between(
        t0 + steady_start, t0 + steady_end
    )
    steady["spares_cpu_pct"], steady["spares_rss_mb"], steady["spares_pss_mb"] = (
        spare_sampler.mean_between(t0 + steady_start, t0 + steady_end)
    )
    say(f"      lost {run['lost']}, duplicates {run['duplicates']} over {comparison.cells} result "
        f"cells; steady p50 {steady['p50_ms']} ms, CPU {steady['cpu_pct']} %, "
        f"RSS {steady['rss_mb']} MB, PSS {steady['pss_mb']} MB (spares: CPU "
        f"{steady['spares_cpu_pct']} %, RSS {steady['spares_rss_mb']} MB, PSS "
        f"{steady['spares_pss_mb']} MB); recovery "
        + ", ".join(str(f["recovery_time_s"]) for f in fault_rows))  # fmt: skip
    return run, target


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


def measure_run(job: Job, bench: BenchSettings, t0: float, faults: list, target: str) -> dict:
    """Steady figures, per-fault figures and the plotted series of a finished run, from the
    progress records the job left in Redis. `faults`: (scheduled at_s, FaultInjection or None,
    what was injected) per fault; `t0`: when the input started (epoch s)."""
    client = redis_client()
    try:
        records = read_progress(client, job.key, t0 - 5, count=PROGRESS_READ_LIMIT)
    finally:
        client.close()
    # The stage reading the job's input: its first processing operator's (stored at launch).
    topology = resolve_topology(job.topology)
    first = next(op for op in topology.topological_order() if op.kind not in (SOURCE, SINK))
    input_stage = job.operators.get(name=first.name).stage
    injected_at = [
        fault.injected_at.timestamp() if fault and fault.injected_at else t0 + at_s
        for at_s, fault, _ in faults
    ]
    steady, measured, series = measure_progress(records, bench, t0, injected_at, input_stage)
    fault_rows = []
    for (_, fault, detail), figures in zip(faults, measured, strict=True):
        episodes = list(RecoveryEpisode.objects.filter(fault=fault)) if fault else []
        actions = sorted({e.action for e in episodes})
        reprotect = [e.reprotect_s for e in episodes if e.reprotect_s is not None]
        row = fault_row(figures, t0, bench.fault_kind, target, detail,
                        "+".join(actions) or "none recorded")  # fmt: skip
        # After a promotion: seconds until the stage had a promotable standby again.
        row["reprotect_s"] = max(reprotect) if reprotect else None
        # What the console recorded for the same fault while the job ran (measured with the
        # policy's settings, which may differ from the benchmark's).
        row["console"] = [episode_measurement(e) for e in episodes]
        fault_rows.append(row)
    return {"input_started_at": t0, "faults": fault_rows, "steady": steady, "series": series}


def remeasure(result: dict) -> dict:
    """Recompute the figures of a bench.json whose jobs' progress is still in Redis (e.g. after
    a change to the measurement); lost/duplicates and CPU/RSS/PSS are kept as measured, and a
    peer's run (no Backstop job) is kept as it is."""
    settings = result["settings"]
    bench = BenchSettings(
        **{k: settings[k] for k in ("topology", "faults", "fault_kind", "rate", "seed", "target")},
        strategies=tuple(settings["strategies"]),
        warmup_s=settings["warmup_s"],
        duration_s=settings["duration_s"],
        stable_window_s=settings["stable_window_s"],
        out=Path("."),
    )
    client = redis_client()
    for run in result["runs"]:
        if run["strategy"] not in STRATEGIES:
            continue
        job = Job.objects.get(pk=run["job"])
        t0 = run.get("input_started_at") or input_started_at(client, job.key)
        injected = list(job.faults.order_by("requested_at"))
        faults = [
            (at_s, fault, fault.outcome_detail)
            for at_s, fault in zip(bench.schedule, injected, strict=False)
        ]
        sampled = (
            "cpu_pct",
            "rss_mb",
            "pss_mb",
            "spares_cpu_pct",
            "spares_rss_mb",
            "spares_pss_mb",
        )
        kept = {k: run["steady"].get(k) for k in sampled}
        run.update(measure_run(job, bench, t0, faults, settings["target"]))
        run["steady"].update(kept)
    client.close()
    return result


def write_outputs(result: dict, out: Path) -> None:
    """bench.json, bench.md and bench.png into `out`."""
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    (out / "bench.md").write_text(report.to_markdown(result))
    report.plot_png(result, out / "bench.png")


def run_bench(bench: BenchSettings, say) -> dict:
    """Run every strategy of `bench` (and its peer) and write bench.json, bench.md and bench.png
    to its out, again after each run: a run that fails later loses none of the earlier ones."""
    bench.out.mkdir(parents=True, exist_ok=True)
    runs = []
    target = bench.target

    def result() -> dict:
        return {
            "settings": {
                **{k: v for k, v in asdict(bench).items() if k not in ("out", "strategies")},
                "strategies": list(bench.strategies),
                "target": target,
                "band": Policy.current().to_config().recovery_band,
                "machine": machine_description(),
            },
            "runs": runs,
        }

    with BenchCluster(bench.out / "logs", say), policy_for_runs(bench.policy, say):
        for number, strategy in enumerate(bench.strategies, start=1):
            say(f"[{number}/{len(bench.strategies)}] {strategy}: {bench.topology} at "
                f"{bench.rate:g} events/s, {bench.faults} x {bench.fault_kind}")  # fmt: skip
            run, target = run_strategy(bench, strategy, target, say)
            runs.append(run)
            write_outputs(result(), bench.out)
            time.sleep(5)  # let the machine settle between runs
        if bench.peer == "flink":
            from console.services.bench_flink import run_flink_peer
            from flink_peer.cluster import FlinkSettings

            say(f"[peer] flink: {bench.topology} at {bench.rate:g} events/s, {bench.faults} x "
                f"{bench.fault_kind} (Flink's nearest fault)")  # fmt: skip
            runs.append(run_flink_peer(bench, say, FlinkSettings(extra=bench.peer_conf)))
            write_outputs(result(), bench.out)
    return result()


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


@contextlib.contextmanager
def policy_for_runs(changes: tuple[tuple[str, str], ...], say):
    """Put `changes` in force for the block as a new policy version (validated and audited like
    any change), then the version in force before it back (another version: versions are never
    edited). Nothing is written without changes."""
    if not changes:
        yield
        return
    before = Policy.current()
    values = {name: policy_value(name, text) for name, text in changes}
    described = ", ".join(f"{name}={text}" for name, text in changes)
    try:
        change_policy(values, reason=f"manage.py bench --policy {described}")
    except PolicyRejected as exc:
        raise RuntimeError("; ".join(exc.errors.values())) from None
    say(f"policy for these runs: {described} (v{Policy.current().version})")
    try:
        yield
    finally:
        revert_policy(before.version)
        say(f"policy v{before.version}'s settings back in force")


def machine_description() -> str:
    """Cores, memory and Python/Spark versions of this machine, for the report."""
    import platform

    import pyspark

    return (
        f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, "
        f"PySpark {pyspark.__version__}"
    )


RESULTS_SECTION = "## Strategy benchmark (manage.py bench)"


def write_results(result: dict, command: str) -> str:
    """Put a run's tables into docs/RESULTS.md under its topology, fault kind and fault count."""
    from spark_runtime.bench_util import RESULTS_MD, write_section

    settings = result["settings"]
    subsection = (
        f"{settings['topology']}, {settings['fault_kind']}, {settings['faults']} fault(s)"
        + report.policy_text(settings.get("policy") or ())
    )
    body = (
        f"`{command}` on {time.strftime('%Y-%m-%d')} ({settings['machine']}).\n\n"
        + report.to_markdown(result)
    )
    write_section(subsection, body, section=RESULTS_SECTION)
    return f"{RESULTS_MD} / {subsection}"
