"""A strategy benchmark run on Kafka (`manage.py bench --source kafka`): the run's topics and the
audit of its output topic.

Each run's job reads an input topic of its own, which its generator feeds, and writes its
results to an output topic of its own (spark_runtime/kafka_sink.py: one transaction per batch).
The audit reads both topics back with a `read_committed` consumer (spark_runtime/kafka_read.py)
and compares, in plain Python, what a reader of the output topic sees with the reference
computed from the input topic, by the same functions the Redis runs are checked with
(console/policy/truth.py, spark_runtime/user_plan.py):

- a result key (a word, a window, a user job's key) holds the value of its newest version on the
  topic; for wordcount and topn these are compared cell by cell with the input's counts
  (`truth.compare`: a count short is lost, a count over is duplicated), for a user job that
  upserts key by key (`truth.compare_records`: a key missing is lost, a value that differs is a
  wrong cell);
- a (result key, version) pair read more than once is a duplicate: the same result delivered
  twice to the topic's readers, which the newest value alone would hide;
- a user job that appends keeps every record: a key appended twice is a duplicate
  (`truth.compare_records`), as on its Redis output stream.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from console.policy import truth
from spark_runtime import user_plan
from spark_runtime.external_io import EVENT_TIME_FROM_RECORD, TOPIC_CHARS
from spark_runtime.jobdef import Upsert, resolve_topology
from spark_runtime.kafka_audit import record_fields
from spark_runtime.kafka_read import committed_reader, read_topic

# Where a run's input comes from (and its results go to, besides Redis), and its trigger.
SOURCES = ("redis", "kafka")
TRIGGERS = ("microbatch", "realtime")
READ_TIMEOUT_S = 30.0


def run_topics(topology: str, strategy: str, stamp: str) -> tuple[str, str]:
    """The input and output topics of one run: `bench.{topology}.{strategy}.{stamp}.in` and
    `.out` (a registered job's `@` and anything else a topic name cannot hold become `-`)."""
    base = "".join(c if c in TOPIC_CHARS else "-" for c in f"bench.{topology}.{strategy}.{stamp}")
    return f"{base}.in", f"{base}.out"


def read_committed(bootstrap: str, topic: str, timeout_s: float = READ_TIMEOUT_S) -> list:
    """Every committed record of `topic`, partition by partition in offset order, up to each
    partition's end when read (records of a transaction still open are not read yet)."""
    consumer = committed_reader(bootstrap, "backstop-bench-audit")
    try:
        return read_topic(consumer, topic, timeout_s)
    finally:
        consumer.close()


def input_entries(messages: list, event_time: str = EVENT_TIME_FROM_RECORD) -> list[tuple]:
    """The input topic's records as the (entry id, fields) pairs the reference functions take:
    fields as a Redis entry would carry them (spark_runtime.kafka_audit.record_fields: a value
    that is not a JSON object gives no fields, so it is left out like a dead letter)."""
    return [
        (f"{msg.partition()}-{msg.offset()}", record_fields(msg, msg.partition(), event_time))
        for msg in messages
    ]


@dataclass
class OutputTopic:
    """What a reader of a run's output topic sees. `newest`: each result key's value at its
    newest version (hash results: wordcount, topn, a user job that upserts); `appended`: each
    appended record's fields per key (a user job that appends); `repeated`: (key, version)
    pairs read more than once, each extra reading counted."""

    records: int = 0
    newest: dict[str, str] = field(default_factory=dict)
    appended: dict[str, list[dict]] = field(default_factory=dict)
    repeated: int = 0


def read_output(messages: list, appends: bool = False) -> OutputTopic:
    """The output topic's records (values `{"key", "value", "version"}` for hash results, `{"key",
    columns..., "version"}` for appended ones: spark_runtime.kafka_sink.record_of)."""
    output = OutputTopic(records=len(messages))
    seen: Counter = Counter()
    versions: dict[str, str] = {}
    for msg in messages:
        record = json.loads(msg.value())
        key, version = record.pop(user_plan.KEY_FIELD), record.pop("version")
        seen[(key, version)] += 1
        if appends:
            output.appended.setdefault(key, []).append(record)
        elif key not in versions or version > versions[key]:  # versions compare as strings
            versions[key] = version
            output.newest[key] = record["value"]
    output.repeated = sum(n - 1 for n in seen.values() if n > 1)
    return output


@dataclass(frozen=True)
class TopicAudit:
    """A run's output topic against the reference from its input topic. `comparison`: lost and
    duplicated results as the Redis runs count them, with repeated (key, version) readings
    among the duplicates; `expected`: the reference; `actual`: the results a reader holds."""

    comparison: truth.Comparison
    input_records: int
    output_records: int
    repeated: int
    expected: dict
    actual: dict


def audit(topology: str, params: dict, input_messages: list, output_messages: list) -> TopicAudit:
    """Compare the output topic's records with the reference computed from the input topic's
    (`topology`: wordcount, topn, or a registered user job with a reference function;
    `params`: the topology's operator params, as bench.strategy.harness.topology_params)."""
    entries = input_entries(input_messages)
    definition = resolve_topology(topology).job
    appends = definition is not None and not isinstance(definition.output, Upsert)
    output = read_output(output_messages, appends=appends)
    if definition is not None:
        expected = user_plan.expected_results(definition, entries)
        actual = output.appended if appends else user_plan.upserted_results(output.newest)
        comparison = truth.compare_records(expected, actual)
    else:
        valid = truth.valid_entries(topology, entries)
        expected = truth.expected_cells(topology, [fields for _, fields in valid], params)
        actual = truth.result_cells(topology, output.newest)
        comparison = truth.compare(expected, actual)
    # An appended key read twice is already a duplicate of compare_records.
    repeated = 0 if appends else output.repeated
    comparison = truth.Comparison(
        comparison.lost, comparison.duplicates + repeated, comparison.cells, comparison.wrong_cells
    )
    return TopicAudit(
        comparison, len(input_messages), output.records, output.repeated, expected, actual
    )


def audit_topics(
    bootstrap: str, topology: str, params: dict, input_topic: str, output_topic: str
) -> TopicAudit:
    """`audit` of the two topics as they are now (the output read first: everything it holds
    derives from input already written)."""
    output = read_committed(bootstrap, output_topic)
    return audit(topology, params, read_committed(bootstrap, input_topic), output)
