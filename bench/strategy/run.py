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
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import psutil
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, User

from bench.flink_peer.peer import run_flink_peer
from bench.results import RESULTS_MD, write_report, write_subsection
from bench.strategy import report
from bench.strategy import topics as topics_audit
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
from console.policy import truth
from console.policy.fault_params import KAFKA_BROKER
from console.redis import redis_client
from console.roles import OPERATOR
from console.services.control.observe import load_supervisor
from console.services.demo_setup import DEMO_NODES, ensure_demo_nodes
from console.services.faults import (
    FAULT_KINDS,
    FaultRefused,
    Target,
    kafka_bootstrap_of,
    request_fault,
)
from console.services.jobs import (
    JobRequestError,
    create_job,
    kill_job_processes,
    kill_warm_spares,
    stop_job,
)
from console.services.policy import PolicyRejected, change_policy, revert_policy
from console.services.recovery import PROGRESS_READ_LIMIT, episode_measurement, input_started_at
from console.services.schedules import ensure_periodic_tasks
from infra.kafka import kafka_bootstrap_servers
from infra.kafka_outage import REFUSED, UP, Outage, outage
from infra.kafka_outage import START_TIMEOUT_S as BROKER_START_TIMEOUT_S
from infra.launcher import LocalCluster, start_kafka_if_needed, start_redis_if_needed, wait_for
from infra.process_group import ProcessGroup
from infra.processes import (
    argv_of,
    cmdline_arg,
    processes_matching,
    spare_processes,
    stage_processes,
    with_children,
)
from spark_runtime import keys as data_keys
from spark_runtime import user_plan
from spark_runtime.generators import topic_record_count
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

    def __init__(self, log_dir: Path, say, kafka_dir: Path | None = None):
        self.group = ProcessGroup(log_dir, say=say)
        self.log_dir = log_dir
        self.say = say
        # With a directory: a Kafka cluster for the runs (KAFKA_BOOTSTRAP_SERVERS, or a broker
        # of the benchmark's own with its data there).
        self.kafka_dir = kafka_dir
        # This process's KAFKA_BOOTSTRAP_SERVERS setting before the block, to put back after it.
        self.kafka_before: tuple[str | None] | None = None

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
            env = self.start_kafka() if self.kafka_dir is not None else {}
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
                env=env,
            ).start(django_settings.REDIS_URL)
        except BaseException:
            self.__exit__()
            raise
        self.say(f"controller, beat and agents {', '.join(DEMO_NODES)} up (logs: {self.log_dir})")
        return self

    def start_kafka(self) -> dict[str, str]:
        """The Kafka cluster of the runs: `KAFKA_BOOTSTRAP_SERVERS` when set, else Apache Kafka's
        broker started in the group (infra.launcher.start_kafka_if_needed). This process's
        settings point at it (the job service checks a Kafka source against them); returns the
        environment that points the controller, beat and agents (and so the stages and the
        generator they start) at it."""
        configured = kafka_bootstrap_servers()
        # Kept by a BrokerKeeper registered in the runs' Redis: the kafka-broker fault stops
        # and starts this broker (infra/kafka_outage.py).
        bootstrap = start_kafka_if_needed(
            self.group, self.kafka_dir, redis_url=django_settings.REDIS_URL
        )
        self.say(
            f"Kafka: using the cluster at {bootstrap} (KAFKA_BOOTSTRAP_SERVERS)"
            if configured
            else f"Kafka: started a broker at {bootstrap} (data in {self.kafka_dir}, log in "
            f"{self.log_dir / 'kafka.log'})"
        )
        self.kafka_before = (django_settings.KAFKA_BOOTSTRAP_SERVERS,)
        django_settings.KAFKA_BOOTSTRAP_SERVERS = bootstrap
        return {"KAFKA_BOOTSTRAP_SERVERS": bootstrap}

    def __exit__(self, *exc) -> None:
        self.group.stop()
        kill_warm_spares(django_settings.REDIS_URL)
        if self.kafka_before is not None:
            (django_settings.KAFKA_BOOTSTRAP_SERVERS,) = self.kafka_before
            self.kafka_before = None


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
    """Request one fault like an operator would (`request_bench_fault`) and wait for the
    controller to inject it; (None, why) when it was refused."""
    fault, refusal = request_bench_fault(job, kind, target, user, params)
    if fault is None:
        return None, refusal

    def injected() -> bool:
        fault.refresh_from_db()
        return fault.outcome != FaultInjection.Outcome.PENDING

    wait_for(injected, 30, f"fault {fault.pk} to be injected", poll_s=0.2)
    return fault, fault.outcome_detail


def request_bench_fault(
    job: Job, kind: str, target: str, user: User, params: dict | None = None
) -> tuple[FaultInjection | None, str]:
    """Request one fault like an operator would (with `params`, else the kind's defaults):
    `target` is an operator; a node fault takes the node of its stage's primary, and a fault
    without a target (the Kafka broker) ignores it. (None, why) when it was refused."""
    client = redis_client()
    try:
        aimed_at = FAULT_KINDS[kind].target
        if aimed_at is None:
            fault = request_fault(job, kind, params=params, requested_by=user)
        elif aimed_at == Target.OPERATOR:
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
    return fault, ""


def broker_outage_of(client, job: Job, fault: FaultInjection, say) -> Outage | None:
    """The keeper's record of a kafka-broker fault's outage once the broker answers again
    (infra/kafka_outage.py), or None when the keeper refused it or never brought it back."""
    bootstrap = kafka_bootstrap_of(job)

    def settled() -> bool:
        record = outage(client, bootstrap)
        return record is not None and record.fault == fault.pk and record.state in (UP, REFUSED)

    wait_for(settled, fault.params["duration_s"] + BROKER_START_TIMEOUT_S, "the broker's return")
    record = outage(client, bootstrap)
    if record.state != UP:
        say(f"      the broker's keeper refused the outage: {record.detail}")
        return None
    say(f"      broker down {record.back_at - record.down_at:.1f} s (asked "
        f"{fault.params['duration_s']:g} s), answering again")  # fmt: skip
    return record


def broker_figures(record: Outage, records: list) -> dict:
    """A broker outage's figures: how long the broker was away (from its stop until an
    AdminClient got metadata again) and when the job's final stage first wrote output after
    that (None: no output after the return)."""
    outputs = [r.at for r in records if r.is_output and r.at >= record.back_at]
    return {
        "down_s": round(record.back_at - record.down_at, 2),
        "output_after_return_s": round(min(outputs) - record.back_at, 2) if outputs else None,
    }


class TopicAuditor:
    """The output-topic audit of a run on Kafka (bench/strategy/topics.py) as `drain` calls it:
    (comparison, results) now; the latest audit is kept for the run's figures."""

    def __init__(self, bootstrap: str, topology: str, params: dict, topics: tuple[str, str]):
        self.bootstrap, self.topology, self.params = bootstrap, topology, params
        self.input_topic, self.output_topic = topics
        self.last: topics_audit.TopicAudit | None = None

    def __call__(self) -> tuple:
        self.last = topics_audit.audit_topics(
            self.bootstrap, self.topology, self.params, self.input_topic, self.output_topic
        )
        return self.last.comparison, self.last.actual


def job_io(bench: BenchSettings, strategy: str) -> tuple[dict, tuple[str, str] | None]:
    """create_job's `source` and `sink` for one run, and its (input, output) topics: none on
    Redis; on Kafka a topic of the run's own for each, the generator feeding the input."""
    if bench.source != "kafka":
        return {}, None
    topics = topics_audit.run_topics(bench.topology, strategy, time.strftime("%Y%m%d-%H%M%S"))
    return {
        "source": {"kind": "kafka", "topic": topics[0]},
        "sink": {"kind": "kafka", "topic": topics[1]},
    }, topics


def input_seen(client, job: Job) -> bool:
    """Whether the job has read input: an entry in its input stream, or on Kafka a plan of its
    input topic with records (plan 0 is the starting point)."""
    if job.source:
        return client.llen(data_keys.kafka_plans(job.key)) > 1
    return client.xlen(data_keys.input_stream(job.key)) > 0


def input_written(client, job: Job) -> int:
    """Input entries written so far: the input stream's length, or the input topic's offsets."""
    if job.source:
        return topic_record_count(django_settings.KAFKA_BOOTSTRAP_SERVERS, job.source["topic"])
    return client.xlen(data_keys.input_stream(job.key))


def redis_results_against(client, job: Job, expected: dict) -> truth.Comparison:
    """The job's Redis results against a reference computed elsewhere (a run on Kafka: from its
    input topic), as the Redis runs compare them."""
    definition = resolve_topology(job.topology).job
    if definition is not None:
        return truth.compare_records(
            expected, user_plan.actual_results(definition, client, job.key)
        )
    results = client.hgetall(data_keys.results(job.key))
    return truth.compare(expected, truth.result_cells(job.topology, results))


def source_keys(bench: BenchSettings, client, job: Job, auditor: TopicAuditor | None) -> dict:
    """A finished run's keys of bench.json about its input and output: `source` and `trigger`;
    `audited`, what its `lost` and `duplicates` were counted on (its Redis results, or on Kafka
    its output topic as a read_committed reader sees it); `input_events`; on Kafka, `kafka`:
    the topics, the output topic's records and (key, version) pairs read twice, and the Redis
    results checked against the same reference (the stage writes Kafka first, then Redis)."""
    keys = {"source": bench.source, "trigger": bench.trigger}
    if auditor is None or auditor.last is None:
        return {
            **keys,
            "audited": "redis results",
            "input_events": client.xlen(data_keys.input_stream(job.key)),
        }
    audit = auditor.last
    in_redis = redis_results_against(client, job, audit.expected)
    return {
        **keys,
        "audited": "output topic",
        "input_events": audit.input_records,
        "kafka": {
            "bootstrap_servers": auditor.bootstrap,
            "input_topic": auditor.input_topic,
            "output_topic": auditor.output_topic,
            "output_records": audit.output_records,
            "repeated": audit.repeated,
            "redis_results": {
                "lost": in_redis.lost,
                "duplicates": in_redis.duplicates,
                "wrong_cells": in_redis.wrong_cells,
            },
        },
    }


def run_strategy(bench: BenchSettings, strategy: str, target: str | None, say) -> tuple[dict, str]:
    """Run one strategy's job through the workload and the fault schedule; returns its
    bench.json run and the faults' target operator (chosen on the first run, kept after)."""
    user = bench_user()
    params = topology_params(bench.topology)
    io, topics = job_io(bench, strategy)
    try:
        job = create_job(
            name=f"bench-{bench.topology}-{strategy}-{time.strftime('%H%M%S')}",
            topology=bench.topology,
            strategy=strategy,
            params={"rate": bench.rate, "seed": bench.seed, "count": bench.events},
            user=user,
            trigger=bench.trigger,
            **io,
        )
    except JobRequestError as exc:
        raise RuntimeError(f"{strategy}: the job was refused: {exc}") from None
    auditor = (
        TopicAuditor(django_settings.KAFKA_BOOTSTRAP_SERVERS, job.topology, params, topics)
        if topics
        else None
    )
    if topics:
        say(f"      input topic {topics[0]}, output topic {topics[1]}")
    client = redis_client()
    launched = time.time()
    wait_status(job, (Job.Status.RUNNING, Job.Status.FAILED), 300, f"job {job.pk} to run")
    if job.status != Job.Status.RUNNING:
        raise RuntimeError(f"job {job.pk} ({strategy}) failed to start: {job.status_reason}")
    target = target or key_operator(job)
    wait_for(lambda: input_seen(client, job), 60, "the first input")
    t0 = input_started_at(client, job.key)
    say(f"      job {job.pk} running after {t0 - launched:.0f} s; input started")
    sampler = ResourceSampler(stage_processes_of(job.key))
    sampler.start()
    # Warm spares serve any job on their node, so they are not the job's processes; they are
    # still what the strategy costs the machine, and are reported beside the job's own figures.
    spare_sampler = ResourceSampler(lambda: with_children(spare_processes()))
    spare_sampler.start()
    faults = []
    # Per fault of kind kafka-broker: the keeper's record of the outage (when the broker went
    # down and answered again), read before the next fault's outage replaces it.
    broker_outages: list[Outage | None] = [None] * len(bench.schedule)
    try:
        for number, at_s in enumerate(bench.schedule, start=1):
            sleep_until(t0 + at_s)
            fault, detail = inject_fault(job, bench.fault_kind, target, user, bench.fault_params)
            say(f"      fault {number}/{bench.faults} at +{at_s:.0f} s: {bench.fault_kind} "
                f"on {target}: {detail}")  # fmt: skip
            faults.append((at_s, fault, detail))
            if bench.fault_kind == KAFKA_BROKER and fault is not None:
                broker_outages[number - 1] = broker_outage_of(client, job, fault, say)
        end = t0 + bench.input_s
        say(f"      input ends in {max(0, end - time.time()):.0f} s")
        sleep_until(end)
        wait_for(
            lambda: input_written(client, job) >= bench.events, 120, "the generator to finish",
        )  # fmt: skip
        comparison, drain_s = drain(
            client, job.key, job.topology, params, bench.drain_timeout_s, say, auditor
        )
    finally:
        sampler.stop()
        spare_sampler.stop()
        stop_job(job, "benchmark run over")
        try:
            wait_status(job, (Job.Status.STOPPED, Job.Status.FAILED), 60, f"job {job.pk} to stop")
        finally:
            kill_job_processes({job.key})
    io_keys = source_keys(bench, client, job, auditor)
    client.close()
    run = {
        "strategy": strategy,
        "topology": bench.topology,
        "rate": bench.rate,
        "job": job.pk,
        **io_keys,
        "lost": comparison.lost,
        "duplicates": comparison.duplicates,
        "result_cells": comparison.cells,
        # Seconds after the input ended until the results equalled the ground truth (or the
        # wait ended): `lost` of an undrained run is output still missing when the wait ended.
        "drain_s": round(drain_s, 1),
        "drained": comparison.exact,
        **measure_run(job, bench, t0, faults, target, broker_outages),
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
        f"cells ({run['audited']}); steady p50 {steady['p50_ms']} ms, CPU {steady['cpu_pct']} %, "
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


def measure_run(
    job: Job,
    bench: BenchSettings,
    t0: float,
    faults: list,
    target: str,
    broker_outages: list[Outage | None] | None = None,
) -> dict:
    """Steady figures, per-fault figures and the plotted series of a finished run, from the
    progress records the job left in Redis. `faults`: (scheduled at_s, FaultInjection or None,
    what was injected) per fault; `t0`: when the input started (epoch s); `broker_outages`: the
    keeper's record of each kafka-broker fault's outage (None for other faults)."""
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
        outage_record = broker_outages[len(fault_rows)] if broker_outages else None
        if outage_record is not None:
            row["broker"] = broker_figures(outage_record, records)
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
        source=settings.get("source", "redis"),
        trigger=settings.get("trigger", "microbatch"),
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
        # A broker outage's record is gone from Redis by now: its figures stay as measured.
        brokers = [f.get("broker") for f in run["faults"]]
        run.update(measure_run(job, bench, t0, faults, settings["target"]))
        run["steady"].update(kept)
        for row, broker in zip(run["faults"], brokers, strict=False):
            if broker is not None:
                row["broker"] = broker
    client.close()
    return result


def write_outputs(result: dict, out: Path) -> None:
    """bench.json, bench.md and bench.png into `out`."""
    write_report(out, "bench.json", result)
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

    kafka_dir = bench.out / "kafka" if bench.source == "kafka" else None
    with BenchCluster(bench.out / "logs", say, kafka_dir), policy_for_runs(bench.policy, say):
        for number, strategy in enumerate(bench.strategies, start=1):
            say(f"[{number}/{len(bench.strategies)}] {strategy}: {bench.topology} at "
                f"{bench.rate:g} events/s, {bench.faults} x {bench.fault_kind}, source "
                f"{bench.source}, trigger {bench.trigger}")  # fmt: skip
            run, target = run_strategy(bench, strategy, target, say)
            runs.append(run)
            write_outputs(result(), bench.out)
            time.sleep(5)  # let the machine settle between runs
        if bench.peer == "flink":
            say(f"[peer] flink: {bench.topology} at {bench.rate:g} events/s, {bench.faults} x "
                f"{bench.fault_kind} (Flink's nearest fault)")  # fmt: skip
            # The peer reads the same source (a topic of its own on Kafka); no Spark trigger.
            runs.append({**run_flink_peer(bench, say, bench.flink), "source": bench.source,
                         "trigger": None})  # fmt: skip
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
        + report.source_text(settings)
        + report.policy_text(settings.get("policy") or ())
    )
    body = (
        f"`{command}` on {time.strftime('%Y-%m-%d')} ({settings['machine']}).\n\n"
        + report.to_markdown(result)
    )
    write_subsection(RESULTS_SECTION, subsection, body)
    return f"{RESULTS_MD} / {subsection}"
