"""`manage.py bench_upgrade`: a blue/green upgrade against the stop-and-restart baseline, in the
same run, on the benchmark's own cluster (bench/strategy's BenchCluster).

For each mode (blue_green, then stop_restart) a job of the first version runs under adaptive;
after the warm-up the job is upgraded to the second version through
console.services.upgrades (a blue/green upgrade is validated and confirmed by the controller);
the input goes on to its end, the results are compared with the new version's reference over
the whole input (lost and duplicated result cells), and the output gap across the switch is the
benchmark's measurement of a fault's downtime (console.policy.recovery.measure_faults, as
`manage.py bench` measures a fault), taken at the switch. With `rollback`, the blue/green
upgrade is rolled back a while after its switch (the new version killed, or a rollback by hand)
and the output gap at the rollback is measured the same way. Writes DIR/upgrade.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from django.db import transaction

from bench.results import write_report, write_subsection
from bench.strategy.harness import BenchSettings, drain, measure_progress, topology_params
from bench.strategy.run import (
    BenchCluster,
    bench_user,
    inject_fault,
    key_operator,
    machine_description,
    run_progress,
    sleep_until,
    wait_status,
)
from console.models import Job, JobUpgrade, Policy
from console.redis import redis_client
from console.services import upgrades
from console.services.faults import fault_max_duration_s
from console.services.jobs import create_job, kill_job_processes, stop_job
from console.services.recovery import input_started_at
from infra.launcher import wait_for
from spark_runtime import keys as data_keys

MODES = (JobUpgrade.Mode.BLUE_GREEN, JobUpgrade.Mode.STOP_RESTART)
ENDED = (
    JobUpgrade.Status.CONFIRMED,
    JobUpgrade.Status.ROLLED_BACK,
    JobUpgrade.Status.REFUSED,
    JobUpgrade.Status.ABANDONED,
)
# The state check (a SparkSession, up to its 120 s timeout), green's start and catch-up, and the
# policy's validation window (60 s by default).
UPGRADE_TIMEOUT_S = 420.0
# How the blue/green upgrade is rolled back with `--rollback`: its new version's primary killed
# (the controller hands the output back to the old version, its standby); by hand (the
# operator's rollback: the new version is stopped and the old one promoted); or for latency (a
# slow-driver fault makes each of the new version's batches SLOW_BATCH_DELAY_S longer until the
# controller's validation sees its p90 output latency leave the old version's band and rolls
# it back the same way).
ROLLBACKS = ("crash", "by-hand", "latency")
SLOW_BATCH_DELAY_S = 3.0
# The rollback comes this long after the switch: the new version writes steadily by then and
# the rollback's gap is not the switch's; well inside the policy's validation window (60 s).
ROLLBACK_AFTER_SWITCH_S = 15.0


@dataclass(frozen=True)
class UpgradeBenchSettings:
    """One invocation: from one version to another, and the shared workload (the upgrade is
    asked for after the warm-up; the duration must cover the state check and the switch)."""

    topology: str  # NAME@V, or a built-in topology's NAME
    to: str  # NAME@W, or the same built-in NAME
    rate: float
    warmup_s: float
    duration_s: float
    out: Path
    seed: int = 7
    to_params: dict = field(default_factory=dict)  # {"OP.KEY": value} of the new version
    # Declare the blue/green upgrade result-preserving: the old version checks the new one's
    # results while validating (the baseline has no old version running beside it).
    result_preserving: bool = False
    rollback: str = ""  # "", or one of ROLLBACKS: roll the blue/green upgrade back

    def workload(self) -> BenchSettings:
        """The strategy benchmark's settings for the same workload (one "fault": the switch),
        for its measurement of the output gap."""
        return BenchSettings(
            topology=self.topology,
            strategies=("adaptive",),
            faults=1,
            fault_kind="kill-driver",
            rate=self.rate,
            warmup_s=self.warmup_s,
            duration_s=self.duration_s,
            out=self.out,
            seed=self.seed,
        )


def run_upgrade_bench(settings: UpgradeBenchSettings, say) -> dict:
    """Both upgrades on one cluster; returns what upgrade.json holds."""
    result = {
        "command": "",
        "machine": machine_description(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "settings": {
            "topology": settings.topology, "to": settings.to, "to_params": settings.to_params,
            "rate": settings.rate,
            "warmup_s": settings.warmup_s, "duration_s": settings.duration_s,
            "seed": settings.seed, "result_preserving": settings.result_preserving,
            "rollback": settings.rollback,
        },
    }  # fmt: skip
    settings.out.mkdir(parents=True, exist_ok=True)
    with BenchCluster(settings.out / "logs", say):
        for number, mode in enumerate(MODES, start=1):
            say(f"[{number}/{len(MODES)}] {mode}: {settings.topology} -> {settings.to}")
            result[mode] = run_mode(settings, mode, say)
            write(result, settings.out)
    return result


def run_mode(settings: UpgradeBenchSettings, mode: str, say) -> dict:
    """One job of the first version, upgraded in `mode` after the warm-up; its figures."""
    bench = settings.workload()
    user = bench_user()
    job = create_job(
        name=f"bench-upgrade-{mode}-{time.strftime('%H%M%S')}",
        topology=settings.topology,
        strategy=Job.Strategy.ADAPTIVE,
        params={"rate": settings.rate, "seed": settings.seed, "count": bench.events},
        user=user,
    )
    client = redis_client()
    wait_status(job, (Job.Status.RUNNING, Job.Status.FAILED), 300, f"job {job.pk} to run")
    if job.status != Job.Status.RUNNING:
        raise RuntimeError(f"job {job.pk} failed to start: {job.status_reason}")
    wait_for(lambda: client.xlen(data_keys.input_stream(job.key)) > 0, 60, "the first input")
    t0 = input_started_at(client, job.key)
    # Asked for right after the warm-up: the state check (a SparkSession, 30-50 s here) and
    # green's catch-up come before the switch, which then falls inside the measured duration.
    upgrade_at = settings.warmup_s
    try:
        sleep_until(t0 + upgrade_at)
        say(f"      job {job.pk} running; upgrading at +{upgrade_at:.0f} s")
        upgrade = upgrades.request_upgrade(
            job,
            topology=settings.to,
            params=settings.to_params,
            user=user,
            mode=mode,
            result_preserving=settings.result_preserving and mode == JobUpgrade.Mode.BLUE_GREEN,
        )
        rollback_asked_at = None
        if settings.rollback and mode == JobUpgrade.Mode.BLUE_GREEN:
            rollback_asked_at = roll_back(job, upgrade, settings.rollback, user, say)
        upgrade = follow(upgrade, say)
        rollback_at = rollback_moment(upgrade, settings.rollback, rollback_asked_at)
        end = t0 + bench.input_s
        say(f"      upgrade {upgrade.pk}: {upgrade.status}; input ends in "
            f"{max(0, end - time.time()):.0f} s")  # fmt: skip
        sleep_until(end)
        wait_for(
            lambda: client.xlen(data_keys.input_stream(job.key)) >= bench.events,
            120, "the generator to finish",
        )  # fmt: skip
        job.refresh_from_db()
        # The new version's params only if it stayed (rolled back or refused: the old one's).
        in_force = settings.to_params if upgrade.status == JobUpgrade.Status.CONFIRMED else {}
        comparison, _ = drain(
            client, job.key, job.topology, reference_params(job.topology, in_force),
            bench.drain_timeout_s, say,
        )  # fmt: skip
    finally:
        client.close()
        stop_job(job, "benchmark run over")
        try:
            wait_status(job, (Job.Status.STOPPED, Job.Status.FAILED), 60, f"job {job.pk} to stop")
        finally:
            kill_job_processes({job.key})
    upgrade.refresh_from_db()
    records, input_stage = run_progress(job, upgrade.from_topology, t0)
    gap_s, rollback_gap_s = output_gaps(records, input_stage, bench, t0, upgrade, rollback_at)
    row = {
        "job": job.pk,
        "upgrade": upgrade.pk,
        "case": upgrade.case,
        "reason": upgrade.reason,
        "status": upgrade.status,
        "gap_s": gap_s,
        "lost": comparison.lost,
        "duplicates": comparison.duplicates,
        "result_cells": comparison.cells,
        "rolled_back": upgrade.status == JobUpgrade.Status.ROLLED_BACK,
        "outcome": upgrade.outcome,
        "switch_after_request_s": (
            round((upgrade.switched_at - upgrade.requested_at).total_seconds(), 1)
            if upgrade.switched_at
            else None
        ),
        "longest_gap_before_switch_s": longest_gap(
            records, upgrade.requested_at.timestamp(),
            upgrade.switched_at.timestamp() if upgrade.switched_at else None,
        ),
        "rollback": settings.rollback if rollback_at else "",
        "rollback_gap_s": rollback_gap_s,
        "rolled_back_after_s": (
            round(upgrade.ended_at.timestamp() - rollback_asked_at, 2)
            if rollback_at is not None else None
        ),
        "rollback_first_output_s": first_output_after(records, rollback_at),
    }  # fmt: skip
    if rollback_at is not None:
        say(f"      rollback ({settings.rollback}): rolled back {row['rolled_back_after_s']} s "
            f"after it was caused, gap {row['rollback_gap_s']} s, first output "
            f"{row['rollback_first_output_s']} s after it")  # fmt: skip
    say(f"      {mode}: case {row['case']}, gap {gap_s} s, lost {row['lost']}, "
        f"duplicates {row['duplicates']} over {row['result_cells']} result cells")  # fmt: skip
    return row


def follow(upgrade: JobUpgrade, say) -> JobUpgrade:
    """Wait for the upgrade to end: a blue/green one is validated for the policy's window (its
    latency and dead letters judged against the old version's) and confirmed by the controller,
    or rolled back, as for a user."""
    deadline, seen = time.monotonic() + UPGRADE_TIMEOUT_S, None
    while time.monotonic() < deadline:
        upgrade.refresh_from_db()
        if upgrade.status != seen:
            seen = upgrade.status
            say(f"      upgrade {upgrade.pk}: {upgrade.status}"
                + (f" ({upgrade.case}: {upgrade.reason})" if upgrade.case else ""))  # fmt: skip
        if upgrade.status in ENDED:
            return upgrade
        time.sleep(0.5)
    raise RuntimeError(f"upgrade {upgrade.pk} still {upgrade.status} after {UPGRADE_TIMEOUT_S} s")


def roll_back(job: Job, upgrade: JobUpgrade, how: str, user, say) -> float | None:
    """Once the new version has written for a while after its switch (ROLLBACK_AFTER_SWITCH_S,
    or half the policy's validation window if that is shorter), roll the upgrade back `how`
    (one of ROLLBACKS); returns when (epoch s) the rollback was caused: the fault's injection
    or the operator's request. None: the upgrade ended on its own first (the controller rolled
    it back or confirmed it), nothing was done."""

    def switched() -> bool:
        upgrade.refresh_from_db()
        return upgrade.switched_at is not None or upgrade.status in ENDED

    wait_for(switched, UPGRADE_TIMEOUT_S, f"upgrade {upgrade.pk} to switch", poll_s=0.5)
    after_s = min(ROLLBACK_AFTER_SWITCH_S, Policy.current().upgrade_validation_s / 2)
    if upgrade.switched_at is not None:
        sleep_until(upgrade.switched_at.timestamp() + after_s)
    upgrade.refresh_from_db()
    if upgrade.status != JobUpgrade.Status.VALIDATING:
        say(f"      no rollback: upgrade {upgrade.pk} is {upgrade.status} ({upgrade.outcome})")
        return None
    if how in ("crash", "latency"):
        # The new version is the upgraded stage's primary now. Slowed for the rest of the
        # validation window: the rollback, not the fault's end, brings the latency back.
        kind, params = "kill-driver", None
        if how == "latency":
            kind = "slow-driver"
            params = {"delay_s": SLOW_BATCH_DELAY_S,
                      "duration_s": min(Policy.current().upgrade_validation_s,
                                        fault_max_duration_s())}  # fmt: skip
        fault, detail = inject_fault(job, kind, key_operator(job, upgrade.stage), user, params)
        if fault is None or fault.injected_at is None:
            raise RuntimeError(f"the new version was not {kind}: {detail}")
        say(f"      {kind} on the new version: {detail}")
        return fault.injected_at.timestamp()
    at = time.time()
    with transaction.atomic():
        upgrades.request_end(upgrade, upgrades.ROLLBACK, user)
    say(f"      rollback asked by {user.username}")
    return at


def rollback_moment(upgrade: JobUpgrade, how: str, asked_at: float | None) -> float | None:
    """The moment (epoch s) the rollback's output gap is measured at: the kill or the
    operator's request, from which the output moves back to the old version; for a latency
    rollback the controller's decision (the new version writes, late, until then). None: no
    rollback was caused, or a latency rollback that did not come."""
    if asked_at is None or how != "latency":
        return asked_at
    if upgrade.status != JobUpgrade.Status.ROLLED_BACK or upgrade.ended_at is None:
        return None
    return upgrade.ended_at.timestamp()


def reference_params(topology: str, to_params: dict) -> dict:
    """The operator params the new version's reference is computed with (a built-in's, e.g.
    topn's window_seconds and n): the topology's own, with those the upgrade sets."""
    changed = {name.split(".", 1)[1]: value for name, value in (to_params or {}).items()}
    return {**topology_params(topology), **changed}


def output_gaps(
    records,
    input_stage: str,
    bench: BenchSettings,
    t0: float,
    upgrade: JobUpgrade,
    rollback_at: float | None,
) -> tuple[float | None, float | None]:
    """The output gaps across the switch and across the rollback (if any): each the downtime
    of a fault at that moment, measured as `manage.py bench` measures a fault's, both in one
    measurement so that the switch's is not stretched over the rollback's (None: it never
    switched, no rollback, or no output after it)."""
    if upgrade.switched_at is None:
        return None, None
    moments = [upgrade.switched_at.timestamp()] + ([rollback_at] if rollback_at else [])
    _, measured, _ = measure_progress(records, bench, t0, moments, input_stage)
    gaps = [None if m.downtime_s is None else round(m.downtime_s, 2) for m in measured]
    return gaps[0], gaps[1] if rollback_at else None


def first_output_after(records, at: float | None) -> float | None:
    """Seconds from `at` to the first output after it (None: no moment, or no output): for a
    rollback, how soon the old version writes again. The gap across it also counts the time
    before `at` since the last output, which for a slowed new version is its own stall."""
    if at is None:
        return None
    after = [r.at for r in records if r.is_output and r.at >= at]
    return round(min(after) - at, 2) if after else None


def longest_gap(records, start: float, end: float | None) -> float | None:
    """The longest time without output in [start, end): the old version's output while the
    new one is checked, started, seeded or rebuilt (None: no switch)."""
    if end is None:
        return None
    times = [start] + sorted(r.at for r in records if r.is_output and start <= r.at < end) + [end]
    return round(max(b - a for a, b in zip(times, times[1:], strict=False)), 2)


def write(result: dict, out: Path) -> None:
    write_report(out, "upgrade.json", result)


RESULTS_SECTION = "## Upgrades (manage.py bench_upgrade)"


def to_markdown(result: dict) -> str:
    """The run's table: blue/green against stop-and-restart (and a rollback's gap, if any)."""
    rows = [
        "| upgrade | case | status | output gap s | longest gap before the switch s | "
        "rollback gap s | lost | duplicated | result cells |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        run = result.get(mode)
        if run is None:
            continue
        rollback = "-"
        if run.get("rollback"):
            rollback = f"{seconds(run.get('rollback_gap_s'))} ({run['rollback']})"
        rows.append(
            f"| {mode} | {run['case']} | {run['status']} | {seconds(run['gap_s'])} | "
            f"{seconds(run.get('longest_gap_before_switch_s'))} | {rollback} | {run['lost']} | "
            f"{run['duplicates']} | {run['result_cells']} |"
        )
    blue, base = result.get(MODES[0]), result.get(MODES[1])
    if blue and base and blue["gap_s"] is not None and base["gap_s"]:
        rows.append("")
        rows.append(
            f"Blue/green's output gap is {100 * blue['gap_s'] / base['gap_s']:.0f}% of "
            "stop-and-restart's, measured in the same run."
        )
    return "\n".join(rows)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write_results(result: dict, command: str) -> str:
    """Put the run's table into docs/RESULTS.md under its versions."""
    settings = result["settings"]
    params = "".join(f" {k}={v}" for k, v in sorted((settings.get("to_params") or {}).items()))
    rollback = f", rolled back ({settings['rollback']})" if settings.get("rollback") else ""
    subsection = (
        f"{settings['topology']} -> {settings['to']}{params}, {settings['rate']:g} events/s"
        f"{rollback}"
    )
    body = f"`{command}` on {time.strftime('%Y-%m-%d')} ({result['machine']}).\n\n" + to_markdown(
        result
    )
    write_subsection(RESULTS_SECTION, subsection, body)
    return f"docs/RESULTS.md / {subsection}"
