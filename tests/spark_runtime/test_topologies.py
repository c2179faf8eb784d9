"""Every topology end to end on one in-process SparkSession: results equal the ground truth
computed in plain Python from the input stream, replays do not double count, malformed entries
end in the dead-letter stream, and a standby's promotion neither loses nor repeats output."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import threading
import time

import pytest

from spark_runtime import generators, keys
from spark_runtime.runtime import PRIMARY, STANDBY, StageRuntime
from spark_runtime.topology import (
    CHAINED,
    FUSED,
    PER_OPERATOR,
    compile_stages,
    get_topology,
    with_params,
)
from tests.spark_runtime import truth
from tests.spark_runtime.checkpoints import forget_last_commits

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    from spark_runtime.config import build_session

    session = build_session("backstop-tests")
    yield session
    session.stop()


def run_stages(
    spark, client, redis_url, job, topology, tmp_path, chaining=PER_OPERATOR, role=PRIMARY
):
    runtimes = []
    for stage in compile_stages(topology, chaining, job=job):
        rt = StageRuntime(
            spark,
            client,
            job,
            topology,
            stage,
            role,
            redis_url,
            str(tmp_path / f"{stage.name}-{role}"),
            max_records=700,
        )
        rt.start()
        runtimes.append(rt)
    return runtimes


def replica_state(redis_conn, job: str, replica_id: str, role: str, node: str):
    """What a replica of stage `job` reports about itself (spark_runtime.stage.ReplicaState),
    for driving control commands against a StageRuntime in this process."""
    from spark_runtime.stage import ReplicaState

    args = argparse.Namespace(job=job, replica_id=replica_id, stage="job", role=role, node=node)
    return ReplicaState(redis_conn, args)


def drain(runtimes, rounds=2):
    for _ in range(rounds):
        for rt in runtimes:
            rt.process_all_available()


def stop(runtimes):
    for rt in runtimes:
        rt.stop()


def test_wordcount_stages_match_ground_truth_and_dead_letter_malformed(
    spark, redis_conn, redis_url, job, tmp_path
):
    topology = get_topology("wordcount")
    generators.generate(
        redis_conn, job, "wordcount", count=1500, rate=1e6, seed=1, malformed_every=50
    )
    runtimes = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path)
    try:
        drain(runtimes)
    finally:
        stop(runtimes)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    expected = truth.wordcount(entries)
    assert {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()} == expected
    # The intermediate stream holds every word exactly once, with deterministic ids.
    ids = [f["id"] for _, f in redis_conn.xrange(keys.channel_stream(job, "split"))]
    assert len(ids) == len(set(ids)) == sum(expected.values())
    malformed = truth.malformed_count(redis_conn, keys.input_stream(job), ["text"])
    assert malformed == 30
    assert redis_conn.xlen(keys.dead_letters(job)) == malformed
    assert redis_conn.hget(keys.stats(job), "dead:split") == str(malformed)


def test_a_reexecuted_batch_does_not_double_count(spark, redis_conn, redis_url, job, tmp_path):
    topology = get_topology("wordcount")
    generators.generate(redis_conn, job, "wordcount", count=1200, rate=1e6, seed=2)
    runtimes = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=FUSED)
    drain(runtimes)
    stop(runtimes)
    # Forget that the last batches were committed: Spark runs them again on restart, as after a
    # crash between writing the outputs and committing the batch.
    forget_last_commits(tmp_path / "job-primary" / "0")
    generators.generate(redis_conn, job, "wordcount", count=300, rate=1e6, seed=3, id_prefix="f")
    runtimes = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=FUSED)
    try:
        drain(runtimes)
    finally:
        stop(runtimes)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    got = {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()}
    assert got == truth.wordcount(entries)


def test_a_stage_killed_while_writing_its_first_offsets_starts_again(
    spark, redis_conn, redis_url, job, tmp_path
):
    # What a SIGKILL during the first offsets write leaves: the query's metadata and the temp
    # file of offsets entry 0, never renamed (seen in the failover test: Spark then refused to
    # start batch 0 at every restart, "offsets should be empty on batch 0").
    query_dir = tmp_path / "job-primary" / "0"
    (query_dir / "offsets").mkdir(parents=True)
    (query_dir / "commits").mkdir()
    (query_dir / "metadata").write_text('{"id":"16acf075-9641-43b5-8dae-0b6288e7f850"}')
    (query_dir / "offsets" / ".0.16fa0bab-dbc0-4fd2-916d-9e65ce05f2e7.tmp").write_text("")
    (query_dir / "offsets" / "..0.16fa0bab-dbc0-4fd2-916d-9e65ce05f2e7.tmp.crc").write_text("")
    topology = get_topology("wordcount")
    generators.generate(redis_conn, job, "wordcount", count=300, rate=1e6, seed=4)
    runtimes = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=FUSED)
    try:
        drain(runtimes)
        assert all(rt.failure() is None for rt in runtimes)
    finally:
        stop(runtimes)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    got = {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()}
    assert got == truth.wordcount(entries)


def test_a_running_stage_takes_a_new_checkpoint_interval_by_restarting_its_queries(
    spark, redis_conn, redis_url, job, tmp_path
):
    from spark_runtime.stage import handle_command

    snapshots = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
    maintenance = "spark.sql.streaming.stateStore.maintenanceInterval"
    saved = {key: spark.conf.get(key, None) for key in (snapshots, maintenance)}
    confs = {snapshots: "7", maintenance: "7s"}
    command = {"cmd": "checkpoint_interval", "seconds": 3.5, "confs": confs}
    topology = get_topology("wordcount")
    generators.generate(redis_conn, job, "wordcount", count=600, rate=1e6, seed=5)
    (rt,) = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=FUSED)
    state = replica_state(redis_conn, job, "wc-1", "primary", "n1")

    def run_ids():
        return [str(q.runId) for q in rt.queries]

    try:
        drain([rt])
        before = run_ids()
        assert handle_command(command, rt, state) is None
        assert run_ids() != before  # restarted from the checkpoints with the new settings
        assert spark.conf.get(snapshots) == "7"
        reported = json.loads(redis_conn.hget(keys.replicas(job), "wc-1"))
        assert (reported["checkpoint_interval_s"], reported["confs"]) == (3.5, confs)
        # The same settings again restart nothing; anything but state-store settings is refused.
        before = run_ids()
        handle_command(command, rt, state)
        refused = {
            "cmd": "checkpoint_interval",
            "seconds": 1,
            "confs": {"spark.driver.memory": "9g"},
        }
        handle_command(refused, rt, state)
        assert run_ids() == before
        assert spark.conf.get("spark.driver.memory", None) != "9g"
        assert state.info["checkpoint_interval_s"] == 3.5
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=6, id_prefix="g"
        )
        drain([rt])
    finally:
        stop([rt])
        for key, value in saved.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    got = {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()}
    assert got == truth.wordcount(entries)


def test_a_slowed_stage_waits_before_each_batch_of_the_window_and_stays_exact(
    spark, redis_conn, redis_url, job, tmp_path, monkeypatch
):
    """The slow-driver fault's command: each batch handled within its window first waits the
    delay (recorded on the real sleep), none after it; a malformed command changes nothing;
    the counts stay exact."""
    import spark_runtime.runtime as runtime_module
    from spark_runtime.stage import handle_command

    slept = []
    real_sleep = time.sleep

    def recorded_sleep(seconds):
        slept.append(seconds)
        real_sleep(seconds)

    topology = get_topology("wordcount")
    generators.generate(redis_conn, job, "wordcount", count=300, rate=1e6, seed=8)
    (rt,) = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=FUSED)
    state = replica_state(redis_conn, job, "wc-1", "primary", "n1")
    slow = {"cmd": "fault", "kind": "slow_batches"}
    try:
        drain([rt])
        for bad in ({"delay_s": "x", "duration_s": 5}, {"delay_s": -1, "duration_s": 5},
                    {"delay_s": float("nan"), "duration_s": 5}, {"delay_s": 1}):  # fmt: skip
            assert handle_command({**slow, **bad}, rt, state) is None
        assert rt.gate.slow_until == 0.0
        monkeypatch.setattr(runtime_module.time, "sleep", recorded_sleep)
        handle_command({**slow, "delay_s": 0.7, "duration_s": 120}, rt, state)
        reported = json.loads(redis_conn.hget(keys.replicas(job), "wc-1"))
        assert reported["batch_delay_s"] == 0.7
        assert reported["slowed_until"] == pytest.approx(time.time() + 120, abs=10)
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=9, id_prefix="s"
        )
        drain([rt], rounds=1)
        assert 0.7 in slept
        slept.clear()
        handle_command({**slow, "delay_s": 0.7, "duration_s": 0.001}, rt, state)
        real_sleep(0.01)  # the window is over
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=10, id_prefix="t"
        )
        drain([rt], rounds=1)
        assert 0.7 not in slept
    finally:
        monkeypatch.undo()
        stop([rt])
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    got = {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()}
    assert got == truth.wordcount(entries)


def test_standby_promotion_emits_exactly_what_the_primary_had_not(
    spark, redis_conn, redis_url, job, tmp_path
):
    topology = get_topology("wordcount")
    (stage,) = compile_stages(topology, FUSED, job=job)
    generators.generate(redis_conn, job, "wordcount", count=1400, rate=1e6, seed=4)

    def runtime(role, max_records):
        rt = StageRuntime(
            spark,
            redis_conn,
            job,
            topology,
            stage,
            role,
            redis_url,
            str(tmp_path / role),
            max_records=max_records,
        )
        rt.start()
        return rt

    # Different batch sizes: the two replicas cut the input into different batches.
    primary = runtime(PRIMARY, 300)
    standby = runtime(STANDBY, 450)
    try:
        primary.queries[0].processAllAvailable()
        primary.stop()  # the primary dies having written everything so far
        generators.generate(
            redis_conn, job, "wordcount", count=900, rate=1e6, seed=5, id_prefix="g"
        )
        standby.process_all_available()
        assert redis_conn.hlen(keys.results(job)) > 0
        assert len(standby.gate.buffer) > 0
        summary = standby.gate.promote()
        assert summary["epoch"] == 2
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=6, id_prefix="h"
        )
        standby.process_all_available()
    finally:
        standby.stop()
        primary.stop()
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    got = {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()}
    assert got == truth.wordcount(entries)


def test_a_promotion_lifts_the_standbys_batch_pace_before_it_fences(
    spark, redis_conn, redis_url, job, tmp_path
):
    """A caught-up standby reads new input every few seconds (keys.batch_pace); the promote
    command lifts that pace before the gate fences the old primary, so no trigger of the new
    primary waits for it, and the counts stay exact."""
    from spark_runtime.stage import handle_command

    topology = get_topology("wordcount")
    (stage,) = compile_stages(topology, FUSED, job=job)
    pace = keys.batch_pace(job, "wc-2")
    generators.generate(redis_conn, job, "wordcount", count=600, rate=1e6, seed=7)
    standby = StageRuntime(
        spark, redis_conn, job, topology, stage, STANDBY, redis_url, str(tmp_path / "standby"),
        pace_key=pace,
    )  # fmt: skip
    state = replica_state(redis_conn, job, "wc-2", "standby", "n1")
    state.update(batch_every_s=3.0)
    assert redis_conn.get(pace) == "3.0"
    paced_at_promotion = []
    promote = standby.gate.promote

    def promote_and_note_the_pace():
        paced_at_promotion.append(redis_conn.exists(pace))
        return promote()

    standby.gate.promote = promote_and_note_the_pace
    standby.start()
    try:
        standby.process_all_available()
        assert len(standby.gate.buffer) > 0
        assert handle_command({"cmd": "promote"}, standby, state) is None
        assert paced_at_promotion == [0]
        assert (state.info["role"], state.info["batch_every_s"]) == ("primary", None)
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=8, id_prefix="g"
        )
        standby.process_all_available()
    finally:
        standby.stop()
    assert not redis_conn.exists(pace)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    got = {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()}
    assert got == truth.wordcount(entries)


def test_a_demoted_primary_passes_the_promotion_on_to_its_successor(
    spark, redis_conn, redis_url, job, tmp_path
):
    """An upgrade's hand-over (spark_runtime.upgrade.DemoteReplica): the old version demotes
    itself right after its next batch is written (that batch's progress says it was written as
    the primary) and puts the promote command on its successor's control list itself; the
    successor takes it from there, flushes what the old one had not written, and the counts
    stay exact."""
    import json

    from spark_runtime.stage import handle_command

    topology = get_topology("wordcount")
    (stage,) = compile_stages(topology, FUSED, job=job)
    generators.generate(redis_conn, job, "wordcount", count=600, rate=1e6, seed=9)
    blue = StageRuntime(spark, redis_conn, job, topology, stage, PRIMARY, redis_url,
                        str(tmp_path / "blue"))  # fmt: skip
    green = StageRuntime(spark, redis_conn, job, topology, stage, STANDBY, redis_url,
                         str(tmp_path / "green"))  # fmt: skip
    blue_state = replica_state(redis_conn, job, "wc-1", "primary", "n1")
    green_state = replica_state(redis_conn, job, "wc-2", "standby", "n2")
    blue.start()
    green.start()
    try:
        blue.process_all_available()
        demote = {"cmd": "demote", "successor": "wc-2"}
        assert handle_command(demote, blue, blue_state) is None
        assert blue.gate.role == "primary" and not redis_conn.exists(keys.control(job, "wc-2"))
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=10, id_prefix="g"
        )
        before = len(blue.gate.batch_stats)
        blue.process_all_available()  # its next batch is written, then it demotes itself
        assert blue_state.info["role"] == "standby"
        first = list(blue.gate.batch_stats.values())[before]
        assert first["role"] == "primary" and first["written"] > 0, first
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=12, id_prefix="i"
        )
        green.process_all_available()  # ahead of blue: output blue has not written
        assert len(green.gate.buffer) > 0
        _, passed_on = redis_conn.blpop([keys.control(job, "wc-2")], timeout=1)
        assert json.loads(passed_on) == {"cmd": "promote", "from": "wc-1"}
        assert handle_command(json.loads(passed_on), green, green_state) is None
        assert green_state.info["role"] == "primary"
        generators.generate(
            redis_conn, job, "wordcount", count=300, rate=1e6, seed=11, id_prefix="h"
        )
        blue.process_all_available()  # a standby now: it writes nothing
        green.process_all_available()
    finally:
        green.stop()
        blue.stop()
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    got = {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()}
    assert got == truth.wordcount(entries)


@contextlib.contextmanager
def query_starts(spark, then=None):
    """The ids of the streaming queries started on `spark` within the block, in a list that
    grows as they start; `then()` runs after each start is recorded."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Starts(StreamingQueryListener):
        def onQueryStarted(self, event):
            started.append(event.id)
            if then is not None:
                then()

        def onQueryProgress(self, event):
            pass

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    started, listener = [], Starts()
    spark.streams.addListener(listener)
    try:
        yield started
    finally:
        spark.streams.removeListener(listener)


def test_a_spare_taken_during_its_warm_up_stops_it_there(spark, redis_conn, redis_url, job):
    """A warm spare's warm-up (spark_runtime.spare.warm_up) ends as soon as an agent has taken
    the spare (`taken`): taken before, nothing runs; taken once the warm-up query has started,
    the query is stopped and the call returns, its input deleted, no query left running."""
    from spark_runtime.spare import warm_up

    stream = keys.spare_warmup_stream("node-t", job)
    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup())
    taken = threading.Event()
    taken.set()
    warm_up(spark, redis_conn, redis_url, stream, taken)
    assert not redis_conn.exists(stream) and not spark.streams.active
    assert set(tracker.getJobIdsForGroup()) == jobs_before  # no Spark job ran

    # onQueryStarted runs before DataStreamWriter.start() returns, so the spare is taken
    # before the warm-up's wait for its query begins.
    taken_now = threading.Event()
    with query_starts(spark, then=taken_now.set) as started:
        warm_up(spark, redis_conn, redis_url, stream, taken_now)
    assert len(started) == 1 and taken_now.is_set()
    assert not redis_conn.exists(stream) and not spark.streams.active


def test_a_chained_stage_of_two_queries_fails_over_to_its_standby_exactly(
    spark, redis_conn, redis_url, job, tmp_path
):
    """Chained traffic: join and location_aggregate in one stage (two queries linked by the
    stage's internal stream: no plan runs the two as one). The standby's first query buffers
    what it would write to that stream, its second query reads what the primary wrote; after
    the promotion it writes both itself."""
    topology = get_topology("traffic")
    (stage,) = compile_stages(topology, CHAINED, active={"join", "location_aggregate"}, job=job)
    assert stage.operators == ("join", "location_aggregate") and len(stage.segments) == 2
    generators.generate(redis_conn, job, "traffic", count=1200, rate=800, seed=11)

    def runtime(role, max_records):
        rt = StageRuntime(
            spark, redis_conn, job, topology, stage, role, redis_url, str(tmp_path / role),
            max_records=max_records,
        )  # fmt: skip
        rt.start()
        return rt

    primary = runtime(PRIMARY, 400)
    standby = None
    try:
        primary.process_all_available()
        standby = runtime(STANDBY, 650)
        standby.process_all_available()
        primary.stop()  # the primary dies having written everything so far
        generators.generate(
            redis_conn, job, "traffic", count=1200, rate=800, seed=12, id_prefix="g"
        )
        standby.process_all_available()
        assert len(standby.gate.buffer) > 0
        standby.gate.promote()
        standby.process_all_available()
        generators.generate(redis_conn, job, "traffic", count=400, rate=800, seed=13, id_prefix="h")
        standby.process_all_available()
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()
    entries = truth.valid_entries(
        redis_conn, keys.input_stream(job), ["kind", "sensor", "lane", "value"]
    )
    expected = truth.traffic(entries)
    got = {k: json.loads(v) for k, v in redis_conn.hgetall(keys.results(job)).items()}
    assert len(expected) >= 4
    assert got == expected


@pytest.mark.parametrize("chaining", [FUSED, PER_OPERATOR, CHAINED])
def test_topn_matches_ground_truth(spark, redis_conn, redis_url, job, tmp_path, chaining):
    topology = with_params(get_topology("topn"), {"window_count": {"window_seconds": 1}})
    generators.generate(redis_conn, job, "topn", count=3000, rate=1500, seed=7, malformed_every=97)
    runtimes = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=chaining)
    # One query runs both operators where they share a stage (pipelines.FUSED_PLANS).
    assert [len(rt.queries) for rt in runtimes] == ([1, 1] if chaining == PER_OPERATOR else [1])
    try:
        drain(runtimes, rounds=3)
    finally:
        stop(runtimes)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["item"])
    expected = truth.topn(entries, window_seconds=1, n=5)
    got = {w: json.loads(v) for w, v in redis_conn.hgetall(keys.results(job)).items()}
    assert len(expected) >= 2
    assert got == expected
    assert redis_conn.xlen(keys.dead_letters(job)) == truth.malformed_count(
        redis_conn, keys.input_stream(job), ["item"]
    )


def test_traffic_matches_ground_truth(spark, redis_conn, redis_url, job, tmp_path):
    topology = get_topology("traffic")
    generators.generate(redis_conn, job, "traffic", count=2400, rate=800, seed=8)
    runtimes = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=FUSED)
    try:
        drain(runtimes, rounds=3)
    finally:
        stop(runtimes)
    entries = truth.valid_entries(
        redis_conn, keys.input_stream(job), ["kind", "sensor", "lane", "value"]
    )
    expected = truth.traffic(entries)
    got = {k: json.loads(v) for k, v in redis_conn.hgetall(keys.results(job)).items()}
    assert len(expected) >= 100
    assert got == expected


def test_shuffle_matches_ground_truth(spark, redis_conn, redis_url, job, tmp_path):
    topology = with_params(
        get_topology("shuffle"),
        {"assign_keys": {"keys": 20}, "aggregate": {"selectivity": 0.05}},
    )
    generators.generate(redis_conn, job, "shuffle", count=2000, rate=1e6, seed=9)
    runtimes = run_stages(spark, redis_conn, redis_url, job, topology, tmp_path, chaining=FUSED)
    try:
        drain(runtimes)
    finally:
        stop(runtimes)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["value"])
    state, outputs = truth.shuffle(entries, keys=20, selectivity=0.05)
    got = {k: json.loads(v) for k, v in redis_conn.hgetall(keys.results(job)).items()}
    assert got == state
    emitted = redis_conn.xrange(keys.output_stream(job))
    assert len({f["id"] for _, f in emitted}) == len(emitted)
    assert sorted((f["key"], int(f["count"]), int(f["sum"])) for _, f in emitted) == outputs
    assert len(outputs) >= 50


def state_rows(runtimes) -> list[int]:
    """Rows in the state stores of each query of `runtimes` after its last batch, in order."""
    return [
        sum(op.numRowsTotal for op in (query.lastProgress.stateOperators or []))
        for rt in runtimes
        for query in rt.queries
    ]


def feed_in_chunks(spark, client, redis_url, job, topology, tmp_path, chunks) -> list[int]:
    """Run `topology`'s stages (chained), writing each chunk of input fields and draining it
    before the next; returns the state rows of each query at the end."""
    runtimes = run_stages(spark, client, redis_url, job, topology, tmp_path / job, CHAINED)
    try:
        for chunk in chunks:
            for fields in chunk:
                client.xadd(keys.input_stream(job), fields)
            drain(runtimes)
        return state_rows(runtimes)
    finally:
        stop(runtimes)


@pytest.mark.slow
def test_watermarks_bound_the_state_of_topn_and_traffic(
    spark, redis_conn, redis_url, job, tmp_path
):
    """Input spanning 40 s of event time in 8 chunks of 5 s, with 2-second watermarks: results
    stay exact, and the state keeps only what the watermark has not passed (about 5 + 2 s of
    windows or seconds), not all 40 s of them as it did without a watermark."""
    t0 = 1_700_000_000_000
    items = ["a", "b", "c", "d", "e"]

    def topn_entry(i):
        return {"id": f"t{i}", "ts": t0 + i * 50, "item": items[(i * 7 + i // 3) % 5]}

    topn = with_params(
        get_topology("topn"),
        {"window_count": {"window_seconds": 1, "watermark_seconds": 2},
         "topn": {"n": 3, "watermark_seconds": 2}},
    )  # fmt: skip
    chunks = [[topn_entry(i) for i in range(c * 100, (c + 1) * 100)] for c in range(8)]
    (window_rows,) = feed_in_chunks(spark, redis_conn, redis_url, job, topn, tmp_path, chunks)
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["item"])
    expected = truth.topn(entries, window_seconds=1, n=3)
    got = {w: json.loads(v) for w, v in redis_conn.hgetall(keys.results(job)).items()}
    assert len(expected) == 40 and got == expected
    # One query for both operators, one state row per window: all 40 windows without a watermark.
    assert 0 < window_rows <= 9

    def traffic_entries(second):
        rng = random.Random(second)
        entries = []
        for sensor, lane, kind in itertools.product(("s1", "s2"), (1, 2), ("speed", "flow")):
            ts = t0 + second * 1000 + rng.randrange(1000)
            value = round(rng.uniform(1, 99), 2)
            fields = {"kind": kind, "sensor": sensor, "lane": lane, "value": value}
            entries.append({"id": f"s{second}-{sensor}-{lane}-{kind}", "ts": ts, **fields})
        return sorted(entries, key=lambda e: e["ts"])

    traffic_job = f"{job}-traffic"
    traffic = with_params(
        get_topology("traffic"),
        {"join": {"watermark_seconds": 2}, "location_aggregate": {"watermark_seconds": 2}},
    )
    chunks = [[e for s in range(c * 5, (c + 1) * 5) for e in traffic_entries(s)] for c in range(8)]
    try:
        join_rows, location_rows = feed_in_chunks(
            spark, redis_conn, redis_url, traffic_job, traffic, tmp_path, chunks
        )
        entries = truth.valid_entries(
            redis_conn, keys.input_stream(traffic_job), ["kind", "sensor", "lane", "value"]
        )
        got = {k: json.loads(v) for k, v in redis_conn.hgetall(keys.results(traffic_job)).items()}
    finally:
        keys.delete_job_keys(redis_conn, traffic_job)
    expected = truth.traffic(entries)
    assert len(expected) == 80 and got == expected
    assert 0 < join_rows <= 9 * 4  # 4 sensor lanes a second; all 40 s: 160 rows
    assert 0 < location_rows <= 9 * 2  # 2 sensors a second; all 40 s: 80 rows


def batches_without_input(runtime) -> int:
    """Batches that read no new offsets (Spark's no-data batches) among the recent progress of
    `runtime`'s queries. (A query's first batch may read no rows, but it moves its offsets.)"""
    return sum(
        1
        for query in runtime.queries
        for progress in query.recentProgress
        if all(source.startOffset == source.endOffset for source in progress.sources)
    )


def test_a_standby_skips_batches_without_input_and_stays_exact(
    spark, redis_conn, redis_url, job, tmp_path
):
    """Chained topn with 2-second watermarks, input in chunks of 5 s of event time: after each
    chunk the primary runs batches without input to drop expired state, the standby runs none
    (its next batch with input drops it), its state stays bounded all the same, and once
    promoted it emits results equal to the ground truth."""
    t0 = 1_700_000_000_000
    items = ["a", "b", "c", "d", "e"]
    topology = with_params(
        get_topology("topn"),
        {"window_count": {"window_seconds": 1, "watermark_seconds": 2},
         "topn": {"n": 3, "watermark_seconds": 2}},
    )  # fmt: skip
    (stage,) = compile_stages(topology, CHAINED, active={"window_count", "topn"}, job=job)

    def runtime(role):
        rt = StageRuntime(
            spark, redis_conn, job, topology, stage, role, redis_url, str(tmp_path / role),
            trigger_seconds=0.2,
        )  # fmt: skip
        rt.start()
        return rt

    def feed(chunk):
        for i in range(chunk * 100, (chunk + 1) * 100):
            fields = {"id": f"t{i}", "ts": t0 + i * 50, "item": items[(i * 7 + i // 3) % 5]}
            redis_conn.xadd(keys.input_stream(job), fields)

    primary, standby = runtime(PRIMARY), runtime(STANDBY)
    try:
        for chunk in range(6):
            feed(chunk)
            for rt in (primary, standby, primary, standby):
                rt.process_all_available()
            # A few triggers with no new input: time for the batches that drop expired state.
            time.sleep(1.0)
        assert batches_without_input(primary) >= 1
        assert batches_without_input(standby) == 0
        assert 0 < state_rows([standby])[0] <= 9  # one row per window; all 30: 30 rows
        primary.stop()
        standby.gate.promote()
        for chunk in range(6, 8):
            feed(chunk)
            standby.process_all_available()
    finally:
        standby.stop()
        primary.stop()
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["item"])
    expected = truth.topn(entries, window_seconds=1, n=3)
    got = {w: json.loads(v) for w, v in redis_conn.hgetall(keys.results(job)).items()}
    assert len(expected) == 40 and got == expected


def test_sparks_python_workers_import_pyspark_compiled_from_site_packages(spark):
    """The session's Python workers run through backstop-python-worker
    (spark_runtime/python_worker.py): PySpark and py4j from site-packages, where they are
    compiled, not from the zips Spark puts first on their path."""
    import sysconfig

    def where(_rows):
        import os as worker_os

        import py4j
        import pyspark

        yield pyspark.__file__, py4j.__file__, worker_os.environ.get("PYTHONPATH", "")

    [(pyspark_file, py4j_file, path)] = (
        spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    )
    site = sysconfig.get_paths()["purelib"]
    assert pyspark_file == os.path.join(site, "pyspark", "__init__.py")
    assert py4j_file == os.path.join(site, "py4j", "__init__.py")
    assert "pyspark.zip" not in path and "py4j-" not in path


def test_the_sessions_jvm_runs_with_c1_only_and_the_serial_collector(spark):
    """build_session's JVM options (spark_runtime/config.py, JVM_OPTIONS) reach the JVM: as the
    JVM itself reports its arguments, its collectors and its compiler."""
    jvm = spark.sparkContext._jvm
    management = jvm.java.lang.management.ManagementFactory
    arguments = list(management.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in arguments and "-XX:+UseSerialGC" in arguments
    collectors = {bean.getName() for bean in management.getGarbageCollectorMXBeans()}
    assert collectors == {"Copy", "MarkSweepCompact"}  # the serial collector's two generations
    flag = management.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    ).getVMOption("TieredStopAtLevel")
    assert flag.getValue() == "1"


@pytest.mark.parametrize("green_keys", [20, 19], ids=["same-results", "other-results"])
def test_an_old_version_checks_its_successors_results_on_the_keys_both_computed(
    spark, redis_conn, redis_url, job, tmp_path, green_keys
):
    """An upgrade declared result-preserving (spark_runtime/result_check.py): after handing
    over with `compare`, the old version compares what it computes with what the new one
    writes. The same plan (20 keys) matches on every key compared; a plan that assigns records
    to 19 keys instead gives other sums for the same key names, which the old version finds."""
    from spark_runtime.stage import handle_command

    blue_topology = with_params(
        get_topology("shuffle"), {"assign_keys": {"keys": 20}, "aggregate": {"selectivity": 0.05}}
    )
    green_topology = with_params(blue_topology, {"assign_keys": {"keys": green_keys}})
    (blue_stage,) = compile_stages(blue_topology, FUSED, job=job)
    (green_stage,) = compile_stages(green_topology, FUSED, job=job)
    generators.generate(redis_conn, job, "shuffle", count=600, rate=1e6, seed=9)
    blue = StageRuntime(spark, redis_conn, job, blue_topology, blue_stage, PRIMARY, redis_url,
                        str(tmp_path / "blue"))  # fmt: skip
    green = StageRuntime(spark, redis_conn, job, green_topology, green_stage, STANDBY, redis_url,
                         str(tmp_path / "green"))  # fmt: skip
    blue_state = replica_state(redis_conn, job, "sh-1", "primary", "n1")
    green_state = replica_state(redis_conn, job, "sh-2", "standby", "n2")
    blue.start()
    green.start()
    try:
        blue.process_all_available()
        green.process_all_available()
        demote = {"cmd": "demote", "successor": "sh-2", "compare": True}
        assert handle_command(demote, blue, blue_state) is None
        blue.gate.demote_if_overdue(0.0)  # no batch of blue's comes: it demotes itself now
        assert blue_state.info["role"] == "standby"
        _, passed_on = redis_conn.blpop([keys.control(job, "sh-2")], timeout=1)
        assert handle_command(json.loads(passed_on), green, green_state) is None
        for seed in (10, 11):  # two rounds: each side sees the other's writes of the first
            generators.generate(
                redis_conn, job, "shuffle", count=400, rate=1e6, seed=seed, id_prefix=f"s{seed}"
            )
            green.process_all_available()  # the primary now: it writes
            blue.process_all_available()  # a standby: it computes and compares
    finally:
        green.stop()
        blue.stop()
    report = blue.gate.result_check.report()
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["value"])
    green_state_truth, _ = truth.shuffle(entries, keys=green_keys, selectivity=0.05)
    blue_state_truth, _ = truth.shuffle(entries, keys=20, selectivity=0.05)
    got = {k: json.loads(v) for k, v in redis_conn.hgetall(keys.results(job)).items()}
    # The new version wrote every key it computes (k19 of the old plan stays as it was).
    assert {k: got[k] for k in green_state_truth} == green_state_truth
    assert report["compared"] > 0, report
    differing_keys = {
        k for k in blue_state_truth if blue_state_truth[k] != green_state_truth.get(k)
    }
    if green_keys == 20:
        assert report["differing"] == 0, report
    else:
        assert differing_keys and 0 < report["differing"] <= report["compared"], report
        named = {example.split("'")[1] for example in report["examples"]}
        assert named <= differing_keys, (named, differing_keys)


def test_only_a_stage_writing_keyed_results_has_results_to_compare(spark, redis_conn, job):
    topology = get_topology("wordcount")
    split, count = compile_stages(topology, PER_OPERATOR, job=job)
    runtimes = {
        stage.name: StageRuntime(spark, redis_conn, job, topology, stage, STANDBY, "", "")
        for stage in (split, count)
    }
    # split writes a channel to count; count the results hash.
    assert not runtimes[split.name].writes_comparable_results()
    assert runtimes[count.name].writes_comparable_results()


def test_progress_events_read_as_json_match_pysparks_own(
    spark, redis_conn, redis_url, job, tmp_path
):
    """spark_runtime/listener.py builds each progress event from its JSON: the same batches,
    input rows, durations and state as PySpark's own bridge reports, and together they count
    every well-formed input entry once."""
    from pyspark.sql.streaming import StreamingQueryListener

    from spark_runtime.listener import JsonProgressListener

    def summary(progress):
        return (
            progress.batchId,
            progress.numInputRows,
            sorted(progress.durationMs),
            [op.numRowsTotal for op in progress.stateOperators],
            [source.endOffset for source in progress.sources],
        )

    seen = {"json": [], "pyspark": []}

    def recorder(base, name):
        class Recorder(base):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                seen[name].append(summary(event.progress))

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        return Recorder()

    listeners = [
        recorder(JsonProgressListener, "json"),
        recorder(StreamingQueryListener, "pyspark"),
    ]
    for listener in listeners:
        spark.streams.addListener(listener)
    topology = get_topology("wordcount")
    (stage,) = compile_stages(topology, FUSED, job=job)
    generators.generate(
        redis_conn, job, "wordcount", count=300, rate=1e6, seed=5, malformed_every=20
    )
    runtime = StageRuntime(
        spark, redis_conn, job, topology, stage, PRIMARY, redis_url, str(tmp_path), max_records=80
    )
    try:
        runtime.start()
        runtime.process_all_available()
        deadline = time.time() + 20  # listener events arrive asynchronously
        while time.time() < deadline and (
            not seen["json"] or len(seen["json"]) != len(seen["pyspark"])
        ):
            time.sleep(0.2)
    finally:
        runtime.stop()
        for listener in listeners:
            spark.streams.removeListener(listener)
    assert seen["json"] == seen["pyspark"]
    assert all("addBatch" in durations for _, _, durations, _, _ in seen["json"])
    entries = truth.valid_entries(redis_conn, keys.input_stream(job), ["text"])
    assert sum(rows for _, rows, _, _, _ in seen["json"]) == len(entries)


def test_a_spare_warms_up_a_published_stage_plan_without_touching_the_job(
    spark, redis_conn, redis_url, job
):
    """A spare runs a live job's published stage plan (spark_runtime/spare_plans.py) once, on
    the newest WARM_INPUT_ENTRIES entries of the job's input copied under a key of its own: its
    query processes exactly those, and afterwards no warm-up key, query or checkpoint is left
    and the job's own keys are as they were. A job without input yet gets generated entries."""
    import glob
    import tempfile

    from spark_runtime.spare_plans import (
        WARM_INPUT_ENTRIES,
        publish_plans,
        stage_plans,
        warm_up_plan,
        warm_up_plans,
        withdraw_plans,
    )

    topology = get_topology("wordcount")
    plans = stage_plans("wordcount", {"all": [op.name for op in topology.operators]})
    generators.generate(redis_conn, job, "wordcount", count=WARM_INPUT_ENTRIES + 15, rate=10_000)

    def job_state():
        found = sorted(redis_conn.scan_iter(match=f"{keys.job_prefix(job)}*"))
        return found, redis_conn.xlen(keys.input_stream(job))

    def leftovers(spare_id):
        warm_keys = list(redis_conn.scan_iter(match=f"{keys.job_prefix('spare-warmup-')}*"))
        return [k for k in warm_keys if spare_id in k], spark.streams.active

    before = job_state()
    temp = set(glob.glob(os.path.join(tempfile.gettempdir(), "backstop-spare-plan-*")))
    publish_plans(redis_conn, job, plans)
    try:
        taken = threading.Event()
        taken.set()
        assert warm_up_plans(spark, redis_conn, redis_url, f"{job}-a", taken) == []
        assert warm_up_plans(spark, redis_conn, redis_url, f"{job}-b", threading.Event()) == [
            "wordcount/all"
        ]
        rows = warm_up_plan(
            spark, redis_conn, redis_url, {**plans[0], "job": job}, f"{job}-c", threading.Event()
        )
        assert rows == WARM_INPUT_ENTRIES  # the newest entries, each read once
        fresh = f"{job}-new"  # a job whose input is still empty: generated entries
        assert (
            warm_up_plan(
                spark,
                redis_conn,
                redis_url,
                {**plans[0], "job": fresh},
                f"{job}-d",
                threading.Event(),
            )
            == WARM_INPUT_ENTRIES
        )
        assert not redis_conn.exists(keys.input_stream(fresh))
    finally:
        withdraw_plans(redis_conn, job)
    assert job_state() == before
    assert not redis_conn.hexists(keys.spare_plans(), job)
    for suffix in "abcd":
        assert leftovers(f"{job}-{suffix}") == ([], [])
    now = set(glob.glob(os.path.join(tempfile.gettempdir(), "backstop-spare-plan-*")))
    assert now <= temp


def test_a_spare_skips_a_stage_plan_whose_internal_input_is_still_empty(
    spark, redis_conn, redis_url, job
):
    """A published plan of a stage that reads another stage's stream, which nothing has written
    to yet, is not started: no batch could run, and the spare would wait its whole timeout."""
    from spark_runtime.spare_plans import warm_up_plan

    stages = compile_stages(get_topology("topn"), PER_OPERATOR, job=job)
    downstream = next(s for s in stages if s.inputs != ("in",))
    plan = {"topology": "topn", "stage": downstream.name, "operators": list(downstream.operators),
            "params": [], "job": job}  # fmt: skip

    with query_starts(spark) as started:
        assert warm_up_plan(spark, redis_conn, redis_url, plan, f"{job}-w", threading.Event()) == 0
    assert started == [] and not spark.streams.active
    assert not list(redis_conn.scan_iter(match=f"{keys.job_prefix(job + '-w')}*"))


def test_an_idle_spare_warms_new_plans_once_and_yields_to_a_command(
    spark, redis_conn, redis_url, job
):
    """While idle, a spare warms the published plans it has not warmed yet
    (spark_runtime.spare.warm_while_idle), each once; with a command queued for it (an agent
    took it) it warms nothing and leaves the command for its command loop."""
    from spark_runtime.spare import warm_while_idle
    from spark_runtime.spare_plans import publish_plans, stage_plans, withdraw_plans

    topology = get_topology("wordcount")
    generators.generate(redis_conn, job, "wordcount", count=30, rate=10_000)
    spare = argparse.Namespace(node="node-t", spare_id=f"{job}-spare", redis_url=redis_url)
    control = keys.spare_control(spare.node, spare.spare_id)
    publish_plans(
        redis_conn, job, stage_plans("wordcount", {"all": [o.name for o in topology.operators]})
    )
    try:
        command = json.dumps({"cmd": "become", "args": []})
        redis_conn.rpush(control, command)
        done: set[str] = set()
        assert warm_while_idle(spark, redis_conn, spare, done) == []
        assert redis_conn.lrange(control, 0, -1) == [command] and done == set()
        redis_conn.delete(control)
        assert warm_while_idle(spark, redis_conn, spare, done) == ["wordcount/all"]
        assert warm_while_idle(spark, redis_conn, spare, done) == []  # once
        assert len(done) == 1 and not spark.streams.active
    finally:
        withdraw_plans(redis_conn, job)
        redis_conn.delete(control)
