"""The options and offset arithmetic of Spark's `format("kafka")` as Backstop serves it
(spark_runtime/kafka_compat.py), without a broker: what an app may ask for, what is refused by
name, and where each micro-batch starts and ends."""

from __future__ import annotations

import pytest

from spark_runtime.kafka_compat import (
    KafkaOptionError,
    ReaderOptions,
    WriterOptions,
    next_end,
    offset_ranges,
    starting_offsets,
)

BOOTSTRAP = {"kafka.bootstrap.servers": "b:9092"}


def test_a_reader_takes_spark_s_options_and_the_client_settings():
    options = ReaderOptions.parse(
        {**BOOTSTRAP, "subscribe": "a, b", "startingOffsets": "earliest",
         "maxOffsetsPerTrigger": "40", "failOnDataLoss": "false",
         "kafka.security.protocol": "PLAINTEXT", "kafka.isolation.level": "read_committed"}
    )  # fmt: skip
    assert options.topics == ("a", "b")
    assert (options.starting, options.max_offsets, options.fail_on_data_loss) == (
        "earliest",
        40,
        False,
    )
    assert options.client == {"security.protocol": "PLAINTEXT", "isolation.level": "read_committed"}
    assert options.read_committed()
    # Spark's defaults: latest, no bound per trigger, fail on data loss, read uncommitted.
    plain = ReaderOptions.parse({**BOOTSTRAP, "subscribe": "a"})
    assert (plain.starting, plain.max_offsets, plain.fail_on_data_loss) == ("latest", 0, True)
    assert not plain.read_committed()
    json_start = ReaderOptions.parse(
        {**BOOTSTRAP, "subscribe": "a", "startingOffsets": '{"a": {"0": 5, "1": -2}}'}
    )
    assert json_start.starting == {"a": {"0": 5, "1": -2}}


@pytest.mark.parametrize(
    "options, named",
    [
        ({"subscribe": "a"}, "kafka.bootstrap.servers"),
        ({**BOOTSTRAP}, "subscribe"),
        ({**BOOTSTRAP, "subscribePattern": "a.*"}, "subscribepattern"),
        ({**BOOTSTRAP, "assign": '{"a": [0]}'}, "assign"),
        ({**BOOTSTRAP, "subscribe": "a", "includeHeaders": "true"}, "includeheaders"),
        ({**BOOTSTRAP, "subscribe": "a", "kafka.group.id": "g"}, "kafka.group.id"),
        ({**BOOTSTRAP, "subscribe": "a", "startingOffsets": "soon"}, "startingOffsets"),
        ({**BOOTSTRAP, "subscribe": "a", "maxOffsetsPerTrigger": "-1"}, "maxOffsetsPerTrigger"),
        ({**BOOTSTRAP, "subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ],
)
def test_a_reader_option_that_cannot_be_honoured_is_refused_by_name(options, named):
    with pytest.raises(KafkaOptionError, match=named):
        ReaderOptions.parse(options)


def test_a_writer_needs_a_value_and_a_topic_and_writes_no_headers():
    assert WriterOptions.parse({**BOOTSTRAP, "topic": "t"}, ["key", "value"], "q1").topic == "t"
    assert WriterOptions.parse(BOOTSTRAP, ["topic", "value"]).topic is None
    with pytest.raises(KafkaOptionError, match="value column"):
        WriterOptions.parse({**BOOTSTRAP, "topic": "t"}, ["key"])
    with pytest.raises(KafkaOptionError, match="topic"):
        WriterOptions.parse(BOOTSTRAP, ["value"])
    with pytest.raises(KafkaOptionError, match="headers"):
        WriterOptions.parse({**BOOTSTRAP, "topic": "t"}, ["value", "headers"])
    # The same query (its id outlives restarts) always produces under the same id.
    one = WriterOptions.parse({**BOOTSTRAP, "topic": "t"}, ["value"], "q1")
    assert one.transactional_id() == WriterOptions("x", None, {}, "q1").transactional_id()
    assert one.transactional_id() != WriterOptions("x", None, {}, "q2").transactional_id()


def test_the_first_batch_starts_where_the_app_asked():
    earliest = {"a": {"0": 3, "1": 0}}
    latest = {"a": {"0": 10, "1": 7}}
    assert starting_offsets("earliest", earliest, latest) == earliest
    assert starting_offsets("latest", earliest, latest) == latest
    # -1 latest, -2 earliest, a partition not named starts at its earliest.
    assert starting_offsets({"a": {"0": -1}}, earliest, latest) == {"a": {"0": 10, "1": 0}}
    assert starting_offsets({"a": {"0": 5, "1": -2}}, earliest, latest) == {"a": {"0": 5, "1": 0}}


def test_a_batch_ends_at_what_each_partition_has_within_the_bound():
    start = {"a": {"0": 0, "1": 4}}
    latest = {"a": {"0": 10, "1": 6, "2": 3}}  # partition 2 is new: it starts at 0
    assert next_end(start, latest, 0) == {"a": {"0": 10, "1": 6, "2": 3}}
    bounded = next_end(start, latest, 6)
    taken = {p: bounded["a"][p] - start["a"].get(p, 0) for p in bounded["a"]}
    assert sum(taken.values()) == 6 and all(n >= 1 for n in taken.values()), taken
    assert offset_ranges(start, bounded) == [
        ("a", int(p), start["a"].get(p, 0), bounded["a"][p]) for p in ("0", "1", "2")
    ]
    # Nothing new: the batch is empty and no range is read.
    assert next_end(latest, latest, 0) == latest
    assert offset_ranges(latest, latest) == []
