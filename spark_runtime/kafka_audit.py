"""A job's Kafka input as the entries an audit reads: what the job's plan log covers, in the
plan log's order, each record under the position the data plane gives it.

Audits (console/services/recovery.py) compare a job's results with ground truth computed from
its input, entry by entry up to each result's version. For a Redis input the entries are the
stream's; for a Kafka input they are the topic's committed records that the plan log has
assigned to plans (spark_runtime/kafka_plan.py), named `{plan ms}-{ordinal}` like Redis entry
ids, with the JSON value's fields as strings (an `id` from the partition and offset, a `ts` from
the record's timestamp where the value has none). Records past the log's last plan have not been
read by the job yet and are left out.
"""

from __future__ import annotations

import json

from spark_runtime import keys
from spark_runtime.external_io import EVENT_TIME_FROM_RECORD, KafkaSource
from spark_runtime.kafka_plan import Plan, partition_ranges
from spark_runtime.kafka_read import committed_reader, read_range

READ_TIMEOUT_S = 60.0


def plan_log(client, job: str) -> list[Plan]:
    """Every plan of the job's Kafka input, oldest first."""
    raws = client.lrange(keys.kafka_plans(job), 0, -1)
    return [Plan.from_json(i, raw) for i, raw in enumerate(raws)]


def plan_at(client, job: str, index: int) -> Plan:
    """Plan `index` of the job's Kafka input (KeyError when the log has no such plan)."""
    raw = client.lindex(keys.kafka_plans(job), index)
    if raw is None:
        raise KeyError(f"plan {index} of {job}'s Kafka input is not in its plan log")
    return Plan.from_json(index, raw)


def first_plan_ms(client, job: str) -> int | None:
    """When the first plan with records was made (epoch ms); None before any."""
    raw = client.lindex(keys.kafka_plans(job), 1)
    return None if raw is None else Plan.from_json(1, raw).ms


def record_fields(msg, partition: int, event_time: str) -> dict:
    """The record's value as string fields (what a Redis entry would carry); {} for a value
    that is not a JSON object."""
    try:
        obj = json.loads(msg.value())
    except (TypeError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(obj, dict):
        return {}
    fields = {k: v if isinstance(v, str) else json.dumps(v) for k, v in obj.items()}
    if not isinstance(obj.get("id"), str) or not obj.get("id"):
        fields["id"] = f"{partition}-{msg.offset()}"
    if event_time == EVENT_TIME_FROM_RECORD:
        fields["ts"] = str(msg.timestamp()[1])
    elif event_time in obj:
        fields["ts"] = fields[event_time]
    return fields


def input_entries(client, job: str, source: KafkaSource) -> list[tuple[str, dict]]:
    """The job's Kafka input the plan log covers, as (entry id, fields), in position order."""
    plans = plan_log(client, job)
    consumer = committed_reader(source.bootstrap, "backstop-audit")
    if len(plans) < 2:
        return []
    # Each partition is read once, over everything the log covers; then cut into the plans.
    records: dict[int, dict] = {}
    try:
        for partition, first, end, _base in partition_ranges(plans[0].end, plans[-1].end):
            found = read_range(consumer, source.topic, partition, first, end, READ_TIMEOUT_S)
            records[partition] = {msg.offset(): msg for msg in found}
    finally:
        consumer.close()
    entries: list[tuple[str, dict]] = []
    for previous, plan in zip(plans, plans[1:], strict=False):
        for partition, first, end, base in partition_ranges(previous.end, plan.end):
            found = records.get(partition, {})
            for offset in range(first, end):
                msg = found.get(offset)
                if msg is not None:  # else a transaction marker or an aborted record
                    entry_id = f"{plan.ms}-{base + offset - first}"
                    entries.append((entry_id, record_fields(msg, partition, source.event_time)))
    return entries


def input_size(client, job: str) -> int:
    """Offsets the plan log covers (an upper bound of the records an audit would read)."""
    plans = plan_log(client, job)
    if len(plans) < 2:
        return 0
    return sum(o - plans[0].end.get(p, 0) for p, o in plans[-1].end.items())
