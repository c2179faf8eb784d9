"""Command line of the data plane (no Django).

python -m spark_runtime run --topology NAME --job ID [--strategy S] [--redis-url URL]
    [--arg=VALUE ...]
    (exits 1, saying why, when its supervisor gives up on the job: see spark_runtime.supervision;
    `--arg` gives a registered app its arguments, in order: `--arg=--in --arg=/data/in`)
python -m spark_runtime generate --topology NAME --job ID [--rate R] [--count N] [--seed S]
    (into the job's Kafka topic when it was launched with a Kafka source)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from spark_runtime.config import DEFAULT_REDIS_URL, configure_logging
from spark_runtime.env import env
from spark_runtime.strategies import STRATEGIES


def interrupt_on_sigterm(signum: int, _frame) -> None:
    """SIGTERM handled as Ctrl-C: the runner stops its job's processes before it exits."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m spark_runtime`."""
    from spark_runtime import apps, external_io, generators, keys
    from spark_runtime.redis_client import connect
    from spark_runtime.runner import DEFAULT_NODES, build_runner

    parser = argparse.ArgumentParser(prog="python -m spark_runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a job's stages here and supervise them")
    run.add_argument("--topology", required=True)
    run.add_argument("--job", required=True)
    run.add_argument("--strategy", choices=STRATEGIES, default="local-restart")
    run.add_argument("--active-stages", default="", help="stages with a hot standby (adaptive)")
    run.add_argument("--nodes", default=",".join(DEFAULT_NODES))
    run.add_argument("--trigger-seconds", type=float, default=None, help="default: the topology's")
    run.add_argument("--standby-nice", type=int, default=0)
    run.add_argument("--duration", type=float, default=None, help="seconds; default: forever")
    run.add_argument("--param", action="append", default=[], help="OP.KEY=VALUE")
    run.add_argument(
        "--arg", action="append", default=[], help="an app's argument (repeat: --arg=--in ...)"
    )
    gen = sub.add_parser("generate", help="write seeded input at a controlled rate")
    gen.add_argument("--topology", required=True)
    gen.add_argument("--job", required=True)
    gen.add_argument("--rate", type=float, default=1000)
    gen.add_argument("--count", type=int, default=None)
    gen.add_argument("--duration", type=float, default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--malformed-every", type=int, default=0)
    gen.add_argument(
        "--resume", action="store_true", help="count the entries already in the stream as written"
    )
    # Labels only: they let a node agent find (and stop) the generator it started.
    gen.add_argument("--replica-id", default="generator")
    gen.add_argument("--node", default="")
    for p in (run, gen):
        p.add_argument("--redis-url", default=env("REDIS_URL", DEFAULT_REDIS_URL))
    args = parser.parse_args(argv)
    configure_logging()
    if args.command == "generate":
        client = connect(args.redis_url, ride_out_outages=False)
        source = external_io.load(client, args.job).source
        run = dict(
            count=args.count,
            rate=args.rate,
            seed=args.seed,
            duration=args.duration,
            malformed_every=args.malformed_every,
            resume=args.resume,
        )
        if source is not None:  # a job reading Kafka: its topic is the input
            sent = generators.generate_to_kafka(
                source.bootstrap, source.topic, args.topology, **run
            )
            # What the controller compares with the job's `count` (a topic has no XLEN).
            total = generators.topic_record_count(source.bootstrap, source.topic)
            client.hset(keys.stats(args.job), generators.GENERATED, total)
        else:
            sent = generators.generate(client, args.job, args.topology, **run)
        print(f"wrote {sent} entries to the input of {args.job}")
        return 0
    client = connect(args.redis_url)
    try:
        app_args = apps.validate_args(args.arg)
    except apps.AppError as exc:
        parser.error(str(exc))
    if app_args:
        client.set(keys.app_args(args.job), json.dumps(app_args))
    else:
        client.delete(keys.app_args(args.job))
    active = {s for s in args.active_stages.split(",") if s}
    runner = build_runner(
        args.topology,
        args.job,
        args.strategy,
        args.redis_url,
        client,
        nodes=args.nodes.split(","),
        active_stages=active,
        trigger_seconds=args.trigger_seconds,
        standby_nice=args.standby_nice,
        params=tuple(args.param),
    )
    # A process manager stops the runner with SIGTERM: stop the job's processes as Ctrl-C does,
    # rather than leave them running with nobody supervising them.
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    runner.start()
    try:
        runner.run(duration=args.duration)
    except KeyboardInterrupt:
        runner.shutdown()
    if runner.supervisor.gave_up:
        print(f"{args.job} failed for good: {runner.supervisor.gave_up}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
