"""A warm spare: a stage process started ahead of need, waiting to become a replica.

    python -m spark_runtime.spare --node NODE --machine MACHINE --spare-id ID [--redis-url URL]

A cold start of a stage costs a Python interpreter, a JVM and a SparkSession (about 10 s here)
before its query even starts. A node agent keeps a few spares per node (a policy setting): it
starts each and registers it as `starting` in `backstop:node:{node}:spares`; the spare builds its
session, warms it up (see `warm_up`, then the plans of live jobs' stages:
spark_runtime/spare_plans.py), turns `idle` and blocks on its command list. The agent
hands it a replica by deleting its entry and pushing `{"cmd": "become", "args": [...]}` (the
stage CLI arguments); the spare renames its process to that stage command line, so every process
scanner sees it as that replica, and runs the stage in its already-warm session. An agent with no
idle spare hands the replica to one still warming up rather than start a second JVM beside it;
that spare shows the replica's command line at once (`watch_for_taker`), does not turn idle
(`mark_idle`), cuts its warm-up short and runs the replica once its session is up. A spare
warms up at the normal CPU priority while a job lacks an idle spare where its next fault would
need one (a little below it while a stage is re-protected), else at the lowest
(`warming_nice`); it waits at the lowest
(spark_runtime/strategies.py says why).

Spares warm up one at a time per machine (`backstop:host:{host}:spare-warming`, taken by the
node agent that starts one, released by the spare once warm): a warm-up is a JVM, a session and a
first query, seconds of a core each, and several at once on one machine (the demo's three nodes
share it) starved the replicas of a job starting next to them for over a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import NoReturn

import redis

from spark_runtime import keys
from spark_runtime.config import (
    DEFAULT_REDIS_URL,
    build_session,
    configure_logging,
    ensure_python_env,
)
from spark_runtime.cpu_priority import can_raise_priority, set_group_nice
from spark_runtime.env import env
from spark_runtime.launch import STAGE_MODULE
from spark_runtime.redis_client import connect
from spark_runtime.spare_plans import warm_up_plans
from spark_runtime.strategies import NEEDED_SPARE_HELD_NICE, SPARE_NICE

# How long a hold on spare refills lasts unless renewed (the controller renews it every cycle
# while a job re-protects a stage).
REFILL_HOLD_S = 10


def hold_spare_refills(client) -> None:
    """No node starts a new warm spare for the next REFILL_HOLD_S: a replica is catching up
    (a new standby, a restart), and a spare's JVM start would take the CPU it needs. Spares
    that run already are kept."""
    client.set(keys.spare_refill_hold(), "1", ex=REFILL_HOLD_S)


log = logging.getLogger("spark_runtime.spare")

# A warm-up query that has not finished by then is stopped; the spare is still usable.
WARM_UP_TIMEOUT_S = 120
# How often a warming spare checks whether it has been taken.
WATCH_INTERVAL_S = 0.2


RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A spare's entry goes from `starting` to `idle` only while it is still there: a node agent takes
# a spare (warming or idle) by deleting its entry, then pushes the command.
MARK_IDLE_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""


# A spare that has not become idle within this time is replaced by its node agent (its start
# hung or failed), and the machine's warm-up lock it holds expires after it.
SPARE_START_TIMEOUT_S = 180
# While it yields (warms up below the normal level) a spare restarts that clock: its entry's
# `since` and its warm-up lock's expiry. On busy cores a refill at 19 gets a few percent of a
# core and is slow, not hung; the clock runs while it has the normal level.
YIELDING_LUA = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local entry = cjson.decode(raw)
if entry['state'] ~= 'starting' then return 0 end
entry['since'] = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(entry))
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
return 1
"""
# How often a yielding spare restarts that clock.
YIELDING_REFRESH_S = 5.0


def mark_yielding(client, machine: str, node: str, spare_id: str) -> bool:
    """Restart the start-up clock of `spare_id` (see YIELDING_LUA) and of `machine`'s warm-up
    lock, if it is still registered and warming up; False once taken or idle."""
    lock = keys.spare_warmup_lock(machine)
    timeout_ms = SPARE_START_TIMEOUT_S * 1000
    return bool(
        client.eval(YIELDING_LUA, 2, keys.spares(node), lock, spare_id, time.time(), timeout_ms)
    )


def take_warmup_lock(client, machine: str, spare_id: str, ttl_s: float) -> bool:
    """Let `spare_id` warm up on `machine` if no other spare there is (True); the lock expires
    after `ttl_s` in case the spare dies before it is warm. `machine`: the node agent's
    infra.node_metrics.machine_identity (agents in containers on one machine have host names of
    their own, and simulated nodes hosts of their own, but they share its cores)."""
    lock = keys.spare_warmup_lock(machine)
    return bool(client.set(lock, spare_id, nx=True, px=int(ttl_s * 1000)))


def release_warmup_lock(client, machine: str, spare_id: str) -> None:
    """Let the next spare on `machine` warm up, if `spare_id` holds the lock."""
    client.eval(RELEASE_LUA, 1, keys.spare_warmup_lock(machine), spare_id)


def mark_idle(client, node: str, spare_id: str) -> bool:
    """Register warm spare `spare_id` of `node` as idle; False when an agent took it while it was
    warming up (its command is in, or on its way to, its command list)."""
    entry = json.dumps({"pid": os.getpid(), "state": "idle", "since": time.time()})
    return bool(client.eval(MARK_IDLE_LUA, 1, keys.spares(node), spare_id, entry))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spark_runtime.spare", description=__doc__)
    parser.add_argument("--node", default=socket.gethostname())
    parser.add_argument(
        "--machine",
        required=True,
        help="the machine's identity as its node agent knows it (one warm-up at a time per "
        "machine: the lock it releases once warm)",
    )
    parser.add_argument("--spare-id", required=True)
    parser.add_argument("--redis-url", default=env("REDIS_URL", DEFAULT_REDIS_URL))
    return parser


def warm_up(spark, client, redis_url: str, warmup_stream: str, taken: threading.Event) -> None:
    """Do once what a stage's first batch would otherwise do: start the Python worker daemon
    (a tiny Arrow job), then run one batch of a small stateful streaming query that reads a few
    entries of `warmup_stream` through the `redis_stream` source and writes with a Python
    foreachBatch. That loads the streaming and RocksDB state-store classes and the native
    library, starts the Python data source's planning and reader workers and the Python
    callback server. Measured: a stateful stage's first batch 4.6-5.9 s after its start on 2
    busy cores with a warm-up over Spark's `rate` source, 10.5-13 s with the Arrow job alone; on
    an idle machine a seeded standby's first batch took 2.5 s after this warm-up, 3.3-4.1 s
    after the `rate` one (docs/DATA_PLANE.md, "Warm spares").

    Once `taken` is set (an agent handed the spare a replica) the warm-up stops where it is:
    the replica's own first batch does the rest of this work, for its real query. A spare taken
    while warming up on busy cores otherwise finished a warm-up that took it 36 s more before
    its replica started, and the stage's re-protection took 46 s (docs/RESULTS.md)."""
    import tempfile

    from pyspark.sql import functions as F

    from spark_runtime.redis_source import FORMAT_NAME

    if taken.is_set():
        return
    spark.range(4).mapInArrow(lambda batches: batches, "id long").collect()
    if taken.is_set():
        return
    for number in range(4):
        client.xadd(warmup_stream, {"text": f"warm up {number}"})
    try:
        with tempfile.TemporaryDirectory(prefix="backstop-spare-") as checkpoint:
            query = (
                spark.readStream.format(FORMAT_NAME)
                .option("stream", warmup_stream)
                .option("fields", "text")
                .option("redisUrl", redis_url)
                .load()
                .groupBy((F.length("text") % 4).alias("key")).count()
                .writeStream.outputMode("update")
                .foreachBatch(lambda batch, _batch_id: batch.toArrow())
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)  # what is there, then the query ends by itself
                .start()
            )  # fmt: skip
            deadline = time.monotonic() + WARM_UP_TIMEOUT_S
            while not taken.is_set() and time.monotonic() < deadline:
                if query.awaitTermination(WATCH_INTERVAL_S):
                    break
            query.stop()
    finally:
        client.delete(warmup_stream)


def take_stage_title(argv: list[str]) -> None:
    """Show this process as the stage of `argv`: process scanners (node agents, the node
    sampler, shutdown) find, kill and count replicas by their command line."""
    import setproctitle

    setproctitle.setproctitle(" ".join([sys.executable, "-m", STAGE_MODULE, *argv]))


def warming_nice(held: bool, needed: bool, can_raise: bool) -> int:
    """The nice level of a spare still warming up and not taken: the normal one while a job
    lacks a warm spare where its next fault would start a process (`needed`, set by the
    controller: console.policy.spares.spare_needed), else the lowest: such a warm-up is a
    refill that can wait, and at the normal level it took 40% of a core from a busy primary for
    the minute it lasts (spark_runtime/strategies.py). While a stage is re-protected (`held`:
    spare refills are held) a needed spare warms up at NEEDED_SPARE_HELD_NICE, below the
    replica catching up (the primary is above both): at the lowest level a spare that began
    just before a fault was still not warm a minute later, and the fault after next found no
    warm spare for its new standby (docs/RESULTS.md). A spare that could not go back to 0
    (`can_raise`, cpu_priority.can_raise_priority) stays at 0: it may be handed the replica
    catching up, which must not run below it."""
    if not can_raise:
        return 0
    if needed:
        return NEEDED_SPARE_HELD_NICE if held else 0
    return SPARE_NICE


def watch_for_taker(
    client,
    machine: str,
    node: str,
    spare_id: str,
    warm: threading.Event,
    can_raise: bool,
    taken: threading.Event,
) -> None:
    """Until the spare is `warm`: once an agent has handed it a replica, take that replica's
    command line and the normal CPU priority at once, so that a stop, a fault or a retried
    start finds the replica while its JVM is still starting, and set `taken`, which cuts the
    warm-up short (the command stays queued for the spare to run once its session is up). Not
    taken, it warms up at `warming_nice`, asked again every WATCH_INTERVAL_S (`can_raise`:
    cpu_priority.can_raise_priority, asked once by the spare).
    Without Redis it keeps its level until the next poll."""
    import redis

    control = keys.spare_control(node, spare_id)
    hold_key, needed_key = keys.spare_refill_hold(), keys.spare_needed()
    nice = 0
    clock_restarted = 0.0
    while not warm.is_set():
        try:
            queued = client.lindex(control, 0)
            held, needed = (v is not None for v in client.mget(hold_key, needed_key))
        except redis.exceptions.RedisError:
            warm.wait(WATCH_INTERVAL_S)
            continue
        if queued is not None:
            command = json.loads(queued)
            if command.get("cmd") == "become":
                take_stage_title([str(a) for a in command["args"]])
                set_group_nice(0)
            taken.set()
            return
        wanted = warming_nice(held, needed, can_raise)
        if wanted != nice:
            nice = set_group_nice(wanted)
            log.info(
                "spare %s warms up at nice %s (re-protection %s, a spare %s)",
                spare_id,
                nice,
                "under way" if held else "over",
                "needed" if needed else "not needed",
            )
        if nice > 0 and time.monotonic() - clock_restarted >= YIELDING_REFRESH_S:
            with contextlib.suppress(redis.exceptions.RedisError):
                mark_yielding(client, machine, node, spare_id)
                clock_restarted = time.monotonic()
        warm.wait(WATCH_INTERVAL_S)


# How often an idle spare looks for stage plans it has not warmed up yet: a job started after
# it turned idle, or a stage whose input was still empty then.
REWARM_EVERY_S = 10.0


def warm_while_idle(spark, client, args, done: set[str]) -> list[str]:
    """Warm up, while idle, the published plans not in `done` (spark_runtime.spare_plans); a
    command queued meanwhile (an agent took the spare) stops it at once and waits for the
    caller's next read of the command list."""
    import redis

    control = keys.spare_control(args.node, args.spare_id)
    taken, finished = threading.Event(), threading.Event()

    def watch() -> None:
        while not finished.is_set():
            with contextlib.suppress(redis.exceptions.RedisError):
                if client.llen(control):
                    taken.set()
                    return
            finished.wait(WATCH_INTERVAL_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return warm_up_plans(spark, client, args.redis_url, args.spare_id, taken, done)
    except redis.exceptions.RedisError as exc:  # the command loop waits for Redis
        log.warning("spare %s: no plan warm-up, Redis unavailable (%s)", args.spare_id, exc)
        return []
    finally:
        finished.set()
        watcher.join()


def become(argv: list[str], spark, spare_id: str) -> NoReturn:
    """Run the stage described by `argv` (stage CLI arguments) in this process and session
    (of spare `spare_id`), then end the process with the stage's exit code. An existing app's
    stage runs the app's file here too (spark_runtime/app_stage.py): its
    `SparkSession.builder.getOrCreate()` returns this session, so its restart skips the JVM and
    session start.
    The replica's command line and the normal priority come first: the stage's imports take a
    while for a spare idling at nice 19 on busy cores, and a kill must find the replica."""
    take_stage_title(argv)
    set_group_nice(0)
    from spark_runtime import stage

    args = stage.build_parser().parse_args(argv)
    log.info("spare becomes %s (%s of %s)", args.replica_id, args.role, args.stage)
    # Ends as a stage process ends (at once: stage.exit_now), so its exit follows its report.
    stage.exit_now(stage.run(args, spark=spark, spare=spare_id))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m spark_runtime.spare`."""
    configure_logging()
    ensure_python_env()
    args = build_parser().parse_args(argv)
    client = connect(args.redis_url)

    # Registered as `starting` by the agent that started it, before this process could: were it
    # registered here, an agent that took it in between would see it come back.
    warm, taken = threading.Event(), threading.Event()
    can_raise = can_raise_priority()
    watcher = threading.Thread(
        target=watch_for_taker,
        args=(client, args.machine, args.node, args.spare_id, warm, can_raise, taken),
        daemon=True,
    )
    watcher.start()
    spark = build_session(f"backstop-spare-{args.spare_id}")
    warmup_stream = keys.spare_warmup_stream(args.node, args.spare_id)
    warm_up(spark, client, args.redis_url, warmup_stream, taken)
    done: set[str] = set()  # the plans warmed or tried (spark_runtime.spare_plans)
    plans = warm_up_plans(spark, client, args.redis_url, args.spare_id, taken, done)
    warm.set()
    watcher.join()
    idle = mark_idle(client, args.node, args.spare_id)
    if idle:
        # Idle at the lowest priority only if it can come back: a spare runs restarted
        # primaries too, which must not stay at 19.
        if can_raise:
            set_group_nice(SPARE_NICE)
        log.info(
            "spare %s on %s is warm (plans: %s)",
            args.spare_id,
            args.node,
            ", ".join(plans) or "none",
        )
    else:
        how = "cut short" if taken.is_set() else "done"
        log.info(
            "spare %s on %s got a command while warming up (warm-up %s)",
            args.spare_id,
            args.node,
            how,
        )
    release_warmup_lock(client, args.machine, args.spare_id)
    rewarm_at = time.monotonic() + REWARM_EVERY_S
    while True:
        if idle and time.monotonic() >= rewarm_at:
            warm_while_idle(spark, client, args, done)
            rewarm_at = time.monotonic() + REWARM_EVERY_S
        try:
            # A short block: redis-py's default socket timeout (5 s) must not fire first.
            popped = client.blpop([keys.spare_control(args.node, args.spare_id)], timeout=1)
        except redis.exceptions.RedisError as exc:
            log.warning("spare %s: Redis unavailable (%s); waiting", args.spare_id, exc)
            time.sleep(1)
            continue
        if popped is None:
            continue
        command = json.loads(popped[1])
        if command.get("cmd") == "stop":
            client.hdel(keys.spares(args.node), args.spare_id)
            return 0
        if command.get("cmd") == "become":
            # The agent already took this spare out of the idle set.
            return become([str(a) for a in command["args"]], spark, args.spare_id)
        log.warning("ignored unknown command %s", command)


if __name__ == "__main__":
    sys.exit(main())
