"""The audit of a running job's output against ground truth computed in plain Python from its
input (console/policy/truth.py, "auditing a running job's output"), run in a child process.

An audit reads the job's whole input (up to AUDIT_MAX_ENTRIES entries): tens of megabytes of
Python objects for an hour of input at 20 lines/s. Done in the controller, each audit left its
RSS some 15-25 MB higher for good: the entries were freed, but objects other threads allocated
meanwhile kept the allocator's arenas from being returned (the hour soak, docs/RESULTS.md). So
`audit_in_child` runs it in a new process (infra/child.py), at nice 10.

The child has no Django: the caller reads what the audit needs from the database into an
`AuditRequest`; this module imports nothing of Django (tests/console/test_output_audit.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import redis

from console.policy import truth
from infra.child import run_in_child
from spark_runtime import external_io, kafka_audit, user_plan
from spark_runtime import keys as data_keys
from spark_runtime.jobdef import JobDefinition, Upsert, is_registered_ident, resolve_topology
from spark_runtime.topology import OUT_CHANNEL, RESULTS_CHANNEL, SINK, STATEFUL_KINDS, channel_key

# The input is read in pages of this many entries, and not at all beyond the cap.
AUDIT_PAGE = 10_000
AUDIT_MAX_ENTRIES = 2_000_000
# The child's start (a new interpreter) takes a second or two; an audit of a day's input at
# 20 lines/s (1.7 million entries) about a minute on this 2-core machine.
AUDIT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RedisAddress:
    """How to reach the Redis a client talks to, as plain data a child process can be given:
    the client's connection class and its scalar connection settings (host, port, db, password,
    decode_responses ...; not callbacks or retry objects)."""

    connection_class: type
    settings: dict = field(default_factory=dict)

    @classmethod
    def of(cls, client: redis.Redis) -> RedisAddress:
        pool = client.connection_pool
        scalars = (str, int, float, bool, type(None))
        settings = {k: v for k, v in pool.connection_kwargs.items() if isinstance(v, scalars)}
        return cls(pool.connection_class, settings)

    def client(self) -> redis.Redis:
        """A new client of that Redis."""
        pool = redis.ConnectionPool(connection_class=self.connection_class, **self.settings)
        return redis.Redis(connection_pool=pool)


@dataclass(frozen=True)
class AuditRequest:
    """What the audit of job `job_key` needs from the database: its `topology`, the stage of
    each operator (`stages`), and where its Redis is."""

    job_key: str
    topology: str
    stages: dict[str, str]
    redis: RedisAddress


def audit_in_child(request: AuditRequest, timeout_s: float = AUDIT_TIMEOUT_S):
    """`audit(request)` in a child process at nice 10; raises infra.child.ChildTimedOut after
    `timeout_s`, and what the audit raised (a Redis error, a malformed entry's ValueError)."""
    return run_in_child(audit, (request,), timeout_s)


def audit(request: AuditRequest) -> truth.Comparison | None:
    """Lost and duplicated results in the job's output so far; None for a topology without
    ground truth or an input too long to audit."""
    client = request.redis.client()
    try:
        if is_registered_ident(request.topology):
            return _audit_user_job(request, client)
        if request.topology not in truth.CHECKED_TOPOLOGIES or _input_too_long(request, client):
            return None
        return _audit_builtin(request, client)
    finally:
        client.close()


def _read_stream(client, key: str) -> list[tuple[str, dict]]:
    """Every entry of a stream, oldest first, read in pages: one XRANGE over millions of entries
    would block Redis (and with it every heartbeat) while it runs."""
    entries: list[tuple[str, dict]] = []
    low = "-"
    while True:
        page = client.xrange(key, min=low, count=AUDIT_PAGE)
        entries.extend(page)
        if len(page) < AUDIT_PAGE:
            return entries
        low = f"({page[-1][0]}"  # exclusive: after the last entry read


def _input_too_long(request: AuditRequest, client) -> bool:
    """Whether the job's input is past what an audit reads (AUDIT_MAX_ENTRIES)."""
    if external_io.load(client, request.job_key).source is not None:
        return kafka_audit.input_size(client, request.job_key) > AUDIT_MAX_ENTRIES
    return client.xlen(data_keys.input_stream(request.job_key)) > AUDIT_MAX_ENTRIES


def _read_input(client, job_key: str) -> list[tuple[str, dict]]:
    """Every input entry of the job so far, oldest first: its Redis input stream, or for a job
    reading Kafka the topic's records its plan log covers (spark_runtime/kafka_audit.py)."""
    source = external_io.load(client, job_key).source
    if source is not None:
        return kafka_audit.input_entries(client, job_key, source)
    return _read_stream(client, data_keys.input_stream(job_key))


def _audit_builtin(request: AuditRequest, client) -> truth.Comparison:
    """A wordcount's or topn's output against the counts of its input."""
    job_key = request.job_key
    # Results first, then the input: the input only grows, so every result's origin is in it.
    with client.pipeline(transaction=True) as pipe:  # values and versions of one moment
        pipe.hgetall(data_keys.results(job_key))
        pipe.hgetall(data_keys.result_versions(job_key))
        results, versions = pipe.execute()
    entries = truth.valid_entries(request.topology, _read_input(client, job_key))
    if request.topology == "topn":
        topology = resolve_topology(request.topology)
        window = int(topology.operator("window_count").params["window_seconds"])
        return truth.audit_topn(
            entries, results, window, int(topology.operator("topn").params["n"])
        )
    via_stream = None
    if request.stages.get("count") != request.stages.get("split"):
        # count reads split's intermediate stream: map its positions back to input lines.
        via_stream = {
            truth.entry_position(entry_id): fields.get("id", "")
            for entry_id, fields in _read_stream(client, channel_key(job_key, "split"))
        }
    return truth.audit_wordcount(entries, results, versions, via_stream)


def _audit_user_job(request: AuditRequest, client) -> truth.Comparison | None:
    """A user job's output so far against its reference function; None without a reference
    or with too long an input."""
    definition = resolve_topology(request.topology).job
    if not isinstance(definition, JobDefinition):
        return None  # an existing app writes where its code says: no reference to audit by
    if definition.reference is None or _input_too_long(request, client):
        return None
    job_key = request.job_key
    upsert = isinstance(definition.output, Upsert)
    sink = RESULTS_CHANNEL if upsert else OUT_CHANNEL
    last_operator = [op for op in definition.operators if op.kind != SINK][-1].name
    stage = request.stages.get(last_operator)
    with client.pipeline(transaction=True) as pipe:  # the watermark and what it covers, at once
        pipe.hget(data_keys.watermarks(job_key, stage or ""), sink)
        pipe.hgetall(data_keys.results(job_key))
        pipe.hgetall(data_keys.result_versions(job_key))
        watermark, values, versions = pipe.execute()
    if upsert:
        actual = user_plan.upserted_results(values)
    else:  # appended keys are written once, so records read later only add keys
        actual = user_plan.actual_results(definition, client, job_key)
    # Read after the results: every result's origin is in the input read.
    entries = _read_input(client, job_key)
    positions = [truth.entry_position(entry_id) for entry_id, _ in entries]
    cache: dict[int, dict] = {}

    def reference_at(position: int) -> dict:
        """The reference over the input up to `position` (inclusive)."""
        if position not in cache:
            upto = bisect.bisect_right(positions, position)
            cache[position] = user_plan.expected_results(definition, entries[:upto])
        return cache[position]

    covered = truth.version_position(watermark) if watermark else -1
    settled = reference_at(covered) if watermark else {}
    later: dict[str, object | None] = {}
    for key in actual:
        if upsert:  # its version names the input its value reflects
            position = truth.version_position(versions.get(key, "0"))
            past_watermark = position > covered
        else:  # an appended key carries no version: all the input read covers it
            position = positions[-1] if positions else 0
            past_watermark = key not in settled
        if past_watermark:
            later[key] = reference_at(position).get(key)
    stateful = any(op.kind in STATEFUL_KINDS for op in definition.operators)
    return truth.audit_user_output(settled, later, actual, judge_lost=upsert or not stateful)
