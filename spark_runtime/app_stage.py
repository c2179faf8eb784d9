"""An existing app (spark_runtime/apps.py) running inside a stage process.

The stage process builds the SparkSession with Backstop's settings first (master, JVM options,
class-data archive) and registers its progress listener, so the app's own
`SparkSession.builder.getOrCreate()` returns that session. Then the app's registered source runs
as `__main__` in a thread of its own, with the job's `args` as its `sys.argv[1:]`: the app blocks
in `awaitTermination()` as it does anywhere, while the stage's main thread heartbeats, obeys
commands and watches the queries (spark_runtime/stage.py, `supervise_app`).

Checkpoints: a query the app starts without a checkpoint location gets one under the replica's
checkpoint directory, named after the query (`queryName`), else after its place among the
queries the app started (`query-1`, `query-2`, ...): a restarted app starts its queries in the
same order and resumes each from its own checkpoint. An app that sets its own location keeps it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import threading
import traceback

from spark_runtime import keys
from spark_runtime.app_plan import stateful_operators
from spark_runtime.apps import AppDefinition
from spark_runtime.listener import JsonProgressListener
from spark_runtime.progress import ProgressRecord, publish_progress

CHECKPOINT_OPTION = "checkpointlocation"  # Spark reads option keys case-insensitively
# How long a stopped app may take to return from its awaitTermination and end.
APP_STOP_WAIT_S = 10.0

log = logging.getLogger(__name__)


def query_checkpoint_name(name: str | None, index: int) -> str:
    """The directory of a query's default checkpoint: its name (as a safe file name), else its
    place among the queries the app started."""
    if name:
        return "query-" + re.sub(r"[^\w.-]", "_", name)[:100]
    return f"query-{index}"


def install_checkpoint_defaults(root: str) -> None:
    """Give every streaming query started in this process without a checkpoint location one
    under `root` (see the module doc). Wraps DataStreamWriter's methods that can set the
    location or the query's name, then `start` and `toTable` add the default."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    if getattr(DataStreamWriter, "_backstop_checkpoint_root", None) is not None:
        DataStreamWriter._backstop_checkpoint_root = root
        return
    DataStreamWriter._backstop_checkpoint_root = root
    started = itertools.count(1)
    option, options, query_name = (
        DataStreamWriter.option,
        DataStreamWriter.options,
        DataStreamWriter.queryName,
    )
    start, to_table = DataStreamWriter.start, DataStreamWriter.toTable

    def note(writer, keys, name=None) -> None:
        if any(str(k).lower() == CHECKPOINT_OPTION for k in keys):
            writer._backstop_own_checkpoint = True
        if name:
            writer._backstop_query_name = name

    def with_default(writer, kwargs) -> None:
        note(writer, kwargs, kwargs.get("queryName"))
        index = next(started)
        if not getattr(writer, "_backstop_own_checkpoint", False):
            name = query_checkpoint_name(getattr(writer, "_backstop_query_name", None), index)
            path = os.path.join(DataStreamWriter._backstop_checkpoint_root, name)
            option(writer, "checkpointLocation", path)

    def option_(self, key, value):
        note(self, [key])
        return option(self, key, value)

    def options_(self, **kwargs):
        note(self, kwargs)
        return options(self, **kwargs)

    def query_name_(self, queryName):  # noqa: N803 - PySpark's parameter name
        note(self, [], queryName)
        return query_name(self, queryName)

    def start_(self, *args, **kwargs):
        with_default(self, kwargs)
        return start(self, *args, **kwargs)

    def to_table_(self, *args, **kwargs):
        with_default(self, kwargs)
        return to_table(self, *args, **kwargs)

    DataStreamWriter.option = option_
    DataStreamWriter.options = options_
    DataStreamWriter.queryName = query_name_
    DataStreamWriter.start = start_
    DataStreamWriter.toTable = to_table_


def make_app_listener(client, job: str, replica: str, stage: str, node: str, run, on_batch):
    """A listener publishing every progress event of the app's queries to the job's progress
    stream (the job page's rates, batch durations and state rows), as a primary's final
    output, and telling `run` (an AppRun) which queries started and which ended with an error;
    `on_batch()` counts the batch for the replica's heartbeat."""

    class AppProgressPublisher(JsonProgressListener):
        def onQueryStarted(self, event):
            run.query_started(str(event.id), event.name)

        def onQueryIdle(self, event):
            return None

        def onQueryTerminated(self, event):
            run.query_ended(str(event.id), event.exception)

        def onQueryProgress(self, event):
            on_batch()
            progress = event.progress
            run.batch_done(str(progress.id))
            sink_rows = progress.sink.numOutputRows if progress.sink is not None else -1
            # foreachBatch and some sinks report no count (-1): the batch's input stands in.
            written = sink_rows if sink_rows >= 0 else progress.numInputRows
            record = ProgressRecord.of_batch(
                progress,
                replica=replica,
                stage=stage,
                role="primary",
                node=node,
                query=run.query_name(str(progress.id), progress.name),
                segment="0",
                rows_out=written,
                written=written,
                final=True,
                buffered=0,
            )
            publish_progress(client, job, record)

    return AppProgressPublisher()


class QueryPlans:
    """Publishes the stateful operators of each of the app's queries once, after the query's
    first batch (when its physical plan exists): keys.app_operators, query name -> JSON list
    (spark_runtime/app_plan.py)."""

    def __init__(self, client, job: str, run: AppRun):
        self.client, self.job, self.run = client, job, run
        self.described: set[str] = set()

    def publish_new(self) -> None:
        """Read and publish the plan of every running query not described yet."""
        from py4j.protocol import Py4JError

        for query in self.run.queries():
            try:
                query_id = str(query.id)
                if query_id in self.described:
                    continue
                if query.lastProgress is None:
                    continue  # no batch yet: no physical plan
                plan = query._jsq.explainInternal(False)
                name = self.run.query_name(query_id, query.name)
            except Py4JError as exc:  # the query ended meanwhile: the next look describes it
                log.info("no plan of a query yet: %s", exc)
                continue
            found = stateful_operators(plan, name)
            self.client.hset(
                keys.app_operators(self.job), name, json.dumps([op.to_dict() for op in found])
            )
            self.described.add(query_id)
            log.info("query %s: stateful operators %s", name, [op.name for op in found])


class AppRun:
    """The app's script running in a thread of this process, on `spark`."""

    def __init__(self, spark, app: AppDefinition, args: list[str]):
        self.spark = spark
        self.app = app
        self.args = list(args)
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.stopping = False
        self.names: dict[str, str] = {}  # query id -> name, of every query the app started
        self.failed: list[tuple[str, str]] = []  # (query name, error) of queries that failed
        self.batches: dict[str, int] = {}  # query id -> batches it completed in this process
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="app", daemon=True)

    def start(self) -> None:
        """Run the app's script (returns at once)."""
        self.thread.start()

    def _run(self) -> None:
        sys.argv = [self.app.path, *self.args]
        scope = {"__name__": "__main__", "__file__": self.app.path}
        try:
            # The JVM keeps the active session per thread, and this thread's JVM twin has none:
            # without it Spark's lookups that ask for it (a Python data source by name, as
            # kafka_compat's) fail in the app where they work in a script's main thread.
            self.spark._jvm.SparkSession.setActiveSession(self.spark._jsparkSession)
            # Compiled under the app's own path, so that tracebacks name its file and lines.
            exec(compile(self.app.source, self.app.path, "exec"), scope)  # noqa: S102
        except SystemExit as exc:
            if exc.code not in (None, 0):
                self.error = exc
        except BaseException as exc:  # noqa: BLE001 - whatever the app raises is its failure
            self.error = exc
        finally:
            self.finished.set()

    def queries(self) -> list:
        """The app's queries still running."""
        return list(self.spark.streams.active)

    def app_failure(self) -> str | None:
        """`PATH line N: Error: message` for an exception the app raised (its innermost line in
        the app's file), None while it runs or after it returned."""
        if self.error is None:
            return None
        error = self.error
        frames = [
            f for f in traceback.extract_tb(error.__traceback__) if f.filename == self.app.path
        ]
        where = f"{self.app.path} line {frames[-1].lineno}" if frames else self.app.path
        if isinstance(error, SystemExit):
            return f"{where}: the app exited with status {error.code}"
        message = "".join(traceback.format_exception_only(error)).strip().splitlines()
        return f"{where}: {message[-1] if message else type(error).__name__}"

    def error_text(self) -> str:
        """The app's traceback (for the log), empty if it raised nothing."""
        if self.error is None:
            return ""
        return "".join(traceback.format_exception(self.error))

    def query_started(self, query_id: str, name: str | None) -> None:
        """A query of the app started (the listener's call)."""
        with self.lock:
            self.names[query_id] = name or f"query-{len(self.names) + 1}"

    def query_name(self, query_id: str, name: str | None = None) -> str:
        """A query's name on the job page: its own, else `query-N` by its place among the
        queries the app started (its default checkpoint's name), else its id."""
        if name:
            return name
        with self.lock:
            return self.names.get(query_id, query_id)

    def query_ended(self, query_id: str, error: str | None) -> None:
        """A query of the app ended, with Spark's error if it failed (the listener's call)."""
        if error:
            with self.lock:
                self.failed.append((self.names.get(query_id, query_id), error))

    def batch_done(self, query_id: str) -> None:
        """A query of the app completed a batch (the listener's call)."""
        with self.lock:
            self.batches[query_id] = self.batches.get(query_id, 0) + 1

    def batches_by_query(self) -> dict[str, int]:
        """The batches each query the app started has completed, by query name: what an
        upgrade's validation waits for (spark_runtime/upgrade.py, `app_tick`)."""
        with self.lock:
            return {name: self.batches.get(query, 0) for query, name in self.names.items()}

    @property
    def started_queries(self) -> int:
        """How many queries the app has started so far."""
        with self.lock:
            return len(self.names)

    def query_failure(self) -> tuple[str, str] | None:
        """(query name, Spark's error) of the first query that failed, if one did."""
        with self.lock:
            return self.failed[0] if self.failed else None

    def stop(self) -> None:
        """Stop the app's queries (each writes what it has committed), then let the app return
        from its awaitTermination; its thread is a daemon, so a stuck one does not keep the
        process."""
        self.stopping = True
        for query in self.queries():
            query.stop()
        self.finished.wait(APP_STOP_WAIT_S)
