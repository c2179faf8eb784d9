"""The stage plans a warm spare runs once before it waits: the queries it will most likely serve.

A spare's own warm-up (spark_runtime.spare.warm_up) loads Spark's streaming and state-store
classes and starts the Python workers, but the first batch of a stage's real query still paid
for everything specific to its plan: whole-stage code generation and its compilation, the
state store of that aggregation, the Python functions of its operators. Measured with
`python -m bench.dataplane.first_batch` (docs/RESULTS.md, "A spare's first batch
(wordcount)"): a seeded wordcount standby's first batch in a warm spare ended 2.4-2.5 s after
its query started, and 0.9-1.0 s after a warm-up that had run the same stage's plan once. That first
batch is most of a stage's re-protect time after a promotion.

So every policy cycle the controller publishes, per live job whose strategy keeps warm spares,
the plans of its stages (`publish_plans`: topology, stage, operators, params; stages with a
standby first), and a spare warming up, then every few seconds while idle
(spark_runtime.spare.warm_while_idle), runs up to MAX_WARM_PLANS distinct ones (`plans_to_warm`)
under a job key of its own, on a few entries copied from the real stage's input (or generated
for a job's input that has none yet), until each query has processed a batch (`warm_up_plans`).
Spark caches generated classes by their source, which names no job, so the real query reuses
them. Nothing of the real job is read beyond those entries or written: the warm-up's keys and
checkpoint are deleted after it. A stage reading a job's Kafka input warms up on the topic's
newest records through the Kafka source (a plan log of the warm-up's own), which warms the
source's reader too; it writes no Kafka sink.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping

from spark_runtime import external_io, keys
from spark_runtime.kafka_admin import recent_start
from spark_runtime.kafka_plan import Plan
from spark_runtime.topology import INPUT_CHANNEL

log = logging.getLogger("spark_runtime.spare_plans")

# A job's plans older than this are ignored (its controller renews them every policy cycle, so
# only a stopped or lost job's plans get this old).
PLAN_TTL_S = 120.0
# At most this many distinct plans per spare: each costs a query start and a batch of CPU
# (about 2 s of a core on 2 cores) and keeps its generated classes in the JVM.
MAX_WARM_PLANS = 3
# Entries a plan's warm-up reads: enough to reach every operator of a stage.
WARM_INPUT_ENTRIES = 20
# A plan whose queries have not all processed a batch by then is stopped where it is.
PLAN_TIMEOUT_S = 60.0
POLL_S = 0.2


def stage_plans(
    topology: str,
    stage_operators: Mapping[str, Iterable[str]],
    params: Iterable[str] = (),
    active_stages: Iterable[str] = (),
) -> list[dict]:
    """The plans of a job's stages, those with a hot standby (`active_stages`) first: a spare
    becomes a new standby after every promotion, a restarted primary less often."""
    active = set(active_stages)
    ordered = sorted(stage_operators, key=lambda stage: stage not in active)
    return [
        {
            "topology": topology,
            "stage": stage,
            "operators": list(stage_operators[stage]),
            "params": list(params),
        }
        for stage in ordered
    ]


def publish_plans(client, job: str, plans: list[dict], now: float | None = None) -> None:
    """Record `job`'s stage plans for the spares (idempotent: one hash field per job)."""
    entry = {"plans": plans, "at": time.time() if now is None else now}
    client.hset(keys.spare_plans(), job, json.dumps(entry))


def withdraw_plans(client, job: str) -> None:
    """Forget `job`'s plans (the job stopped)."""
    client.hdel(keys.spare_plans(), job)


def plan_signature(plan: Mapping) -> str:
    """What makes two plans the same to a spare: all but the job that published it."""
    return json.dumps({k: v for k, v in plan.items() if k != "job"}, sort_keys=True)


def stale_jobs(raw: Mapping, now: float) -> list:
    """The fields of the published hash that are not a fresh entry: jobs that stopped without
    withdrawing their plans (a controller lost mid-stop, a job given up on), or not ours."""
    stale = []
    for job, value in raw.items():
        try:
            fresh = now - float(json.loads(value)["at"]) <= PLAN_TTL_S
        except (ValueError, KeyError, TypeError):
            fresh = False
        if not fresh:
            stale.append(job)
    return stale


def plans_to_warm(raw: Mapping, now: float, limit: int = MAX_WARM_PLANS) -> list[dict]:
    """From the published hash (job -> JSON entry), the plans a spare should warm, with the job
    each was published by: fresh entries only, newest job first, one plan per distinct
    (topology, stage, operators, params), at most `limit`."""
    entries = []
    for job, value in raw.items():
        try:
            entry = json.loads(value)
            at, plans = float(entry["at"]), list(entry["plans"])
        except (ValueError, KeyError, TypeError):
            continue  # not one of ours: skip it rather than fail a spare's warm-up
        if now - at <= PLAN_TTL_S:
            name = job.decode() if isinstance(job, bytes) else str(job)
            entries.append((at, name, plans))
    chosen, seen = [], set()
    for _, job, plans in sorted(entries, key=lambda e: (-e[0], e[1])):
        for plan in plans:
            signature = plan_signature(plan)
            if signature not in seen and len(chosen) < limit:
                seen.add(signature)
                chosen.append({**plan, "job": job})
    return chosen


def copy_recent_input(client, source_keys: Iterable[str], target_keys: Iterable[str]) -> int:
    """Copy the newest WARM_INPUT_ENTRIES entries of each source stream to its target stream
    (new ids, same fields, oldest first); returns how many were copied."""
    copied = 0
    for source, target in zip(source_keys, target_keys, strict=True):
        entries = client.xrevrange(source, count=WARM_INPUT_ENTRIES)
        for _, fields in reversed(entries):
            client.xadd(target, fields)
            copied += 1
    return copied


def kafka_recent_input(client, job: str, warm_job: str, stage) -> bool:
    """For a stage reading a job's Kafka input: make the warm-up job read that topic (no sink)
    from WARM_INPUT_ENTRIES records before each partition's end, through the Kafka source, so
    its reader is warmed too; False when the job has no Kafka input, the stage does not read
    it, or the topic holds nothing yet."""
    source = external_io.load(client, job).source
    if source is None or INPUT_CHANNEL not in stage.inputs:
        return False
    start = recent_start(source, WARM_INPUT_ENTRIES)
    if start is None:
        return False
    external_io.save(client, warm_job, external_io.ExternalIO(source=source))
    # The warm-up job's own plan log, its starting point given: its positions are its own.
    client.rpush(keys.kafka_plans(warm_job), Plan(0, int(time.time() * 1000), start).to_json())
    return True


def warm_up_plan(spark, client, redis_url: str, plan: dict, warm_job: str, taken) -> int:
    """Run `plan`'s stage under job key `warm_job` until each of its queries has processed a
    batch (or PLAN_TIMEOUT_S, or `taken` is set); returns the input rows processed. Its keys and
    checkpoint are deleted afterwards."""
    from spark_runtime import generators
    from spark_runtime.jobdef import resolve_topology
    from spark_runtime.runtime import PRIMARY, StageRuntime
    from spark_runtime.stage import parse_params
    from spark_runtime.topology import stage_spec, with_params

    topology = with_params(resolve_topology(plan["topology"]), parse_params(plan["params"]))
    real = stage_spec(topology, plan["stage"], plan["operators"], job=plan["job"])
    stage = stage_spec(topology, plan["stage"], plan["operators"], job=warm_job)
    checkpoint = tempfile.mkdtemp(prefix="backstop-spare-plan-")
    runtime = None
    try:
        # The job's newest records: from its Kafka topic, else copied from its Redis streams.
        if not kafka_recent_input(client, plan["job"], warm_job, stage) and not copy_recent_input(
            client, real.input_keys, stage.input_keys
        ):
            if stage.inputs != (INPUT_CHANNEL,):
                return 0  # an internal stream nothing has written to yet: no batch would run
            # The job has just started: generate a few entries of its kind of input.
            generators.generate(
                client, warm_job, plan["topology"], count=WARM_INPUT_ENTRIES, rate=10_000
            )
        runtime = StageRuntime(
            spark, client, warm_job, topology, stage, PRIMARY, redis_url, checkpoint,
            trigger_seconds=topology.trigger_s,
        )  # fmt: skip
        runtime.start()
        deadline = time.monotonic() + PLAN_TIMEOUT_S
        rows: dict[int, int] = {}
        while not taken.is_set() and time.monotonic() < deadline:
            for index, query in enumerate(runtime.queries):
                progress = query.lastProgress
                if progress is not None and progress["numInputRows"] > 0:
                    rows.setdefault(index, progress["numInputRows"])
            if len(rows) == len(runtime.queries):
                break
            ended = [q for q in runtime.queries if not q.isActive]
            if ended:  # failed: waiting on would only reach the timeout
                log.warning("warm-up %s: query %s ended: %s", warm_job, ended[0].name,
                            ended[0].exception())  # fmt: skip
                break
            time.sleep(POLL_S)
        return sum(rows.values())
    finally:
        if runtime is not None:
            runtime.stop()
        keys.delete_job_keys(client, warm_job)
        shutil.rmtree(checkpoint, ignore_errors=True)


def warm_up_plans(
    spark, client, redis_url: str, spare_id: str, taken, done: set[str] | None = None
) -> list[str]:
    """Warm up the plans `plans_to_warm` picks, one after the other, until `taken` is set;
    returns "topology/stage" of each plan warmed. `done`: signatures (`plan_signature`) of the
    plans this spare has warmed or tried, skipped and added to; a plan that ran no batch (its
    input still empty, or cut short) is tried again by a later call. A plan that fails is
    logged and not tried again: the spare stays usable, its replica's first batch just costs
    more."""
    done = set() if done is None else done
    warmed, now = [], time.time()
    raw = client.hgetall(keys.spare_plans())
    stale = stale_jobs(raw, now)
    if stale:  # nobody else removes them; a job publishing again is back next cycle
        client.hdel(keys.spare_plans(), *stale)
    plans = plans_to_warm(raw, now)
    for number, plan in enumerate(plans):
        if taken.is_set():
            break
        signature = plan_signature(plan)
        if signature in done:
            continue
        name = f"{plan['topology']}/{plan['stage']}"
        started = time.monotonic()
        try:
            rows = warm_up_plan(
                spark, client, redis_url, plan, f"spare-warmup-{spare_id}-{number}", taken
            )
        except Exception:  # noqa: BLE001 - any failure only loses the warm-up's benefit
            log.exception("spare %s: warm-up of plan %s failed", spare_id, name)
            done.add(signature)
            continue
        if rows:
            log.info(
                "spare %s warmed plan %s (%d rows) in %.1f s",
                spare_id, name, rows, time.monotonic() - started,
            )  # fmt: skip
            done.add(signature)
            warmed.append(name)
    return warmed
