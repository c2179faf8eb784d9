"""Running one stage's queries inside a Spark driver: used by the stage process and by tests.

`StageRuntime` starts one Structured Streaming query per segment of a `StageSpec`, reading the
Redis streams through the `redis_stream` source and writing every micro-batch through the
`OutputGate`. The gate is where the replica's role matters: a primary writes through the fenced,
idempotent sinks; a hot standby keeps its outputs in an `OutputBuffer` until it is promoted.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_runtime import external_io, kafka_audit, keys, user_plan
from spark_runtime.buffer import OutputBuffer
from spark_runtime.checkpoint_seed import remove_orphan_temp_files
from spark_runtime.env import env
from spark_runtime.external_io import KafkaSink
from spark_runtime.kafka_sink import KafkaResultWriter
from spark_runtime.kafka_source import FORMAT_NAME as KAFKA_FORMAT
from spark_runtime.pipelines import segment_plans
from spark_runtime.progress import percentiles
from spark_runtime.redis_source import FORMAT_NAME, SEQ_FACTOR
from spark_runtime.result_check import ResultCheck
from spark_runtime.sink import FencedWriter
from spark_runtime.state_partitions import match_partitions
from spark_runtime.topology import (
    INPUT_CHANNEL,
    OUT_CHANNEL,
    RESULTS_CHANNEL,
    SegmentSpec,
    StageSpec,
    Topology,
    channel_key,
)

log = logging.getLogger(__name__)

PRIMARY = "primary"
STANDBY = "standby"
# The session setting that is the number of state partitions of a query's stateful operators.
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# Whether a query runs a batch without new input when its watermark has moved (to drop expired
# state, and in append mode to emit the windows it closes).
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


@contextlib.contextmanager
def session_settings(spark, settings: dict[str, str]):
    """Set `settings` on `spark`'s session for the block, then put back what was there."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def version_ms(version: str) -> int:
    """The input entry time (epoch ms) inside an output version (see sink.version)."""
    return int(version[:20]) // SEQ_FACTOR


def lag_behind(watermarks: dict[str, str], per_sink: dict[str, list]) -> float | None:
    """Seconds of input between the primary's watermarks and the newest outputs of a standby's
    batch (0 when the standby is ahead); None when no sink of the batch has a watermark yet."""
    lags = [
        version_ms(watermarks[sink]) - version_ms(max(r.version for r in records))
        for sink, records in per_sink.items()
        if sink in watermarks and records
    ]
    return max(0.0, max(lags) / 1000.0) if lags else None


class InjectedFault(RuntimeError):
    """Raised by an armed operator-exception fault (fault injection)."""


class PromotionError(RuntimeError):
    """The standby cannot take over without losing output (its buffer dropped unwritten data)."""


@dataclass(frozen=True)
class PendingDemotion:
    """A demotion asked for, carried out after the replica's next batch: `then(result)` runs
    once it is done; `asked_at` is time.monotonic() when it was asked for."""

    then: Callable[[dict], None]
    compare: bool
    comparable: bool
    asked_at: float


class OutputGate:
    """Receives every micro-batch of a stage's queries and writes or buffers its outputs."""

    def __init__(
        self,
        client,
        job: str,
        stage: str,
        role: str,
        buffer_max: int = 200_000,
        user_job=None,
        kafka_sink: KafkaSink | None = None,
    ):
        self.client = client
        # A user job's JobDefinition: its outputs carry batch versions (spark_runtime/user_plan).
        self.user_job = user_job
        self.job = job
        self.stage = stage
        self.role = role
        self.writer = FencedWriter(client, job, stage)
        # The job's Kafka sink, for a stage that writes final outputs: written before Redis.
        self.kafka = KafkaResultWriter(client, kafka_sink, job, stage) if kafka_sink else None
        self.buffer = OutputBuffer(buffer_max)
        # Held while a batch is written or buffered, and during promotion, so that a promotion
        # never interleaves with a batch.
        self.lock = threading.Lock()
        self.fault_after: int | None = None
        # A slow-driver fault: each batch handled before `slow_until` (epoch s) first waits
        # `slow_delay_s`, as a batch behind a slow dependency or a GC storm would.
        self.slow_delay_s = 0.0
        self.slow_until = 0.0
        self.batch_stats: dict[str, dict] = {}
        self.last_write_at: float | None = None
        # A standby's distance behind its primary, in seconds of input, per query after its
        # latest batch (0 once the query is idle: it has read all the input there is): a standby
        # far behind must not be promoted.
        self.query_lag_s: dict[str, float] = {}
        # This primary handed the output over to an upgrade's new version (`demote`): it stays
        # ready to write again at full pace until the upgrade ends.
        self.handed_over = False
        # An upgrade declared result-preserving: this demoted primary compares what it computes
        # with what its successor writes (spark_runtime/result_check.py); None otherwise.
        self.result_check: ResultCheck | None = None
        self._appended_since = "0-0"  # the output stream's entries read by the check so far
        # A demotion asked for and not carried out yet (`demote_after_batch`).
        self._pending_demotion: PendingDemotion | None = None
        if role == PRIMARY:
            self._acquire()
        elif self.kafka is not None:
            # A standby takes over sooner with its Kafka producer made and connected.
            self.kafka.prepare()

    def _acquire(self) -> int:
        """Become the stage's writer: a new Redis epoch, then the Kafka sink's fencing."""
        epoch = self.writer.acquire()
        if self.kafka is not None:
            self.kafka.acquire(epoch)
        return epoch

    # -- sinks --------------------------------------------------------------------------------

    def _write(self, sink: str, records: list, batch: str | None = None) -> int:
        """Write `records` to `sink`. For a user job, `batch` is the version the sink's watermark
        moves to once they are written (the newest record's version when None)."""
        if self.user_job is not None:
            batch = batch or max(r.version for r in records)
        if self.kafka is not None and sink in (RESULTS_CHANNEL, OUT_CHANNEL):
            self.kafka.write(sink, records)
        if sink == RESULTS_CHANNEL:
            return self.writer.upsert_hash(
                sink, keys.results(self.job), keys.result_versions(self.job), records, batch
            )
        if sink == OUT_CHANNEL and self.user_job is not None:
            stream = keys.output_stream(self.job)
            return self.writer.emit_keyed(sink, stream, records, user_plan.KEY_FIELD, batch)
        if sink == OUT_CHANNEL:
            return self.writer.emit_stream(sink, keys.output_stream(self.job), records)
        return self.writer.emit_stream(sink, keys.channel_stream(self.job, sink), records)

    def _records(self, segment: SegmentSpec, topology: Topology, rows: list[dict]):
        """Sink records of a built-in operator's output rows, per sink."""
        last, _ = segment_plans(topology, segment.operators)[-1]
        per_sink: dict[str, list] = {}
        for row in rows:
            if last.to_outputs is not None and segment.outputs[0] == RESULTS_CHANNEL:
                for sink, rec in last.to_outputs(row):
                    per_sink.setdefault(sink, []).append(rec)
            else:
                per_sink.setdefault(segment.outputs[0], []).append(last.to_channel(row))
        return per_sink

    def slow_down(self, delay_s: float, duration_s: float) -> None:
        """Make each batch of the next `duration_s` seconds `delay_s` longer (a slow-driver
        fault): the stage keeps its heartbeats and its output, late."""
        self.slow_delay_s, self.slow_until = delay_s, time.time() + duration_s

    def handle_batch(
        self,
        segment: SegmentSpec,
        topology: Topology,
        df,
        batch_id: int,
        query: str,
        batch: str | None = None,
    ) -> None:
        """foreachBatch body: convert the batch's rows to sink records and write or buffer them.
        `batch` is the batch's version (its end offset), for user jobs."""
        if self.fault_after is not None:
            self.fault_after -= 1
            if self.fault_after <= 0:
                self.fault_after = None
                raise InjectedFault(f"injected operator exception in stage {self.stage}")
        if time.time() < self.slow_until:
            time.sleep(self.slow_delay_s)  # outside the lock: a promotion need not wait for it
        rows = df.toArrow().to_pylist()
        now_ms = time.time() * 1000
        if self.user_job is not None:
            per_sink = {segment.outputs[0]: []}
            for sink, rec in user_plan.to_records(self.user_job, rows, batch):
                per_sink.setdefault(sink, []).append(rec)
            # User rows carry no event time of Backstop's: the newest input of the batch stands in.
            latencies = [(now_ms - version_ms(batch)) / 1000] if rows else []
        else:
            per_sink = self._records(segment, topology, rows)
            latencies = [(now_ms - row["ts"]) / 1000 for row in rows]
        written = 0
        demoted = None
        with self.lock:
            handled_as = self.role  # what its progress record says (a demotion may follow)
            if self.role == PRIMARY:
                for sink, records in per_sink.items():
                    if records or self.user_job is not None:
                        written += self._write(sink, records, batch)
                if written:
                    self.last_write_at = time.time()
                pending = self._pending_demotion
                if pending is not None:
                    demoted = pending, self._demote(pending.compare, pending.comparable)
            else:
                for sink, records in per_sink.items():
                    self.buffer.add(sink, records)
                per_sink = {sink: records for sink, records in per_sink.items() if records}
                if self.result_check is not None:
                    self._note_own_results(per_sink, batch)
                lag = lag_behind(self._trim_buffer(), per_sink)
                if lag is not None:
                    self.query_lag_s[query] = lag
        if demoted is not None:
            pending, result = demoted
            pending.then(result)
        final = segment.outputs[0] in (RESULTS_CHANNEL, OUT_CHANNEL)
        self.batch_stats[f"{query}:{batch_id}"] = {
            "role": handled_as,
            "rows_out": len(rows),
            "written": written,
            "final": final,
            "latency": percentiles(latencies) if final else percentiles([]),
            "buffered": len(self.buffer),
        }
        # Keep the stats map small: the listener reads the entry of the batch it reports.
        while len(self.batch_stats) > 50:
            self.batch_stats.pop(next(iter(self.batch_stats)))

    def _trim_buffer(self) -> dict[str, str]:
        """Forget what the primary has written; returns its watermarks per sink."""
        marks = self.client.hgetall(keys.watermarks(self.job, self.stage))
        if self.result_check is not None:
            self._compare_with_primary(marks)
        for sink in self.buffer.sinks():
            if self._keyed(sink):
                # A user job's appended record may come later from the primary than from its
                # standby (a window closes when the watermark passes it, and the two replicas'
                # batches differ), so only what the primary has written is forgotten.
                records = self.buffer.records(sink)
                written_keys = keys.written_keys(self.job, sink)
                found = self.client.smismember(
                    written_keys, [r.fields[user_plan.KEY_FIELD] for r in records]
                )
                done = {id(r) for r, hit in zip(records, found, strict=True) if hit}
                self.buffer.discard(sink, lambda r, done=done: id(r) in done)
            elif sink in marks:
                self.buffer.trim(sink, marks[sink])
        return marks

    def _note_own_results(self, per_sink: dict[str, list], batch: str | None) -> None:
        """The result check notes what this replica computed in a batch (its hash values, and
        its records appended once per key)."""
        check = self.result_check
        for sink, records in per_sink.items():
            if sink == RESULTS_CHANNEL:
                check.note_blue_values(sink, records, batch or max(r.version for r in records))
            elif self._keyed(sink):
                for record in records:
                    key = record.fields[user_plan.KEY_FIELD]
                    check.note_appended(sink, key, record.fields, by_blue=True)
        if batch is not None:
            check.blue_through = max(check.blue_through, batch)

    def _compare_with_primary(self, marks: dict[str, str]) -> None:
        """Compare the values waiting in the result check with what the primary wrote: the
        results hash's values and versions, and the output stream's records since the last look
        (all written by the primary since this replica demoted itself)."""
        check = self.result_check
        waiting = check.keys_to_look_up(RESULTS_CHANNEL, COMPARE_CHUNK)
        if waiting:
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(keys.results(self.job), waiting)
            pipe.hmget(keys.result_versions(self.job), waiting)
            values, versions = pipe.execute()  # one round trip on the standby's batch path
            stored = {
                key: (value, version) if value is not None and version is not None else None
                for key, value, version in zip(waiting, values, versions, strict=True)
            }
            check.compare_values(RESULTS_CHANNEL, stored)
        if self.user_job is None or OUT_CHANNEL not in marks:
            return
        stream = keys.output_stream(self.job)
        while True:
            entries = self.client.xrange(stream, f"({self._appended_since}", "+", COMPARE_CHUNK)
            for entry_id, fields in entries:
                self._appended_since = entry_id
                key = fields.get(user_plan.KEY_FIELD)
                if key is not None:
                    check.note_appended(OUT_CHANNEL, key, fields, by_blue=False)
            if len(entries) < COMPARE_CHUNK:
                return

    def _keyed(self, sink: str) -> bool:
        """True for a user job's output stream: written once per key, not in version order."""
        return self.user_job is not None and sink == OUT_CHANNEL

    def note_idle(self, query: str) -> None:
        """Spark found no new input for `query`: it has read everything there is, so a standby
        is not behind on it (a standby seeded with everything its primary had read runs no batch
        until new input comes, and must not stay `catching_up` meanwhile)."""
        if self.role != PRIMARY:
            self.query_lag_s[query] = 0.0

    @property
    def standby_lag_s(self) -> float | None:
        """The largest lag over this standby's queries (None before any batch or idle event)."""
        return max(self.query_lag_s.values()) if self.query_lag_s else None

    def caught_up(self, bound_s: float) -> bool:
        """True for a primary, and for a standby at most `bound_s` seconds of input behind its
        primary; a standby that has neither run a batch nor been idle yet is caught up only while
        the primary has not written anything either (a job that is just starting)."""
        if self.role == PRIMARY:
            return True
        lag = self.standby_lag_s
        if lag is None:
            return not self.client.exists(keys.watermarks(self.job, self.stage))
        return lag <= bound_s

    # -- promotion ----------------------------------------------------------------------------

    def promote(self) -> dict:
        """Take over as primary: fence the old primary, emit what it had not, then write directly.

        Returns a summary ({"epoch", "flushed"}). Raises PromotionError if the buffer dropped
        output that the primary had not written.
        """
        with self.lock:
            # A rollback before the hand-over: the demotion asked for is not carried out.
            self._pending_demotion = None
            if self.role == PRIMARY:
                return {"epoch": self.writer.epoch, "flushed": 0}
            epoch = self._acquire()  # from here on the old primary's writes are refused
            marks = self.client.hgetall(keys.watermarks(self.job, self.stage))
            for sink in list(self.buffer.lost_above):
                if self._keyed(sink) or self.buffer.gap(sink, marks.get(sink, "")):
                    raise PromotionError(f"standby buffer of {sink!r} dropped unwritten output")
            flushed = 0
            for sink in self.buffer.sinks():
                flushed += self._write(sink, self.buffer.drain(sink))
            self.role = PRIMARY
            if flushed:
                self.last_write_at = time.time()
            log.info(
                "promoted %s: epoch %s, flushed %s buffered records", self.stage, epoch, flushed
            )
            return {"epoch": epoch, "flushed": flushed}

    def demote_after_batch(self, then, compare: bool = False, comparable: bool = True) -> None:
        """Demote (`_demote`) right after this replica's next batch is written, so that its last
        write is the moment it hands over: the successor's first write follows it by the rest of
        one batch of the successor's, where a demotion at a random point between two writes
        added up to a trigger interval more to the output gap. `then(result)` runs once it is
        done (it tells the successor); `demote_if_overdue` demotes a replica that runs no batch
        (idle input) without waiting for one."""
        with self.lock:
            self._pending_demotion = PendingDemotion(then, compare, comparable, time.monotonic())

    def demote_if_overdue(self, wait_s: float) -> None:
        """Carry out a demotion asked for `wait_s` ago or longer that no batch has carried out."""
        pending = self._pending_demotion
        if pending is None or time.monotonic() - pending.asked_at < wait_s:
            return
        with self.lock:
            if self._pending_demotion is not pending:
                return  # a batch or a promotion got there first
            result = self._demote(pending.compare, pending.comparable)
        pending.then(result)

    def _demote(self, compare: bool, comparable: bool) -> dict:
        """Stop writing and buffer from now on, as a standby does: the primary of a stage being
        upgraded hands the output over to its successor (the green replica), which takes over by
        a newer fencing epoch once this one says it is a standby, and stays ready to take it back
        (a rollback is this replica's ordinary promotion). Called under the gate's lock, so it
        lands between two batches: every batch before it was written whole, every batch after
        it is buffered. With `compare` (an upgrade declared result-preserving) it checks its
        successor's results against its own from then on (`result_check`), where the stage
        writes results it can compare (`comparable`; else the check says it has none).
        Returns {"watermarks"}: where this replica's writes ended, per sink."""
        self._pending_demotion = None
        self.role = STANDBY
        self.handed_over = True
        self.result_check = ResultCheck(comparable=comparable) if compare else None
        if compare:
            # The successor's appended records are those after this replica's last one.
            last = self.client.xrevrange(keys.output_stream(self.job), "+", "-", 1)
            self._appended_since = last[0][0] if last else "0-0"
        marks = self.client.hgetall(keys.watermarks(self.job, self.stage))
        # Nothing of this replica is buffered yet: it is caught up by definition (its
        # queries' own lags replace this once they have buffered a batch).
        self.query_lag_s = {"demoted": 0.0}
        log.info("demoted %s: a standby from now on (watermarks %s)", self.stage, marks)
        return {"watermarks": marks}


# Keys compared per batch by the result check (a Redis round trip each), entries read per call.
COMPARE_CHUNK = 5000

# Spark (4.3) gives the Python process of a Python data source a fixed 10 s to connect back when
# a query starts (PythonWorkerFactory.createSimpleWorker, not a setting). On a saturated machine a
# fresh interpreter importing PySpark can take longer, and the query fails before its first batch.
CONNECT_BACK_FAILURE = "Python worker failed to connect back"
START_RETRIES = 3  # per process: a worker that never connects back is a real failure

# What the Python process of the streaming source imports as it starts: Spark's runner of a
# streaming Python data source (it imports pyarrow), and the source itself (unpickled in it).
WORKER_IMPORTS = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "spark_runtime.redis_source",
    "spark_runtime.kafka_source",
)
# A probe that takes longer than this says nothing (a starved machine, not a broken interpreter).
WORKER_PROBE_TIMEOUT_S = 60.0


def spark_python_path() -> list[str]:
    """The zips Spark puts first on its Python workers' path ($SPARK_HOME/python/lib/*.zip; a
    pip-installed PySpark is its own Spark home)."""
    import pyspark

    spark_home = env("SPARK_HOME", "") or os.path.dirname(pyspark.__file__)
    return sorted(glob.glob(os.path.join(spark_home, "python", "lib", "*.zip")))


def worker_start_failure(python: str, timeout_s: float = WORKER_PROBE_TIMEOUT_S) -> str | None:
    """Why Spark's Python workers cannot start with the interpreter `python`: what it prints
    when it imports what a streaming source's worker imports first (WORKER_IMPORTS), with the
    path Spark gives it; None when it can (or the probe took too long to tell).

    Spark reports such a worker only as one that did not connect back within 10 s (its
    traceback goes to the log, not into the query's exception), like a worker that was merely
    slow to start on a busy machine; this tells the two apart. The probe runs only after that
    failure: it costs an interpreter start (about a second of CPU), and a start that failed is
    not the time recovery is measured on.
    """
    pythonpath = [*spark_python_path(), os.environ.get("PYTHONPATH", "")]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}
    command = [python, "-c", "import " + ", ".join(WORKER_IMPORTS)]
    try:
        done = subprocess.run(
            command, env=environment, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return None
    except OSError as exc:  # no such interpreter, or not executable
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return None
    return done.stderr.strip() or f"{python} exited with code {done.returncode}"


class StageRuntime:
    """The queries of one stage in this Spark driver."""

    def __init__(
        self,
        spark,
        client,
        job: str,
        topology: Topology,
        stage: StageSpec,
        role: str,
        redis_url: str,
        checkpoint_dir: str,
        trigger_seconds: float = 0.5,
        max_records: int = 5000,
        buffer_max: int = 200_000,
        pace_key: str | None = None,
        replica: str | None = None,
        light_input_wait_s: float = 0.0,
    ):
        self.spark = spark
        # The replica id this runtime runs as (its Kafka lag is published under it); None: none.
        self.replica = replica
        self.job = job
        self.topology = topology
        self.stage = stage
        self.redis_url = redis_url
        self.checkpoint_dir = checkpoint_dir
        self.trigger_seconds = trigger_seconds
        self.max_records = max_records
        # The replica's batch pace key (keys.batch_pace), read by its sources; None: no pacing.
        self.pace_key = pace_key
        # How long its Redis sources may hold light input before a batch reads it (0: never).
        self.light_input_wait_s = light_input_wait_s
        # A standby of a stage with several queries buffers what its first query would write to
        # the stage's internal channel; its later queries read that channel as the primary
        # writes it (the same records, exactly once), and after a promotion as it writes it.
        # The job's Kafka source and sink, as recorded at launch (spark_runtime/external_io.py).
        self.io = external_io.load(client, job)
        final = any(out in (RESULTS_CHANNEL, OUT_CHANNEL) for out in stage.outputs)
        self.gate = OutputGate(
            client, job, stage.name, role, buffer_max, topology.job,
            kafka_sink=self.io.sink if final else None,
        )  # fmt: skip
        self.queries: list = []
        self.start_retries = 0
        # A user job's state partitions per query, as found or changed at the last start.
        self.state_partitions: dict[str, str] = {}

    def writes_comparable_results(self) -> bool:
        """Whether this stage writes results an upgrade's old version can compare with its
        successor's (spark_runtime/result_check.py): a results hash, or a user job's records
        appended once per key; not a channel to another stage or a stream without keys."""
        return any(
            segment.outputs[0] == RESULTS_CHANNEL
            or (segment.outputs[0] == OUT_CHANNEL and self.topology.job is not None)
            for segment in self.stage.segments
        )

    def query_name(self, index: int) -> str:
        """The Spark query name of segment `index` (reported in progress events)."""
        # The role is part of the name: a session may run a primary and a standby (tests).
        return f"{self.job}.{self.stage.name}.{self.gate.role}.{index}"

    def output_mode(self, segment: SegmentSpec) -> str:
        """The output mode of `segment`'s query: "update" when it holds a stateful operator
        (a user job's: "append" unless it upserts its results), else "append"."""
        if self.topology.job is not None:
            return user_plan.output_mode(self.topology.job)
        stateful = any(self.topology.operator(name).stateful for name in segment.operators)
        return "update" if stateful else "append"

    def start_settings(self, segment: SegmentSpec) -> dict[str, str]:
        """Session settings in force only while `segment`'s query starts (a query runs on a copy
        of the session taken then, so the session's own values stay for later queries on it:
        another stage sharing the session, as in the tests)."""
        settings = {}
        if self.topology.job is not None:
            # A user job's state partitions: its stateful operator's parallelism. A query
            # resumed from a checkpoint keeps the number it started with (Spark reads it from
            # the offset log), whatever this says.
            settings[SHUFFLE_PARTITIONS] = str(self.topology.job.parallelism)
        if self.gate.role != PRIMARY and self.output_mode(segment) == "update":
            # A standby skips the batches without new input that Spark runs after each batch
            # that moved the watermark. In update mode they only drop expired state (no
            # topology's state function emits on a timeout), which the next batch with input
            # does as well; a paced standby reads input every third trigger, so they were over
            # a third of its batches (topn: 39 of 91 in 90 s). A promoted standby keeps this
            # until its queries restart: expired state then waits for the next input.
            settings[NO_DATA_BATCHES] = "false"
        return settings

    def _build(self, index: int, segment: SegmentSpec):
        user_job = self.topology.job
        if user_job is not None:
            fields = user_plan.input_fields_spec(user_job)
        else:
            plans = segment_plans(self.topology, segment.operators)
            fields = plans[0][0].input_fields
        (channel,) = segment.inputs
        reader = self._reader(channel, fields)
        # Only a standby is ever paced: a primary's triggers need not ask (a query rebuilt after
        # a promotion, e.g. for new state-store settings, is built as a primary's).
        if self.pace_key is not None and self.gate.role != PRIMARY:
            reader = reader.option("paceKey", self.pace_key)
        df = reader.load()
        checkpoint = os.path.join(self.checkpoint_dir, str(index))
        if user_job is not None:
            df = user_plan.user_input(df, user_job)
            df = user_plan.apply_operators(df, user_job, segment.operators)
        else:
            for plan, operators in plans:
                df = plan.build(df, *operators)
        mode = self.output_mode(segment)

        name = self.query_name(index)

        def on_batch(batch_df, batch_id):
            batch = None
            if user_job is not None:
                batch = user_plan.batch_version(checkpoint, batch_id, self._plan_ms)
            self.gate.handle_batch(segment, self.topology, batch_df, batch_id, name, batch)

        return (
            df.writeStream.queryName(name)
            .outputMode(mode)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{self.trigger_seconds} seconds")
            .foreachBatch(on_batch)
        )

    def _plan_ms(self, index: int) -> int:
        """When plan `index` of the job's Kafka input was made (a user job's batch versions)."""
        return kafka_audit.plan_at(self.gate.client, self.job, index).ms

    def _reader(self, channel: str, fields: str):
        """The stream reader of `channel`: the job's Kafka topic for its input when it has one,
        else the channel's Redis stream."""
        source = self.io.source
        if channel == INPUT_CHANNEL and source is not None:
            bound = source.max_records_per_trigger or self.max_records
            reader = (
                self.spark.readStream.format(KAFKA_FORMAT)
                .option("bootstrapServers", source.bootstrap)
                .option("topic", source.topic)
                .option("fields", fields)
                .option("redisUrl", self.redis_url)
                .option("job", self.job)
                .option("stage", self.stage.name)
                .option("startingOffsets", source.starting_offsets)
                .option("eventTime", source.event_time)
                .option("maxRecordsPerTrigger", str(bound))
                .option("acceptLoss", str(source.accept_loss).lower())
                .option("deadLetterTopic", source.dead_letter_topic)
            )
            if self.replica is not None:
                reader = reader.option("replica", self.replica)
            return reader
        return (
            self.spark.readStream.format(FORMAT_NAME)
            .option("stream", channel_key(self.job, channel))
            .option("fields", fields)
            .option("redisUrl", self.redis_url)
            .option("job", self.job)
            .option("stage", self.stage.name)
            .option("maxRecordsPerBatch", str(self.max_records))
            .option("lightInputWaitS", str(self.light_input_wait_s))
        )

    def start(self) -> None:
        """Start (or resume from the checkpoints) every segment's query."""
        for index, segment in enumerate(self.stage.segments):
            query_dir = os.path.join(self.checkpoint_dir, str(index))
            # A predecessor killed mid-write may have left temp files Spark would refuse.
            remove_orphan_temp_files(query_dir)
            if self.topology.job is not None:
                # A new version with another parallelism, on a checkpoint of the version
                # before (spark_runtime/state_partitions.py).
                found = match_partitions(self.spark, query_dir, self.topology.job.parallelism)
                if found is not None:
                    self.state_partitions[str(index)] = found
            with session_settings(self.spark, self.start_settings(segment)):
                self.queries.append(self._build(index, segment).start())
            log.info("stage %s: query %s started", self.stage.name, self.query_name(index))

    def stop(self) -> None:
        """Stop every query (a running batch is interrupted; it is replayed on the next start)."""
        for query in self.queries:
            query.stop()
        self.queries = []

    def apply_confs(self, confs: dict[str, str]) -> bool:
        """Set session settings for the queries; returns True if running queries restarted.

        A query runs on a copy of the session taken when it starts, so a setting changed on a
        running stage reaches its queries only through a restart from their checkpoints; nothing
        restarts when every value is already in force.
        """
        changed = {k: v for k, v in confs.items() if self.spark.conf.get(k, None) != v}
        for key, value in changed.items():
            self.spark.conf.set(key, value)
        if not changed or not self.queries:
            return False
        self.stop()
        self.start()
        return True

    def restart(self, trigger_seconds: float) -> None:
        """Restart the queries from their checkpoints with another trigger interval."""
        self.stop()
        self.trigger_seconds = trigger_seconds
        self.start()

    def query_name_by_id(self, query_id: str) -> str | None:
        """The name of this stage's running query with id `query_id` (listener events carry ids)."""
        for query in self.queries:
            if str(query.id) == query_id:
                return query.name
        return None

    def failure(self) -> BaseException | None:
        """The exception of the first query that died, if any."""
        for query in self.queries:
            if not query.isActive:
                return query.exception() or RuntimeError(f"query {query.name} stopped")
        return None

    def retry_failed_start(self, failure: BaseException) -> bool:
        """Start the queries again from their checkpoints when `failure` (what `failure()`
        returned) is only Spark's Python worker not connecting back in time
        (CONNECT_BACK_FAILURE), at most START_RETRIES times; returns whether it did.

        Cheaper than having the controller restart the replica (the JVM and the session are
        warm, the worker's files cached) and as exact: a restart from the checkpoints replays
        what was not committed, and the sinks are idempotent.
        """
        if CONNECT_BACK_FAILURE not in str(failure):
            return False
        if self.start_retries >= START_RETRIES:
            return False
        self.start_retries += 1
        log.warning(
            "stage %s: a query failed to start (%s); starting the queries again (%d of %d)",
            self.stage.name, CONNECT_BACK_FAILURE, self.start_retries, START_RETRIES,
        )  # fmt: skip
        self.stop()
        self.start()
        return True

    def process_all_available(self, rounds: int = 3) -> None:
        """Run the queries until their inputs are drained (tests). Later segments read what
        earlier ones wrote, so a few rounds are needed for multi-segment stages."""
        for _ in range(rounds):
            for query in self.queries:
                query.processAllAvailable()
