"""What the console pages read of jobs' Kafka input and output: the job page's Kafka panel and
the overview's lag column (console.services.kafka_status says what the data plane writes and
which entries count). Plain Python out, as console/dash/data.py: figure builders never touch
Redis or the ORM."""

from __future__ import annotations

import time

from console.redis import redis_client
from console.services import kafka_status, queries
from spark_runtime import keys as data_keys


def job_kafka(job: dict, replicas: list[dict]) -> dict | None:
    """The job page's Kafka panel of `job` (data.job_detail), or None for a job that neither
    reads nor writes Kafka. `replicas` (data.stage_placement) give the stages' primaries, so
    this costs one Redis round trip and one query (the rate into the stage reading the topic).

    Keys: source and sink (the job's fields, {} for none), lags (a ReplicaLag per stage
    reading the topic, its primary's), total (records behind, None before any entry), cause
    (why the source cannot read; "" while it reads), skipped (offsets lost to retention and
    skipped), dead (stage -> dead-lettered records), input_eps (records per second into the
    stage reading the topic, or into the job), now (epoch seconds, for the entries' age)."""
    source, sink = job.get("source") or {}, job.get("sink") or {}
    if not (kafka_status.is_kafka(source) or kafka_status.is_kafka(sink)):
        return None
    with redis_client().pipeline(transaction=False) as pipe:
        pipe.hgetall(data_keys.kafka_lag(job["key"]))
        pipe.hgetall(data_keys.stats(job["key"]))
        entries, stats = pipe.execute()
    lags = []
    if kafka_status.is_kafka(source):
        primaries = [
            kafka_status.local_id(r["replica_id"]) for r in replicas if r["role"] == "primary"
        ]
        lags = kafka_status.primary_lags(entries, primaries)
    stage = lags[0].stage if lags else queries.JOB_SCOPE
    rates = queries.latest(("input_rate_eps",), job_id=job["id"], stage=stage)
    return {
        "source": source,
        "sink": sink,
        "lags": lags,
        "total": kafka_status.total_lag(lags),
        "cause": kafka_status.source_cause(stats),
        "skipped": kafka_status.skipped_offsets(stats),
        "dead": kafka_status.dead_letters(stats),
        "input_eps": rates.get("input_rate_eps"),
        "now": time.time(),
    }


def lag_totals(rows: list[dict]) -> dict[int, int | None]:
    """Job id -> the total lag of its primaries, for the rows (data.job_page) of jobs reading
    Kafka; one query and one Redis round trip for the page, none when no row reads Kafka."""
    jobs = {row["id"]: row["key"] for row in rows if row["reads_kafka"]}
    if not jobs:
        return {}
    lags = kafka_status.read_primary_lags(redis_client(), jobs)
    return {job_id: kafka_status.total_lag(lags.get(job_id, [])) for job_id in jobs}
