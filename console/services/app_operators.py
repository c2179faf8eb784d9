"""An app job's operators and queries as its running stage reports them.

An existing app (spark_runtime/apps.py) starts as one operator, `app`. Its stage publishes the
stateful operators it finds in each query's physical plan (spark_runtime/app_plan.py,
keys.app_operators); every policy cycle `adopt_app_operators` makes them the job's operators the
way a built-in topology's are: OperatorSpecs of the job's Topology (AppDefinition.to_topology),
Operator rows (Operator.from_spec) and operators of the app's stage, so the policy scores them
and the priority, placement and recovery pages show them.

`app_view` is what the job page and GET /api/jobs/{id}/ show of an app: each query's newest
batch (rates, batch duration, state rows, watermark, sources with their offsets and lag) and
operators, and the tail of the app's output.
"""

from __future__ import annotations

import json
import logging

from console.models import Job, Operator
from spark_runtime import keys as data_keys
from spark_runtime.app_output import read_output
from spark_runtime.app_plan import FoundOperator, operator_specs
from spark_runtime.apps import APP_OPERATOR, AppDefinition
from spark_runtime.jobdef import VERSION_SEPARATOR, registered_app, resolve_topology
from spark_runtime.progress import ProgressRecord
from spark_runtime.supervision import Supervisor
from spark_runtime.topology import Topology

log = logging.getLogger(__name__)

# How many of the newest progress records the queries' view reads (all queries of the app).
QUERY_RECORDS = 400
# The output lines the job page and the API show.
OUTPUT_LINES = 100


def found_operators(client, job_key: str) -> list[FoundOperator]:
    """The stateful operators the app's stage published, by query name then data order."""
    found = []
    for query, raw in sorted(client.hgetall(data_keys.app_operators(job_key)).items()):
        try:
            entries = json.loads(raw)
            found += [FoundOperator.from_dict(entry) for entry in entries]
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("job %s: ignored the operators published for %s: %s", job_key, query, exc)
    return found


def app_topology(job: Job, client) -> Topology:
    """The job's topology: for an app, with the operators its queries were found to have."""
    topology = resolve_topology(job.topology)
    if not isinstance(topology.job, AppDefinition):
        return topology
    found = operator_specs(found_operators(client, job.key), after=APP_OPERATOR)
    if not found:
        return topology
    version = int(job.topology.partition(VERSION_SEPARATOR)[2])
    return topology.job.to_topology(version, found)


def adopt_app_operators(
    job: Job, supervisor: Supervisor, client, operators: dict[str, Operator]
) -> Topology:
    """The job's topology (`app_topology`), its new operators made the job's: an Operator row
    each (added to `operators`, the rows the caller keeps by name) and operators of the app's
    stage (so measured demand and fault rates reach them). Idempotent: nothing changes once
    every found operator is the job's."""
    topology = app_topology(job, client)
    new = [op for op in topology.operators if op.name not in operators]
    if not new:
        return topology
    stage = next(s for s, ops in supervisor.stage_operators.items() if APP_OPERATOR in ops)
    Operator.objects.bulk_create(
        [Operator.from_spec(job, op, topology, stage=stage) for op in new],
        ignore_conflicts=True,  # a controller that died after inserting them: they are there
    )
    for row in Operator.objects.filter(job=job, name__in=[op.name for op in new]):
        operators[row.name] = row
    for row in operators.values():  # `app` (or an operator found earlier) reads into them
        downstream = list(topology.downstream(row.name))
        if row.downstream != downstream:
            row.downstream = downstream
            row.save(update_fields=["downstream", "updated_at"])
    stage_ops = supervisor.stage_operators[stage]
    supervisor.stage_operators[stage] = (
        *stage_ops,
        *(op.name for op in new if op.name not in stage_ops),
    )
    log.info("job %s: the app's operators %s are the job's", job.key, [op.name for op in new])
    return topology


def _query_view(record: ProgressRecord, operators: list[FoundOperator]) -> dict:
    sources = record.source_list()
    lags = [s["lag"] for s in sources if s.get("lag") is not None]
    return {
        "query": record.query,
        "batch": record.batch,
        "at": record.at,
        "input_rows": record.input_rows,
        "input_rate": record.input_rate,
        "processed_rate": record.processed_rate,
        "batch_ms": record.batch_ms,
        "state_rows": record.state_rows,
        "state_memory_bytes": record.state_memory_bytes,
        "watermark": record.watermark,
        "sources": sources,
        "lag": sum(lags) if lags else None,
        "operators": [{"name": op.name, "kind": op.kind, "node": op.node} for op in operators],
    }


def query_history(client, job_key: str) -> list[ProgressRecord]:
    """The newest QUERY_RECORDS progress records of the job, oldest first."""
    entries = client.xrevrange(data_keys.progress(job_key), count=QUERY_RECORDS)
    return [ProgressRecord.from_fields(raw) for _, raw in reversed(entries)]


def app_view(topology: str, job_key: str, client) -> dict | None:
    """What is shown of an app job (`topology`, its key `job_key`; None for any other job):
    `queries`, one entry per query with its newest batch's figures and its stateful operators
    (`_query_view`), `history`, the newest progress records (oldest first, for the rates
    chart), and `output`, the newest OUTPUT_LINES lines of the app's output (oldest first)."""
    if registered_app(topology) is None:
        return None
    history = query_history(client, job_key)
    newest: dict[str, ProgressRecord] = {}
    for record in history:
        newest[record.query] = record
    found = found_operators(client, job_key)
    queries = [
        _query_view(record, [op for op in found if op.query == name])
        for name, record in sorted(newest.items())
    ]
    return {
        "queries": queries,
        "history": history,
        "output": read_output(client, job_key, OUTPUT_LINES),
    }
