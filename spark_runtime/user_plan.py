"""The Spark side of user jobs (spark_runtime/jobdef.py): the provenance Backstop adds around the
user's functions, and the dry run that registration runs.

Exactly-once without the user's help: a user function does not keep Backstop's input offset on
its rows, and a primary and its standby cut the input into different micro-batches. So every
output row of a batch gets the batch's *end offset* as its version (read from the query's offset
log, which Spark writes before the batch runs and reuses when it replays it):

- `Upsert`: the row is the key's value after all input up to that offset, so a newer version
  replaces an older one and a replayed batch rewrites the same values (no-ops);
- `Append`: each key is written once (a set of written keys next to the stream), so a replay or
  a standby's flush after a promotion writes only what is missing.

The sink's watermark moves to the batch's version only once the whole batch is written
(`FencedWriter` with `batch_watermark`): a standby forgets buffered rows below it, which is only
right if everything derived from that input is in Redis.

    python -m spark_runtime.user_plan check package.module:attribute [--jobs-dir DIR]

prints a JSON report (`errors`, `output_mode`, `columns` and the job's shape) of the contract
check and the dry run, and exits 1 when there are errors. Registration runs it in a child
process: a module not yet checked (it may fail to import, hang or exit) and the dry run's
SparkSession stay out of the web server. Once registered, the web server and the controller
import the module's snapshot to read its operators (its top level runs there); its functions run
only in the stage processes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable

from spark_runtime import keys
from spark_runtime.jobdef import (
    EVENT_TIME_COLUMN,
    ID_COLUMN,
    JobDefinition,
    JobDefinitionError,
    Upsert,
    load_definition,
)
from spark_runtime.kafka_plan import SEQ_FACTOR, offset_plan_index
from spark_runtime.kafka_plan import position as kafka_position
from spark_runtime.redis_source import entry_pos, parse_fields, validate
from spark_runtime.sink import HashRow, StreamRecord, version
from spark_runtime.topology import OUT_CHANNEL, RESULTS_CHANNEL, STATEFUL_KINDS

KEY_FIELD = "key"  # the field of an appended record holding its key text


def input_fields_spec(definition: JobDefinition) -> str:
    """The `fields` option of the Redis stream source for the job's input."""
    return ",".join(f"{name}:{kind}" for name, kind in definition.input_fields.items())


def output_mode(definition: JobDefinition) -> str:
    """`update` for an upserting job with a stateful operator, else `append` (an appending job
    emits only final rows: Spark needs a watermark to know when an aggregate is final)."""
    stateful = any(op.kind in STATEFUL_KINDS for op in definition.operators)
    return "update" if stateful and isinstance(definition.output, Upsert) else "append"


def user_input(df, definition: JobDefinition):
    """The source rows as the first user function sees them: `id`, `event_time` and the
    declared fields (Backstop's offset columns stay out of the user's way)."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("id").alias(ID_COLUMN),
        F.timestamp_millis(F.col("ts")).alias(EVENT_TIME_COLUMN),
        *definition.input_fields,
    )


def apply_operators(df, definition: JobDefinition, operators) -> object:
    """Run the user functions of `operators` (names, in chain order) on `df`."""
    by_name = {op.name: op for op in definition.operators}
    for name in operators:
        df = by_name[name].function(df)
    return df


def batch_version(
    checkpoint: str, batch_id: int, plan_ms: Callable[[int], int] | None = None
) -> str:
    """The version of every output of batch `batch_id`: its end offset in the query's offset log
    (`<checkpoint>/offsets/<batch>`: a version line, the batch metadata, then one line per
    source with its end offset: `{"id": "<ms>-<seq>"}` for a Redis stream).

    A Kafka input's offset is a plan of the job's shared plan log (`{"plan": i, "end": {...}}`,
    spark_runtime/kafka_plan.py), whose records have positions `ms * SEQ_FACTOR + ordinal`
    (`ms`: the plan's creation time, `plan_ms(i)`; ordinals below SEQ_FACTOR). The batch's
    version is then the highest position plan `i` can hold: at or above each of its records',
    below every later plan's (their `ms` is larger)."""
    with open(os.path.join(checkpoint, "offsets", str(batch_id))) as handle:
        lines = handle.read().splitlines()
    offset = json.loads(lines[2])
    if "id" in offset:
        return version(entry_pos(offset["id"]))
    if plan_ms is None:
        raise ValueError(f"batch {batch_id} ends at a Kafka plan and no plan log was given")
    return version(kafka_position(plan_ms(offset_plan_index(offset)), SEQ_FACTOR - 1))


def plain(value):
    """A JSON-ready copy of a result value: timestamps as ISO 8601 in UTC to the millisecond
    (`2026-11-23T10:00:00.000Z`; event times are epoch ms), structs as objects."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        value = value.astimezone(dt.UTC)
        return f"{value:%Y-%m-%dT%H:%M:%S}.{value.microsecond // 1000:03d}Z"
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def text(value) -> str:
    """How a key column reads in a key text."""
    value = plain(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def key_text(row: dict, key: tuple[str, ...]) -> str:
    """The hash field (Upsert) or record key (Append) of a result row: key columns joined by |."""
    return "|".join(text(row[column]) for column in key)


def result_value(row: dict, key: tuple[str, ...]) -> dict:
    """The non-key columns of a result row, JSON-ready."""
    return {column: plain(value) for column, value in row.items() if column not in key}


def to_records(definition: JobDefinition, rows: list[dict], batch: str) -> list[tuple[str, object]]:
    """Sink records of one batch's result rows, all with the batch's version."""
    key = tuple(definition.output.key)
    if isinstance(definition.output, Upsert):
        return [
            (
                RESULTS_CHANNEL,
                HashRow(
                    batch, key_text(row, key), json.dumps(result_value(row, key), sort_keys=True)
                ),
            )
            for row in rows
        ]
    records = []
    for row in rows:
        fields = {KEY_FIELD: key_text(row, key)}
        fields.update({c: text(v) for c, v in result_value(row, key).items()})
        records.append((OUT_CHANNEL, StreamRecord(batch, fields)))
    return records


# --- ground truth -----------------------------------------------------------------------------


def reference_rows(definition: JobDefinition, entries: list[tuple[str, dict]]) -> list[dict]:
    """The input rows a user job sees, in plain Python, from `(entry id, fields)` pairs of its input
    stream; malformed entries are left out (they go to the dead-letter stream)."""
    fields = parse_fields(input_fields_spec(definition))
    rows = []
    for entry_id, raw in entries:
        row, reason = validate(entry_id, raw, fields)
        if reason is not None:
            continue
        values = dict(zip((name for name, _ in fields), row[4:], strict=True))
        millis = row[3]
        event_time = dt.datetime.fromtimestamp(millis // 1000, tz=dt.UTC).replace(
            microsecond=millis % 1000 * 1000
        )
        rows.append({ID_COLUMN: row[2], EVENT_TIME_COLUMN: event_time, **values})
    return rows


def expected_results(definition: JobDefinition, entries: list[tuple[str, dict]]) -> dict[str, dict]:
    """The job's `reference` applied to its input, keyed and valued like the real results (see
    `actual_results`). The reference keys its results by the key columns' values (a tuple when
    the key has several columns) and may use Python values (datetimes, numbers)."""
    if definition.reference is None:
        raise ValueError(f"job {definition.name!r} has no reference function")
    expected = {}
    for key, value in definition.reference(reference_rows(definition, entries)).items():
        parts = key if isinstance(key, tuple) else (key,)
        field = "|".join(text(part) for part in parts)
        if isinstance(definition.output, Upsert):
            expected[field] = plain(value)
        else:
            expected[field] = {column: text(v) for column, v in value.items()}
    return expected


def upserted_results(values: dict[str, str]) -> dict[str, list[dict]]:
    """The results hash of an upserting job (field -> JSON value) as `actual_results` gives it."""
    return {field: [json.loads(value)] for field, value in values.items()}


def actual_results(definition: JobDefinition, client, job: str) -> dict[str, list[dict]]:
    """What the job wrote, as `{key text: [value, ...]}` (one value per key for Upsert; for
    Append one per appended record, so duplicates show)."""
    if isinstance(definition.output, Upsert):
        return upserted_results(client.hgetall(keys.results(job)))
    written: dict[str, list[dict]] = {}
    for _, fields in client.xrange(keys.output_stream(job)):
        fields = dict(fields)
        written.setdefault(fields.pop(KEY_FIELD), []).append(fields)
    return written


# --- dry run ----------------------------------------------------------------------------------

EMPTY_FORMAT = "backstop_empty"


def _empty_source():
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader

    class EmptyReader(DataSourceStreamReader):
        def initialOffset(self):
            return {"n": 0}

        def latestOffset(self, start=None, limit=None):
            return {"n": 0}

        def partitions(self, start, end):
            return []

        def read(self, partition):
            return iter(())

    class EmptySource(DataSource):
        """A stream with the declared schema and no rows: the dry run's input."""

        @classmethod
        def name(cls):
            return EMPTY_FORMAT

        def schema(self):
            return self.options["schema"]

        def streamReader(self, schema):
            return EmptyReader()

    return EmptySource


SPARK_TYPES = {"string": "string", "int": "bigint", "double": "double"}


def dry_run(spark, definition: JobDefinition, checkpoint: str) -> dict:
    """Compile the job against an empty stream of its declared schema and start the query for a
    moment (Spark checks output modes, watermarks and unsupported operations when a query
    starts). Returns a report with `errors` naming the operator at fault."""
    spark.dataSource.register(_empty_source())
    schema = ", ".join(
        [f"{ID_COLUMN} string", f"{EVENT_TIME_COLUMN} timestamp"]
        + [f"{name} {SPARK_TYPES[kind]}" for name, kind in definition.input_fields.items()]
    )
    df = spark.readStream.format(EMPTY_FORMAT).option("schema", schema).load()
    report = {"errors": [], "output_mode": output_mode(definition), "columns": []}
    for op in definition.processing_operators():
        try:
            result = op.function(df)
            # Reading the schema analyses the plan: unknown columns, wrong types.
            columns = result.columns if hasattr(result, "writeStream") else None
        except Exception as exc:  # noqa: BLE001 - any failure of user code is reported as such
            report["errors"].append(f"operator {op.name!r}: {_first_line(exc)}")
            return report
        if columns is None:
            report["errors"].append(
                f"operator {op.name!r}: returned {type(result).__name__}, not a DataFrame"
            )
            return report
        df = result
    report["columns"] = list(df.columns)
    missing = [k for k in definition.output.key if k not in df.columns]
    if missing:
        last = definition.processing_operators()[-1].name
        report["errors"].append(
            f"output: key columns {missing} are not in the output of operator {last!r} "
            f"(columns: {df.columns})"
        )
        return report
    try:
        query = (
            df.writeStream.format("noop")
            .outputMode(report["output_mode"])
            .option("checkpointLocation", checkpoint)
            .start()
        )
        query.stop()
    except Exception as exc:  # noqa: BLE001 - Spark's analysis errors come in several types
        stateful = [op.name for op in definition.operators if op.kind in STATEFUL_KINDS]
        blamed = stateful[0] if stateful else definition.processing_operators()[-1].name
        report["errors"].append(
            f"operator {blamed!r}: Spark refuses the streaming query in "
            f"{report['output_mode']} mode: {_first_line(exc)}"
        )
    return report


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]


def check(ref: str, jobs_directory: str | None = None) -> dict:
    """The registration check of `ref`: the contract, then the dry run on a local session."""
    import tempfile
    from pathlib import Path

    directory = Path(jobs_directory) if jobs_directory else None
    try:
        definition = load_definition(ref, directory)
    except JobDefinitionError as exc:
        return {"errors": exc.errors}
    except Exception as exc:  # noqa: BLE001 - importing user code may raise anything
        return {"errors": [f"module {ref.partition(':')[0]!r}: {_first_line(exc)}"]}
    from spark_runtime.config import build_session

    spark = build_session("backstop-dry-run", {"spark.master": "local[1]"})
    try:
        with tempfile.TemporaryDirectory(prefix="backstop-dry-run-") as tmp:
            report = dry_run(spark, definition, tmp)
    finally:
        # Stopped here, the JVM ends with this process. Left to the JVM's shutdown hook, it
        # outlived the check as an orphan for about a minute on a busy machine (580 MB,
        # seen in a soak's first sample after registering its user job).
        spark.stop()
    report.update(
        name=definition.name,
        description=definition.description,
        output={
            "kind": type(definition.output).__name__.lower(),
            "key": list(definition.output.key),
        },
        operators=[
            {
                "name": op.name,
                "kind": op.kind,
                "upstream": list(op.upstream),
                "parallelism": op.parallelism,
            }
            for op in definition.operators
        ],
        input_fields=dict(definition.input_fields),
        has_generator=definition.generate is not None,
        has_reference=definition.reference is not None,
    )
    return report


def main(argv: list[str] | None = None) -> int:
    """`check REF`: print the registration report as JSON; exit 1 if it has errors."""
    parser = argparse.ArgumentParser(prog="python -m spark_runtime.user_plan")
    parser.add_argument("command", choices=("check",))
    parser.add_argument("ref", help="package.module:attribute inside the jobs directory")
    parser.add_argument("--jobs-dir", default=None)
    args = parser.parse_args(argv)
    report = check(args.ref, args.jobs_dir)
    # The report is the last line of stdout: Spark may print its own lines before it.
    print(json.dumps(report))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
