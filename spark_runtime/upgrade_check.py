"""Will the new version of a stage run on the running version's state? A dry run, before any
replica of the new version starts (spark_runtime/upgrade.py, docs/JOBS.md "Upgrading a running
job").

    python -m spark_runtime.upgrade_check --job KEY --topology NAME@V --stage NAME \
        --operators OP,OP --from-checkpoint DIR [--param OP.KEY=VALUE ...] \
        [--redis-url URL] [--timeout S]

It copies the running primary's latest committed checkpoint (`--from-checkpoint`, its own
directory) to a scratch directory, starts the new version's queries on the copy as a standby
(which writes nothing: its output is buffered, then dropped), and waits until each query has
run a batch past the copied one, one fails, or `--timeout` passes. Spark checks a stateful
operator's state against the checkpoint when the first batch loads it, so a batch that ran is
the proof; a failure is classified (`classify_failure`): incompatible state (changed keys,
aggregates or state schema, another stateful operator), or an error Spark raises whatever the
state. Prints one JSON line: {"verdict", "batch", "detail"} (and "repartitioned" when the new
version's parallelism had the copy's state repartitioned: spark_runtime/state_partitions.py),
and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time

from spark_runtime.checkpoint_seed import seed_checkpoint
from spark_runtime.config import DEFAULT_REDIS_URL
from spark_runtime.env import env

log = logging.getLogger(__name__)

COMPATIBLE = "compatible"
INCOMPATIBLE_STATE = "incompatible_state"
SPARK_REFUSES = "spark_refuses"
UNTESTED = "untested"  # no input came to run a batch on within the timeout

# Spark 4.3's error conditions that mean "this state cannot be read by this query": the state
# store's key or value schema, its evolution, the stateful operators recorded in the state
# metadata, a stream-stream join's state format.
STATE_ERRORS = (
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
    "STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED",
    "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE",
    "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
    "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY",
    "STREAM_STREAM_JOIN_INCOMPATIBLE_STATE_STORE_CONFIGS",
    "StateSchemaNotCompatible",
)


def classify_failure(message: str) -> tuple[str, str]:
    """(verdict, one line saying why) for the error a dry run's query failed with."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for condition in STATE_ERRORS:
        for line in lines:
            if condition in line:
                return INCOMPATIBLE_STATE, line[:400]
    first = next((line for line in lines if "Error" in line or "Exception" in line), None)
    return SPARK_REFUSES, (first or (lines[0] if lines else "the query failed"))[:400]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_runtime.upgrade_check", description=__doc__
    )
    parser.add_argument("--job", required=True)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--operators", required=True)
    parser.add_argument("--from-checkpoint", required=True)
    parser.add_argument("--param", action="append", default=[])
    parser.add_argument("--redis-url", default=env("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--timeout", type=float, default=90.0)
    return parser


def dry_run(args) -> dict:
    """Run the check; returns the verdict as printed."""
    from spark_runtime.config import build_session, ensure_python_env
    from spark_runtime.jobdef import resolve_topology
    from spark_runtime.redis_client import connect
    from spark_runtime.runtime import STANDBY, StageRuntime
    from spark_runtime.stage import parse_params
    from spark_runtime.topology import stage_spec, with_params

    ensure_python_env()
    topology = with_params(resolve_topology(args.topology), parse_params(args.param))
    stage = stage_spec(topology, args.stage, [o for o in args.operators.split(",") if o], args.job)
    scratch = tempfile.mkdtemp(prefix="backstop-upgrade-check-")
    try:
        seeded = seed_checkpoint(args.from_checkpoint, scratch, len(stage.segments))
        batch = max((b for b in seeded.values() if b is not None), default=None)
        spark = build_session(f"backstop-upgrade-check-{args.job}")
        client = connect(args.redis_url)
        runtime = StageRuntime(
            spark, client, args.job, topology, stage, STANDBY, args.redis_url, scratch,
            trigger_seconds=topology.trigger_s,
        )  # fmt: skip
        runtime.start()
        try:
            verdict = watch(runtime, seeded, batch, args.timeout)
            repartitioned = [p for p in runtime.state_partitions.values() if "from" in p]
            if repartitioned:  # a new parallelism: the state was checked on the new number
                verdict["repartitioned"] = ", ".join(repartitioned)
            return verdict
        finally:
            runtime.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def watch(runtime, seeded: dict, batch: int | None, timeout_s: float) -> dict:
    """Wait for a batch past the copied one in every query, or a failure."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        failure = runtime.failure()
        if failure is not None:
            verdict, detail = classify_failure(str(failure))
            return {"verdict": verdict, "batch": batch, "detail": detail}
        progressed = []
        for index, query in enumerate(runtime.queries):
            progress = query.lastProgress
            copied = seeded.get(str(index))
            ran = progress is not None and progress["numInputRows"] > 0
            progressed.append(ran and (copied is None or progress["batchId"] > copied))
        if progressed and all(progressed):
            return {"verdict": COMPATIBLE, "batch": batch, "detail": "a batch ran on the state"}
        time.sleep(0.5)
    return {
        "verdict": UNTESTED,
        "batch": batch,
        "detail": f"no input within {timeout_s:g} s to run a batch on the state",
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = build_parser().parse_args(argv)
    print(json.dumps(dry_run(args)), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no wait for Spark's threads (see spark_runtime.stage.exit_now)
