"""Throughput benchmark: the highest sustained input rate per topology with event-time latency
p99 under 5 s, on this machine.

    python -m bench.dataplane.throughput [--topology NAME ...] [--step 15]
    python -m bench.dataplane.throughput --topology wordcount \
        --strategy restart-all --strategy adaptive [--rates 400,800,1600]

Each topology runs as its stages under the local runner. Without `--strategy`: local-restart,
one stage process per operator, Redis streams between them ("Throughput"). With `--strategy`:
each strategy as it runs a job, its own stages (restart-all: the whole job fused in one
process; adaptive: its chained stages, and a hot standby at the standby CPU priority for every
stage with an operator the default policy protects), one strategy after another, so users see
what a hot standby costs in capacity ("Throughput by strategy"). The input rate goes up step by
step; a step passes if the highest per-batch p99 of the final stage's primary's event-time
latency (output time minus the input's `ts`) over the step, after a settling period, stays
under the bound. The figure reported is the last passing rate. Prints the figures and writes
them to docs/RESULTS.md ("Data plane").
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import threading
import time

import psutil

from bench.dataplane.util import (
    bench_runner,
    final_progress,
    wait_running,
    wait_steady,
    write_result,
)
from console.policy.config import PolicyConfig
from console.policy.priority import ACTIVE, operator_priorities
from spark_runtime import generators, keys
from spark_runtime.redis_client import connect
from spark_runtime.strategies import (
    ALL_STANDBYS,
    POLICY_STANDBYS,
    STANDBY_NICE,
    STRATEGIES,
    get_strategy,
)
from spark_runtime.topology import PER_OPERATOR, compile_stages, get_topology

log = logging.getLogger("bench.dataplane.throughput")

COMMAND = "python -m bench.dataplane.throughput"
P99_BOUND = 5.0
# The generator is one Python thread sharing the cores with the job: a step it fed at less than
# this share of the target rate ends the ramp, since higher targets would measure the generator.
FED_SHARE = 0.95
# The feeding thread's nice level: above the stages (0, standbys 5), so that on a machine whose
# cores the job fills the input still arrives at its rate, as it would from other machines.
FEEDER_NICE = -10
# Input entries per second (wordcount: lines of ~7.5 words).
RATES = {
    "wordcount": [50, 100, 200, 400, 800, 1600],
    "topn": [1000, 2000, 4000, 8000, 16000],
    "traffic": [1000, 2000, 4000, 8000, 16000],
    "shuffle": [1000, 2000, 4000, 8000, 16000],
}


def protected_operators(topology: str, strategy: str) -> frozenset[str]:
    """The operators `strategy` gives a standby under the default policy on this machine (the
    same rule as console.services.planning.plan_job, with this machine as the cluster)."""
    standbys = get_strategy(strategy).standbys
    if standbys not in (ALL_STANDBYS, POLICY_STANDBYS):
        return frozenset()
    priorities = operator_priorities(
        get_topology(topology),
        float(psutil.cpu_count() or 1),
        psutil.virtual_memory().total / 2**20,
        PolicyConfig(),
    )
    return frozenset(p.name for p in priorities if standbys == ALL_STANDBYS or p.mode == ACTIVE)


@contextlib.contextmanager
def feeding_first():
    """Run the block with this thread at FEEDER_NICE (a thread's own level: the stages, started
    by other threads or before, keep theirs), put back afterwards; unchanged where this process
    may not raise a priority."""
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, FEEDER_NICE)
    except PermissionError:
        log.warning("may not raise the feeder's priority: the generator shares the cores equally")
    try:
        yield
    finally:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, tid, before)


def measure(client, redis_url: str, topology: str, args, strategy: str | None = None) -> dict:
    """Ramp the input rate of one topology (under `strategy`, or local-restart cut per
    operator); returns the steps and the highest passing rate."""
    job = f"bench-tp-{topology}-{strategy or 'operators'}-{int(time.time())}"
    active = protected_operators(topology, strategy) if strategy else frozenset()
    chaining = get_strategy(strategy).chaining if strategy else PER_OPERATOR
    cut = compile_stages(get_topology(topology), chaining, active=active)
    standbys = {s.name for s in cut if active & set(s.operators)}
    runner, root = bench_runner(
        topology,
        job,
        strategy or "local-restart",
        redis_url,
        client,
        max_records=args.max_records,
        chaining=chaining,
        active_operators=active,
        active_stages=standbys,
        standby_nice=STANDBY_NICE,
    )
    stages = [s.name for s in cut]
    rates = args.rates or RATES[topology]
    stop = threading.Event()
    steps = []
    best = None
    input_bound = False
    supervise = threading.Thread(target=runner.run, kwargs={"stop": stop.is_set})
    try:
        runner.start()
        supervise.start()
        wait_running(client, job, [f"{s}-1" for s in stages] + [f"{s}-2" for s in standbys])
        # Warm up (Python workers, first state-store batches) at the lowest rate until the
        # backlog of the start is worked off.
        warm = threading.Event()
        feeder = threading.Thread(
            target=generators.generate,
            args=(client, job, topology),
            kwargs={"rate": rates[0], "seed": 0, "id_prefix": "w-", "stop": warm.is_set},
        )
        feeder.start()
        try:
            final_stage = f"{stages[-1]}-1"
            waited = wait_steady(
                client, job, [final_stage], bound=P99_BOUND, timeout=150, batches=3
            )
            log.info("%s: steady after %.0f s of warm-up", topology, waited)
        except TimeoutError:
            log.error("%s: never steady at the lowest rate", topology)
            rates = []  # no ramp: reported as below the lowest rate
        finally:
            warm.set()
            feeder.join()
        with feeding_first():
            for index, rate in enumerate(rates):
                started = time.time()
                sent = generators.generate(
                    client,
                    job,
                    topology,
                    rate=rate,
                    duration=args.step,
                    seed=index + 1,
                    id_prefix=f"s{index}-",
                )
                # The generator is one Python thread: record the rate it really achieved.
                achieved = sent / (time.time() - started)
                # Let the last inputs of the step come out before judging it.
                time.sleep(2)
                records = final_progress(client, job, started + args.settle, time.time())
                p99s = [r.latency_p99 for r in records if r.latency_p99 is not None]
                worst = max(p99s) if p99s else float("inf")
                passed = worst < P99_BOUND
                steps.append({"rate": rate, "achieved": achieved, "p99": worst, "passed": passed})
                log.info(
                    "%s (%s) at %s/s: worst batch p99 %.2f s -> %s",
                    topology,
                    strategy or "per operator",
                    rate,
                    worst,
                    "pass" if passed else "fail",
                )
                if not passed:
                    break
                best = round(achieved)
                if achieved < FED_SHARE * rate:
                    input_bound = True
                    log.info("%s: the generator fed only %.0f/s; the ramp ends", topology, achieved)
                    break
    finally:
        stop.set()
        supervise.join(timeout=60)
        keys.delete_job_keys(client, job)
        shutil.rmtree(root, ignore_errors=True)
    return {
        "topology": topology,
        "strategy": strategy,
        "standbys": sorted(active),
        "best": best,
        "steps": steps,
        "input_bound": input_bound,
    }


def steps_text(steps: list[dict]) -> str:
    """A ramp's steps as "rate/s (achieved n/s): worst p99"."""
    return ", ".join(
        f"{s['rate']}/s (achieved {s['achieved']:.0f}/s): {s['p99']:.1f} s" for s in steps
    )


def ceiling_reached(result: dict) -> bool:
    """Whether a step of the ramp failed (else the job's ceiling is above its last step)."""
    return any(not s["passed"] for s in result["steps"])


def best_text(result: dict, lowest: int) -> str:
    """The highest rate sustained (as fed), or a bound when no step failed or none passed."""
    if result["best"] is None:
        return f"< {lowest}/s"
    if ceiling_reached(result):
        return f"{result['best']}/s"
    if result.get("input_bound"):
        return f">= {result['best']}/s (no step failed; the generator fed no more)"
    return f">= {result['best']}/s (every step passed)"


def capacity_ratio(results: list[dict]) -> str:
    """What adaptive sustains as a share of restart-all's highest rate, per topology, where
    both ran; a share against a ceiling that was not reached is a bound and says so."""
    lines = []
    for topology in dict.fromkeys(r["topology"] for r in results):
        by_strategy = {r["strategy"]: r for r in results if r["topology"] == topology}
        base, protected = by_strategy.get("restart-all"), by_strategy.get("adaptive")
        if not base or not protected or not base["best"] or protected["best"] is None:
            continue
        share = 100.0 * protected["best"] / base["best"]
        if ceiling_reached(base) and ceiling_reached(protected):
            note = "both ceilings reached"
        elif ceiling_reached(base):
            note = "adaptive's ceiling was not reached: at least this much"
        elif ceiling_reached(protected):
            note = "restart-all's ceiling was not reached: at most this much"
        else:
            note = "neither ceiling was reached"
        lines.append(
            f"- {topology}: adaptive sustains {share:.0f}% of restart-all's highest rate ({note})."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure every selected topology (under each selected strategy) and report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--topology", action="append", choices=sorted(RATES))
    parser.add_argument(
        "--strategy",
        action="append",
        choices=sorted(STRATEGIES),
        help="run each topology as this strategy runs a job (repeat to compare strategies); "
        "without it, local-restart with one stage per operator",
    )
    parser.add_argument(
        "--rates",
        type=lambda text: [int(r) for r in text.split(",")],
        help="input rates to step through, comma-separated (default: the topology's ramp)",
    )
    parser.add_argument("--step", type=float, default=15, help="seconds per rate step")
    parser.add_argument("--settle", type=float, default=5, help="seconds ignored per step")
    parser.add_argument("--max-records", type=int, default=20000, help="per micro-batch")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    topologies = args.topology or list(RATES)
    strategies = args.strategy or [None]
    runs = [(t, strategy) for t in topologies for strategy in strategies]
    results = []
    for number, (topology, strategy) in enumerate(runs, start=1):
        log.info("[%d/%d] %s under %s", number, len(runs), topology, strategy or "per operator")
        results.append(measure(client, args.redis_url, topology, args, strategy))
    opts = "".join(f" --topology {t}" for t in args.topology or [])
    opts += "".join(f" --strategy {s}" for s in args.strategy or [])
    opts += f" --rates {','.join(map(str, args.rates))}" if args.rates else ""
    header = (
        f"Command: `{COMMAND}{opts} --step {args.step:g} --settle {args.settle:g} "
        f"--max-records {args.max_records}` ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{psutil.cpu_count()} cores; "
        + (
            "each strategy's own stages, local[2] each, standbys at the standby CPU priority; "
            if args.strategy
            else "stages as separate processes, local[2] each, "
        )
        + "each topology's trigger: "
        f"{', '.join(f'{t} {get_topology(t).trigger_s:g} s' for t in topologies)}). "
        "Rates are input entries "
        "per second (wordcount: lines of about 7.5 words), written by one generator thread at "
        f"nice {FEEDER_NICE} ('achieved': what it wrote; a step it fed at less than "
        f"{FED_SHARE:.0%} of the target ends the ramp); a step passes if every batch's "
        f"event-time latency p99 stays under {P99_BOUND:g} s."
    )
    if args.strategy:
        lines = [
            header,
            "",
            "| topology | strategy | standbys | highest sustained rate (p99 < 5 s) | "
            "steps (target rate: worst batch p99) |",
            "|---|---|---|---|---|",
        ]
        for r in results:
            lines.append(
                f"| {r['topology']} | {r['strategy']} | {', '.join(r['standbys']) or 'none'} | "
                f"{best_text(r, (args.rates or RATES[r['topology']])[0])} | "
                f"{steps_text(r['steps'])} |"
            )
        ratio = capacity_ratio(results)
        body = "\n".join(lines + ([("\n" + ratio)] if ratio else []))
        subsection = "Throughput by strategy"
    else:
        lines = [
            header,
            "",
            "| topology | highest sustained rate (p99 < 5 s) | "
            "steps (target rate: worst batch p99) |",
            "|---|---|---|",
        ]
        for r in results:
            lines.append(
                f"| {r['topology']} | {best_text(r, (args.rates or RATES[r['topology']])[0])} | "
                f"{steps_text(r['steps'])} |"
            )
        body = "\n".join(lines)
        subsection = "Throughput"
    print(body)
    if not args.no_write:
        write_result(subsection, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
