"""The Flink peer of the strategy benchmark (`manage.py bench --peer flink`).

The same workload as Backstop's runs (topology, seeded generator, rate, warm-up, duration, fault
schedule) on Apache Flink from PyPI, measured by the same code: a standalone Flink cluster
(bench/flink_peer/cluster.py: a JobManager and one-slot TaskManagers, one of them a spare), the
job of bench/flink_peer/job.py reading the input stream through the bridge of
bench/flink_peer/bridge.py and writing the same results hash and progress records, the faults
injected at the same offsets, the results compared with the same ground truth and the faults
measured by the console's measurement (bench/strategy/harness.py, `measure_progress`).

With `--source kafka` the job reads an input topic of its own, which the same generator feeds,
with Flink's KafkaSource, and writes its results to an output topic of its own with Flink's
KafkaSink, exactly once (bench/flink_peer/kafka_io.py); no bridge. The output topic is audited
as Backstop's runs' are (bench/strategy/topics.py), and the output gaps are measured as a
read_committed reader of it sees the results (kafka_io.OutputWatcher).

Runs in the project's environment under Django (unlike job.py, which runs in Flink's).

Backstop's fault kinds map to Flink's nearest: kill-driver and kill-node kill a TaskManager
that runs the job's tasks (with its Python workers; the spare takes over) and start a new one in
its place at once, as a process manager would (Backstop's agents restart processes too), so the
next fault again finds a spare; operator-exception raises in the job's result-writing operator.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path

from django.conf import settings as django_settings

from bench.flink_peer import kafka_io
from bench.flink_peer.bridge import bridge_delays, run_bridge
from bench.flink_peer.cluster import FlinkCluster, FlinkSettings, checkpoint_interval_ms
from bench.flink_peer.connector import KAFKA_CONNECTOR, fetch_kafka_connector
from bench.flink_peer.env import FLINK_VERSION, ensure_flink_env
from bench.flink_peer.functions import PROGRESS_STAGE
from bench.flink_peer.phases import jobmanager_phases
from bench.strategy.harness import (
    BenchSettings,
    ResourceSampler,
    drain,
    fault_row,
    measure_progress,
    topology_params,
)
from console.policy import truth
from console.redis import redis_client
from console.services.recovery import PROGRESS_READ_LIMIT, input_started_at
from infra.launcher import wait_for
from spark_runtime import external_io
from spark_runtime import keys as data_keys
from spark_runtime.config import stage_env_overrides
from spark_runtime.generators import topic_record_count
from spark_runtime.launch import start_stage_process
from spark_runtime.progress import percentiles, read_progress

FLINK_FAULTS = {
    "kill-driver": "kill-taskmanager",
    "kill-node": "kill-taskmanager",
    "operator-exception": "task-exception",
}


def inject_flink_fault(cluster: FlinkCluster, client, job_key: str, kind: str) -> str:
    """Carry out one fault on the Flink job; returns what was done."""
    if kind == "kill-taskmanager":
        name = cluster.busy_taskmanager()
        pids = cluster.kill_taskmanager(name)
        replacement = cluster.replace_taskmanager(name)
        return (
            f"SIGKILL to TaskManager {name} and its Python workers (pids {pids}); "
            f"{replacement} started in its place"
        )
    client.set(data_keys.flink_task_fault(job_key), "1")
    return "task failure flag set: the result writer raises"


def kafka_for_run(bench: BenchSettings, job_key: str, client, say) -> kafka_io.PeerTopics:
    """The Kafka input and output of a run on `--source kafka`: Flink's connector (fetched once),
    the run's topics (created), and the job key's recorded source and sink, by which the
    generator finds the topic it feeds (`python -m spark_runtime generate`)."""
    bootstrap = django_settings.KAFKA_BOOTSTRAP_SERVERS
    if not bootstrap:
        raise RuntimeError("the Flink peer on --source kafka needs a Kafka cluster (none is set)")
    jar = fetch_kafka_connector(say)
    topics = kafka_io.peer_topics(
        bootstrap, bench.topology, job_key, time.strftime("%Y%m%d-%H%M%S"), jar
    )
    kafka_io.create_topics(topics)
    external_io.save(client, job_key, external_io.ExternalIO(
        external_io.KafkaSource(topics.input_topic, bootstrap),
        external_io.KafkaSink(topics.output_topic, bootstrap),
    ))  # fmt: skip
    say(f"      input topic {topics.input_topic}, output topic {topics.output_topic} "
        f"(KafkaSource and KafkaSink of {KAFKA_CONNECTOR}, exactly once)")  # fmt: skip
    return topics


def run_flink_peer(bench: BenchSettings, say, flink: FlinkSettings | None = None) -> dict:
    """One Flink run of `bench`'s workload and fault schedule; returns its bench.json run."""
    if bench.topology not in truth.CHECKED_TOPOLOGIES:
        raise RuntimeError(f"the Flink peer runs {', '.join(truth.CHECKED_TOPOLOGIES)} only")
    flink = flink or FlinkSettings()
    env = ensure_flink_env(say)
    job_key = f"flink-{bench.topology}-{time.strftime('%H%M%S')}"
    run_dir = (bench.out / "flink" / job_key).resolve()
    params = topology_params(bench.topology)
    client = redis_client()
    data_keys.delete_job_keys(client, job_key)
    redis_url = django_settings.REDIS_URL
    on_kafka = bench.source == "kafka"
    kafka = kafka_for_run(bench, job_key, client, say) if on_kafka else None
    auditor = kafka_io.OutputAuditor(kafka, bench.topology, params) if on_kafka else None
    stop_bridge = threading.Event()
    watcher = None
    # The FileSource fails the job while its directory does not exist.
    (run_dir / "in").mkdir(parents=True, exist_ok=True)
    (run_dir / "log").mkdir(parents=True, exist_ok=True)
    with FlinkCluster(env, flink, run_dir, say=say) as cluster:
        job_id = cluster.submit(
            job_arguments(bench.topology, job_key, run_dir / "in", redis_url, params, flink,
                          cluster.config, kafka)
        )  # fmt: skip
        say(
            f"      Flink job {job_id} running ({flink.taskmanagers} TaskManagers, parallelism "
            f"{flink.parallelism}, {flink.profile} profile, checkpoints every "
            f"{checkpoint_interval_ms(cluster.config)} ms)"
        )
        if on_kafka:
            watcher = kafka_io.OutputWatcher(
                redis_client(), job_key, kafka.bootstrap, kafka.output_topic
            )
            watcher.start()
        else:
            threading.Thread(
                target=run_bridge,
                args=(redis_client(), job_key, run_dir / "in"),
                kwargs={"stop": stop_bridge.is_set},
                name="flink-bridge",
                daemon=True,
            ).start()
        # The generator Backstop's agents start for a job, with the same seed, rate and count
        # (into the input topic when the job key's recorded source is one).
        generator = start_stage_process(
            "spark_runtime",
            ["generate", "--topology", bench.topology, "--job", job_key,
             "--rate", str(bench.rate), "--seed", str(bench.seed), "--count", str(bench.events),
             "--redis-url", redis_url],
            run_dir / "log" / "generator.log",
            env_overrides=stage_env_overrides(redis_url),
        )  # fmt: skip
        if on_kafka:
            wait_for(
                lambda: topic_record_count(kafka.bootstrap, kafka.input_topic) > 0,
                60, "the first input",
            )  # fmt: skip
            t0 = kafka_io.first_record_at(kafka.bootstrap, kafka.input_topic)
        else:
            wait_for(
                lambda: client.xlen(data_keys.input_stream(job_key)) > 0, 60, "the first input"
            )
            t0 = input_started_at(client, job_key)
        sampler = ResourceSampler(cluster.live_processes)
        sampler.start()
        faults = []
        try:
            for number, at_s in enumerate(bench.schedule, start=1):
                time.sleep(max(0.0, t0 + at_s - time.time()))
                kind = FLINK_FAULTS[bench.fault_kind]
                injected = time.time()
                detail = inject_flink_fault(cluster, client, job_key, kind)
                say(f"      fault {number}/{bench.faults} at +{at_s:.0f} s: {kind}: {detail}")
                faults.append((injected, kind, detail))
            time.sleep(max(0.0, t0 + bench.input_s - time.time()))
            generator.wait(timeout=120)
            comparison, drain_s = drain(
                client, job_key, bench.topology, params, bench.drain_timeout_s, say, auditor
            )
            status = cluster.job_status(job_id)
        finally:
            sampler.stop()
            stop_bridge.set()
            if watcher is not None:
                watcher.stop()
                watcher.client.close()
            if generator.poll() is None:
                generator.kill()
                generator.wait()
            cluster.cancel(job_id)
    if watcher is not None and watcher.error is not None:
        raise RuntimeError(f"reading the output topic {kafka.output_topic}: {watcher.error}")
    records = read_progress(client, job_key, t0 - 5, count=PROGRESS_READ_LIMIT)
    steady, measured, series = measure_progress(
        records, bench, t0, [at for at, _, _ in faults], PROGRESS_STAGE
    )
    steady_start, steady_end = bench.steady_s
    steady["cpu_pct"], steady["rss_mb"], steady["pss_mb"] = sampler.mean_between(
        t0 + steady_start, t0 + steady_end
    )
    delays = percentiles([] if on_kafka else bridge_delays(run_dir / "in"))
    phases = jobmanager_phases(
        cluster.log_dir, [at for at, _, _ in faults], [r.at for r in records if r.is_output]
    )
    run = {
        "strategy": "flink",
        "topology": bench.topology,
        "rate": bench.rate,
        "job": job_key,
        "input_events": client.xlen(data_keys.input_stream(job_key)),
        "lost": comparison.lost,
        "duplicates": comparison.duplicates,
        "result_cells": comparison.cells,
        "drain_s": round(drain_s, 1),
        "drained": comparison.exact,
        "input_started_at": t0,
        "faults": [
            fault_row(figures, t0, kind, "flink job", detail, "flink restart from checkpoint")
            | {"phases": steps, "detected_after_s": steps["detection_s"]}
            for (_, kind, detail), figures, steps in zip(faults, measured, phases, strict=True)
        ],
        "steady": steady,
        "series": series,
        "flink_profile": flink.profile,
        "peer": peer_record(flink, cluster.config, job_id, status, delays, cluster.log_dir, kafka),
    }
    if auditor is not None and auditor.last is not None:
        run.update(auditor.run_keys())
    client.close()
    via = (
        f"output topic, {run['kafka']['output_records']} records read committed"
        if on_kafka
        else f"bridge p50 {run['peer']['bridge_p50_ms']} ms"
    )
    say(f"      lost {run['lost']}, duplicates {run['duplicates']} over {comparison.cells} result "
        f"cells; steady p50 {steady['p50_ms']} ms ({via}), "
        f"CPU {steady['cpu_pct']} %, RSS {steady['rss_mb']} MB, PSS {steady['pss_mb']} MB; "
        "recovery "
        + ", ".join(str(f["recovery_time_s"]) for f in run["faults"]))  # fmt: skip
    return run


def job_arguments(
    topology: str,
    job_key: str,
    input_dir: Path,
    redis_url: str,
    params: dict,
    flink: FlinkSettings,
    config: dict[str, str],
    kafka: kafka_io.PeerTopics | None = None,
) -> list[str]:
    """The arguments of bench/flink_peer/job.py: the checkpoint interval is the configuration's
    (so that a --flink-conf execution.checkpointing.interval holds for the job too). With
    `kafka`, the job reads and writes its topics instead of the bridge's files."""
    source = kafka.job_arguments() if kafka is not None else ["--input-dir", str(input_dir)]
    return [
        "--topology", topology, "--job", job_key, *source,
        "--redis-url", redis_url, "--checkpoint-ms", str(checkpoint_interval_ms(config)),
        "--discovery-ms", str(flink.discovery_ms),
        "--parallelism", str(flink.parallelism),
        "--window-seconds", str(params.get("window_seconds", 10)),
        "--n", str(params.get("n", 5)),
    ]  # fmt: skip


def peer_record(
    flink: FlinkSettings,
    config: dict[str, str],
    job_id: str,
    status: dict,
    delays: dict,
    log_dir: Path,
    kafka: kafka_io.PeerTopics | None = None,
) -> dict:
    """The `peer` part of the Flink run in bench.json: how Flink ran, enough to run it again
    (the profile, every setting, the whole configuration the cluster got), and what it did."""
    return {
        "flink_version": FLINK_VERSION,
        # Where the job read and wrote: the bridge's files and Redis, or Kafka topics through
        # Flink's connector (exactly once, under the run's transactional id prefix).
        "source": "redis" if kafka is None else "kafka",
        "kafka_connector": None if kafka is None else KAFKA_CONNECTOR,
        "delivery_guarantee": None if kafka is None else "EXACTLY_ONCE",
        "transactional_id_prefix": None if kafka is None else kafka.transactional_id_prefix,
        "flink_profile": flink.profile,
        # The profile's values with the options given over them (FlinkSettings' fields).
        "flink_settings": {key: value for key, value in asdict(flink).items() if key != "extra"},
        # config.yaml as written: Flink's defaults hold for every key not in it.
        "flink_config": dict(config),
        "job_id": job_id,
        # Flink's exception history: one entry per failure it restarted from.
        "failures": status["failures"],
        "state_at_end": status["state"],
        "taskmanagers": flink.taskmanagers,
        "parallelism": flink.parallelism,
        # The interval in force (a --flink-conf value over the option's).
        "checkpoint_ms": checkpoint_interval_ms(config),
        "file_discovery_ms": flink.discovery_ms,
        "bundle_time_ms": flink.bundle_time_ms,
        "buffer_timeout_ms": flink.buffer_timeout_ms,
        "extra_conf": dict(flink.extra),
        # The bridge's share of the latency (file complete - event time), in ms; None on Kafka
        # (no bridge).
        "bridge_p50_ms": _ms(delays["p50"]),
        "bridge_p99_ms": _ms(delays["p99"]),
        "logs": str(log_dir),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)
