"""The side-by-side strategy benchmark (`manage.py bench`): the same seeded workload and the same
fault schedule under each strategy, one job after another, on a cluster this module starts.

Per strategy: launch the job through the normal services (planner, controller, node agents),
let the generator write `rate * (warmup + duration)` events, inject the faults at fixed offsets
from the first input event (through `request_fault`, as an operator would), sample the job's
processes' CPU and memory, wait until the output has caught up, compare the results with the
ground truth computed in plain Python from the input (console/policy/truth.py), stop the job, and
measure every fault from the recorded progress with the console's recovery judgement
(console/policy/recovery.py; bench/strategy/harness.py). With `--peer flink` the same workload
then runs on Apache Flink (bench/flink_peer/peer.py).
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import psutil
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, User

from bench.flink_peer.peer import run_flink_peer
from bench.results import RESULTS_MD, write_subsection
from bench.strategy import report
from bench.strategy.harness import (
    BenchSettings,
    ResourceSampler,
    drain,
    fault_row,
    measure_progress,
    policy_value,
    topology_params,
)
from console.models import FaultInjection, Job, Node, Policy, RecoveryEpisode
from console.redis import redis_client
from console.roles import OPERATOR
from console.services.control.observe import load_supervisor
from console.services.demo_setup import DEMO_NODES, ensure_demo_nodes
from console.services.faults import FaultRefused, request_fault
from console.services.jobs import create_job, kill_job_processes, kill_warm_spares, stop_job
from console.services.policy import PolicyRejected, change_policy, revert_policy
from console.services.recovery import PROGRESS_READ_LIMIT, episode_measurement, input_started_at
from console.services.schedules import ensure_periodic_tasks
from infra.launcher import LocalCluster, ProcessGroup, start_redis_if_needed, wait_for
from infra.processes import (
    argv_of,
    cmdline_arg,
    processes_matching,
    spare_processes,
    stage_processes,
    with_children,
)
from spark_runtime import keys as data_keys
from spark_runtime.jobdef import resolve_topology
from spark_runtime.progress import read_progress
from spark_runtime.strategies import STRATEGIES
from spark_runtime.topology import SINK, SOURCE

BENCH_USER = "bench"


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
    return [
        f"pid {proc.pid}: {' '.join(argv_of(proc.info['cmdline']))[:120]}"
        for proc in processes_matching(is_backstop_worker)
    ]


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


def bench_user(username: str = BENCH_USER) -> User:
    """The operator a benchmark's jobs and faults are recorded under (the soak has its own)."""
    user, created = User.objects.get_or_create(username=username)
    if created:
        user.set_unusable_password()
        user.save()
    user.groups.add(Group.objects.get_or_create(name=OPERATOR)[0])
    return user


def key_operator(job: Job, stage: str | None = None) -> str:
    """The processing operator with the highest fault-tolerance priority (the key stage), or
    the highest of `stage`'s."""
    operators = job.operators.filter(stage=stage) if stage else job.operators.all()
    return (
        operators.exclude(kind__in=(SOURCE, SINK))
        .order_by("-priority", "name")
        .values_list("name", flat=True)
        .first()
    )


def wait_status(job: Job, statuses: tuple[str, ...], timeout_s: float, what: str) -> Job:
    def reached() -> bool:
        job.refresh_from_db(fields=["status", "status_reason"])
        return job.status in statuses

    wait_for(reached, timeout_s, what, poll_s=1)
    return job


def sleep_until(when: float) -> None:
    time.sleep(max(0.0, when - time.time()))


def inject_fault(
    job: Job, kind: str, target: str, user: User, params: dict | None = None
) -> tuple[FaultInjection | None, str]:
    """Request one fault like an operator would (with `params`, else the kind's defaults) and
    wait for the controller to inject it. `target` is an operator; a node fault takes the node
    of its stage's primary."""
    client = redis_client()
    try:
        if kind not in FaultInjection.NODE_KINDS:
            fault = request_fault(
                job, kind, target_operator=target, params=params, requested_by=user
            )
        else:
            stage = job.operators.get(name=target).stage
            supervisor = load_supervisor(client, job)
            node_name = (
                supervisor.placement_by_stage().get(stage, (None,))[0] if supervisor else None
            )
            if node_name is None:
                return None, f"no primary of {stage} to take down"
            fault = request_fault(
                job,
                kind,
                target_node=Node.objects.get(name=node_name),
                params=params,
                requested_by=user,
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
    wait_status(job, (Job.Status.RUNNING, Job.Status.FAILED), 300, f"job {job.pk} to run")
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
            sleep_until(t0 + at_s)
            fault, detail = inject_fault(job, bench.fault_kind, target, user)
            say(f"      fault {number}/{bench.faults} at +{at_s:.0f} s: {bench.fault_kind} "
                f"on {target}: {detail}")  # fmt: skip
            faults.append((at_s, fault, detail))
        end = t0 + bench.input_s
        say(f"      input ends in {max(0, end - time.time()):.0f} s")
        sleep_until(end)
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
            wait_status(job, (Job.Status.STOPPED, Job.Status.FAILED), 60, f"job {job.pk} to stop")
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


def run_progress(job: Job, topology_name: str, t0: float) -> tuple[list, str]:
    """A finished run's progress records from just before `t0` (when its input started), and
    the stage reading its input: the first processing operator's of `topology_name` (stored
    at launch)."""
    client = redis_client()
    try:
        records = read_progress(client, job.key, t0 - 5, count=PROGRESS_READ_LIMIT)
    finally:
        client.close()
    topology = resolve_topology(topology_name)
    first = next(op for op in topology.topological_order() if op.kind not in (SOURCE, SINK))
    return records, job.operators.get(name=first.name).stage


def measure_run(job: Job, bench: BenchSettings, t0: float, faults: list, target: str) -> dict:
    """Steady figures, per-fault figures and the plotted series of a finished run, from the
    progress records the job left in Redis. `faults`: (scheduled at_s, FaultInjection or None,
    what was injected) per fault; `t0`: when the input started (epoch s)."""
    records, input_stage = run_progress(job, job.topology, t0)
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
        # The first part of the gap: until the controller knew of the failure (the agent's
        # exit report, a stage's own report, or missed heartbeats).
        detected = min((e.detected_at for e in episodes), default=None)
        row["detected_after_s"] = (
            round(detected.timestamp() - fault.injected_at.timestamp(), 2)
            if detected and fault.injected_at
            else None
        )
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
            say(f"[peer] flink: {bench.topology} at {bench.rate:g} events/s, {bench.faults} x "
                f"{bench.fault_kind} (Flink's nearest fault)")  # fmt: skip
            runs.append(run_flink_peer(bench, say, bench.flink))
            write_outputs(result(), bench.out)
    return result()


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
    # PySpark only for its version, when a run starts: `manage.py bench --help` stays quick.
    import pyspark

    return (
        f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, "
        f"PySpark {pyspark.__version__}"
    )


RESULTS_SECTION = "## Strategy benchmark (manage.py bench)"


def write_results(result: dict, command: str) -> str:
    """Put a run's tables into docs/RESULTS.md under its topology, fault kind and fault count."""
    settings = result["settings"]
    subsection = (
        f"{settings['topology']}, {settings['fault_kind']}, {settings['faults']} fault(s)"
        + report.policy_text(settings.get("policy") or ())
    )
    body = (
        f"`{command}` on {time.strftime('%Y-%m-%d')} ({settings['machine']}).\n\n"
        + report.to_markdown(result)
    )
    write_subsection(RESULTS_SECTION, subsection, body)
    return f"{RESULTS_MD} / {subsection}"
