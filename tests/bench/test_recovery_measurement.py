"""Recovery episodes measured live by the controller's service agree with the benchmark's figures
for the same faults (one measurement, console.policy.recovery.measure_faults, two callers).

Real PostgreSQL/SQLite and Redis: progress records and the job's input go to the job's streams
as the data plane writes them; the controller's `measure_open_episodes` is called once per policy
cycle with a moving clock, as the controller calls it, and the benchmark's `measure_run` then
judges the whole recorded run. The output is built by hand so every figure is known.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.strategy.harness import BenchSettings
from bench.strategy.run import measure_run
from console.models import Job, Policy, RecoveryEpisode, RegisteredTopology
from console.services.recovery import audit_closed_episodes, measure_open_episodes
from console.services.topologies import write_snapshot
from spark_runtime import keys as data_keys
from spark_runtime.jobdef import snapshot_source
from spark_runtime.progress import publish_progress
from spark_runtime.topology import OUT_CHANNEL, RESULTS_CHANNEL
from tests.factories import EpisodeFactory, FaultFactory, make_job, progress_record

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_flushed")]

# Input starts at T0; warm-up 30 s, faults at 60 and 90 s, input ends at 120 s (the benchmark's
# schedule for 2 faults over a 90 s measured duration).
WARMUP_S, DURATION_S = 30.0, 90.0
CYCLE_S = 5.0


def at(t0: float, seconds: float) -> datetime:
    return datetime.fromtimestamp(t0 + seconds, tz=UTC)


def publish_run(redis_conn, job: Job, t0: float) -> None:
    """One output batch a second; no output for [60, 64) and [90, 97), a slower output after
    the second fault; the input stream's first entry at T0."""
    redis_conn.xadd(data_keys.input_stream(job.key), {"text": "a b"}, id=f"{int(t0 * 1000)}-0")
    for second in range(0, 125):
        if 60 <= second < 64 or 90 <= second < 97:
            continue
        p99 = 2.5 if 97 <= second < 100 else 1.0  # the catch-up after the second outage
        record = progress_record(
            at=t0 + second + 0.5, written=5, input_rows=100, latency_p50=0.5, latency_p90=0.8,
            latency_p99=p99,
        )  # fmt: skip
        publish_progress(redis_conn, job.key, record)


def test_episodes_measured_live_agree_with_the_benchmark(redis_conn, tmp_path: Path):
    Policy(
        reason="bench settings", recovery_stable_window_s=10.0, reference_window_s=30.0,
        warmup_s=WARMUP_S,
    ).save()  # fmt: skip
    job = make_job(status=Job.Status.RUNNING)
    t0 = float(int(time.time()) - 400)
    publish_run(redis_conn, job, t0)
    first = FaultFactory(job=job, injected_at=at(t0, 60.0), outcome="injected")
    second = FaultFactory(job=job, injected_at=at(t0, 90.0), outcome="injected")
    # The controller's episodes, one per failed stage, opened when the failure is found (a
    # heartbeat timeout after the fault); the second fault also failed a stage with no
    # injection linked, found a second later.
    failures = [(63.0, first, "count"), (93.0, second, "count"), (94.0, None, "split")]

    config = Policy.current().to_config()
    closed_at = {}
    for now in range(61, 130, int(CYCLE_S)):
        for detected, fault, stage in [f for f in failures if f[0] <= now]:
            failures.remove((detected, fault, stage))
            EpisodeFactory(job=job, fault=fault, stage=stage, detected_at=at(t0, detected))
        measure_open_episodes(job, redis_conn, config, now=t0 + now)
        for episode in RecoveryEpisode.objects.filter(job=job, watched_s__isnull=False):
            closed_at.setdefault(episode.pk, now)
    episodes = {e.pk: e for e in RecoveryEpisode.objects.filter(job=job)}
    assert len(closed_at) == 3, "every episode got final figures"

    bench = BenchSettings(
        topology="wordcount", strategies=("adaptive",), faults=2, fault_kind="kill-driver",
        rate=100, warmup_s=WARMUP_S, duration_s=DURATION_S, out=tmp_path, stable_window_s=10.0,
    )  # fmt: skip
    assert bench.schedule == [60.0, 90.0]
    run = measure_run(
        job, bench, t0, [(60.0, first, "kill"), (90.0, second, "kill")], target="count"
    )
    figures = ("downtime_s", "recovery_time_s", "peak_p99_ms", "watched_s")
    for row, fault in zip(run["faults"], (first, second), strict=True):
        for episode in episodes.values():
            if episode.fault_id == fault.pk or (fault is second and episode.fault_id is None):
                assert {f: getattr(episode, f) for f in figures} == {f: row[f] for f in figures}
        assert [c["episode"] for c in row["console"]] == [
            e.pk for e in episodes.values() if e.fault_id == fault.pk
        ]
    # Known answers: the first outage is the gap from the batch at 59.5 s to the one at 64.5 s
    # (5 s; back in band at once, so its recovery is its downtime); the second is 89.5 -> 97.5.
    assert [(r["downtime_s"], r["recovery_time_s"]) for r in run["faults"]] == [
        (5.0, 5.0), (8.0, 8.0),
    ]  # fmt: skip
    # Live, each closed at the first cycle (61, 66, ... s) with its stable window (10 s) and
    # smoothing (5 s) complete on output judged only once 6 s old (2 s of records in flight and
    # a heartbeat timeout + 1 s to learn of a later fault): fault 1 back in band at 64 s, so
    # from 64 + 15 + 6 = 85 s, the cycle at 86 s; fault 2 at 97 s, from 118 s: at 121 s.
    by_fault = {e.fault_id: closed_at[pk] for pk, e in episodes.items()}
    assert by_fault[first.pk] == 86
    assert by_fault[second.pk] == 121
    stored = episodes[next(pk for pk, e in episodes.items() if e.fault_id == first.pk)]
    # Its reference is kept for the next fault: 30 s before it, after the 30 s warm-up.
    assert (stored.reference_from, stored.reference_to) == (at(t0, 30.0), at(t0, 60.0))


def test_closing_an_episode_audits_the_output_against_the_input(redis_conn):
    """A stopped job's open episode closes (not measurable: no normal output before the fault);
    the audit then records the job's lost and duplicated results: one `b` too many, a missing
    `c`; a later episode records only what its audit adds."""
    job = make_job(status=Job.Status.STOPPED)  # wordcount; no stages planned: count reads the input
    t0 = float(int(time.time()) - 100)
    first_id, second_id = f"{int(t0 * 1000)}-0", f"{int(t0 * 1000) + 500}-0"
    for entry_id, line in ((first_id, "u1 a b"), (second_id, "u2 b c")):
        uid, text = line.split(" ", 1)
        fields = {"id": uid, "ts": str(int(t0 * 1000)), "text": text}
        redis_conn.xadd(data_keys.input_stream(job.key), fields, id=entry_id)
    redis_conn.xadd(data_keys.input_stream(job.key), {"id": "u3", "text": "a a a"})  # no ts
    position = int(t0 * 1000 + 500) * 1_000_000  # the second line's (see redis_source.entry_pos)
    redis_conn.hset(data_keys.results(job.key), mapping={"a": "1", "b": "3"})
    redis_conn.hset(
        data_keys.result_versions(job.key),
        mapping={"a": f"{position - 500 * 1_000_000:020d}{0:06d}", "b": f"{position:020d}{0:06d}"},
    )
    episode = EpisodeFactory(job=job, detected_at=at(t0, 10.0))

    assert measure_open_episodes(job, redis_conn, Policy.current().to_config()) == 1
    episode.refresh_from_db()
    assert episode.watched_s is not None and episode.recovery_time_s is None
    assert episode.lost is None  # audited by a task, once closed
    assert audit_closed_episodes(job, redis_conn) == 1
    episode.refresh_from_db()
    # Input up to b's version (the second line): a=1, b=2, c=1. Stored b=3: one duplicate; c
    # is missing: one lost. The third line has no ts: the data plane dead-letters it.
    assert (episode.lost, episode.duplicates) == (1, 1)
    assert "1 lost and 1 duplicated of 3 results in the job so far (1 and 1 new)" in episode.notes
    assert audit_closed_episodes(job, redis_conn) == 0  # idempotent

    # A later episode adds only what is new: one more duplicate of a.
    redis_conn.hset(data_keys.results(job.key), "a", "2")
    later = EpisodeFactory(job=job, detected_at=at(t0, 20.0), watched_s=5.0)
    assert audit_closed_episodes(job, redis_conn) == 1
    later.refresh_from_db()
    assert (later.lost, later.duplicates) == (0, 1)


EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"


@pytest.fixture
def example_jobs(tmp_path, monkeypatch):
    """The example user jobs registered as version 1 (without the check's dry run: the audit
    needs only the snapshot and the flag that it has a reference)."""
    directory = tmp_path / "jobs"
    shutil.copytree(EXAMPLES, directory / "examples")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    for name in ("activity", "server_errors"):
        ref = f"examples.clickstream:{name}"
        version = RegisteredTopology.objects.create(
            name=name, version=1, module=ref, source=snapshot_source(ref),
            source_sha256="-", shape={"has_reference": True},
        )  # fmt: skip
        write_snapshot(version)


def click_entries(
    redis_conn, job: Job, t0_ms: int, clicks: list[tuple[str, int, int]]
) -> list[str]:
    """Input entries (user, dwell ms, status), one per 100 ms from `t0_ms`; returns their ids."""
    ids = []
    for i, (user, dwell, status) in enumerate(clicks):
        entry_id = f"{t0_ms + 100 * i}-0"
        fields = {"id": f"c{i}", "ts": t0_ms + 100 * i, "user": user, "page": "home",
                  "dwell_ms": dwell, "status": status}  # fmt: skip
        redis_conn.xadd(data_keys.input_stream(job.key), fields, id=entry_id)
        ids.append(entry_id)
    return ids


def batch_version(entry_id: str) -> str:
    """The version of a batch ending at `entry_id` (spark_runtime.user_plan.batch_version)."""
    ms, seq = entry_id.split("-")
    return f"{int(ms) * 1_000_000 + int(seq):020d}{0:06d}"


def iso(ms: int) -> str:
    seconds = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return f"{seconds:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def close_one_episode(job: Job, redis_conn) -> RecoveryEpisode:
    episode = EpisodeFactory(job=job, detected_at=at(time.time(), -50.0), watched_s=5.0)
    assert audit_closed_episodes(job, redis_conn) == 1
    episode.refresh_from_db()
    return episode


def test_a_user_jobs_upserted_output_is_audited_up_to_its_sinks_watermark(redis_conn, example_jobs):
    """activity (per user and 10-second window): batches up to the 4th click are written (the
    sink's watermark), the 5th click's batch is being written. u2 is missing although its click
    is below the watermark (1 lost); u9 was never clicked (1 duplicate); u3's value from the
    batch past the watermark is right for the input up to its own version."""
    job = make_job(status=Job.Status.STOPPED, topology="activity@1", name="act")
    job.operators.filter(name="per_window").update(stage="per_window")
    t0 = (int(time.time()) - 100) * 1000 // 10_000 * 10_000  # a window start
    ids = click_entries(redis_conn, job, t0, [("u1", 100, 200), ("u2", 300, 200), ("u1", 500, 200),
                                          ("u4", 50, 200), ("u3", 700, 200)])  # fmt: skip
    window = iso(t0)
    values = {
        f"u1|{window}": ({"clicks": 2, "dwell_ms": 600, "longest_ms": 500}, ids[2]),
        f"u4|{window}": ({"clicks": 1, "dwell_ms": 50, "longest_ms": 50}, ids[3]),
        f"u9|{window}": ({"clicks": 1, "dwell_ms": 1, "longest_ms": 1}, ids[3]),
        f"u3|{window}": ({"clicks": 1, "dwell_ms": 700, "longest_ms": 700}, ids[4]),
    }
    for field, (value, entry_id) in values.items():
        redis_conn.hset(data_keys.results(job.key), field, json.dumps(value, sort_keys=True))
        redis_conn.hset(data_keys.result_versions(job.key), field, batch_version(entry_id))
    redis_conn.hset(
        data_keys.watermarks(job.key, "per_window"), RESULTS_CHANNEL, batch_version(ids[3])
    )

    episode = close_one_episode(job, redis_conn)
    assert (episode.lost, episode.duplicates) == (1, 1)


def test_a_user_jobs_appended_output_is_audited_up_to_its_sinks_watermark(redis_conn, example_jobs):
    """server_errors (every 5xx click, once): c1 appended twice (1 duplicate), c3 missing below
    the watermark (1 lost), c4 appended by the batch past the watermark (right)."""
    job = make_job(status=Job.Status.STOPPED, topology="server_errors@1", name="err")
    job.operators.filter(name="errors").update(stage="errors")
    t0 = (int(time.time()) - 100) * 1000
    ids = click_entries(redis_conn, job, t0, [("u1", 100, 200), ("u2", 100, 503), ("u3", 100, 200),
                                          ("u4", 100, 503), ("u5", 100, 503)])  # fmt: skip

    def record(i, user):
        return {"key": f"c{i}", "user": user, "page": "home", "status": "503",
                "event_time": iso(t0 + 100 * i)}  # fmt: skip

    for fields in (record(1, "u2"), record(1, "u2"), record(4, "u5")):
        redis_conn.xadd(data_keys.output_stream(job.key), fields)
    redis_conn.hset(data_keys.watermarks(job.key, "errors"), OUT_CHANNEL, batch_version(ids[3]))

    episode = close_one_episode(job, redis_conn)
    assert (episode.lost, episode.duplicates) == (1, 1)
