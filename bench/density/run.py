"""`manage.py density`: how many jobs fit on this machine with their protection intact.

For each job count of `--jobs` (1, 2, 4, 6, ...), on one cluster of the run's own (the soak's
harness: its Redis, database, controller, beat and node agents, bench/soak/run.py):

1. start that many jobs at once under the adaptive strategy, their topologies mixed (wordcount,
   topn, in turn), each fed `rate` lines/s by its generator, and wait until all run;
2. after the policy's warm-up, a steady window of `steady_s`: the CPU the run's processes used
   (their user+system time over the window, in cores), the events-weighted p50 latency of the
   jobs' output (bench.strategy.measure.steady_figures), and how many stages the policy gives a
   hot standby (`standbys_wanted`: a stage with an active operator) have a running one
   (`standbys_kept`);
3. `faults` kill-driver faults, into the jobs in turn (the stage of a job's key operator, where
   a standby runs when one does), each through the console's fault service and measured by the
   recovery episodes the controller records (recovery time, re-protect time, phases), one after
   the other once the previous one's episodes closed;
4. the jobs' output audited against the plain-Python reference of their input
   (console.services.recovery.audit_output: lost and duplicated results), then the jobs stopped
   and their processes ended before the next count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from django.db import close_old_connections

from bench.density import report as density_report
from bench.results import write_report
from bench.soak import processes as soak_processes
from bench.soak.faults import LIVE_REPLICA_STATES, soak_user
from bench.soak.run import Soak, SoakSettings, soak_services
from bench.strategy.measure import steady_figures
from bench.strategy.run import key_operator, machine_description
from console.models import FaultInjection, Job, Operator, Policy, Replica
from console.policy.recovery_phases import phase_seconds
from console.redis import redis_client
from console.services.faults import FaultRefused, request_fault
from console.services.jobs import create_job, kill_job_processes, stop_job
from console.services.recovery import audit_output
from infra.launcher import wait_for
from spark_runtime.progress import read_progress

TOPOLOGIES = ("wordcount", "topn")
FAULT_KIND = "kill-driver"
EPISODE_GRACE_S = 30.0  # a fault with no episode this long after its injection opened none
INJECT_TIMEOUT_S = 60.0
# How a job whose launch the host reserve refused is failed (workers/controller.py's
# "could not launch: " before console/services/controller.py's LaunchError "refused: ...").
RESERVE_REFUSAL = "could not launch: refused: "
SETTLE_S = 15.0  # between two counts (end_count)


@dataclass(frozen=True)
class DensitySettings:
    """One run's settings (`manage.py density` options)."""

    job_counts: tuple[int, ...]
    rate: float
    faults: int
    out: Path
    steady_s: float = 60.0
    episode_timeout_s: float = 300.0  # a fault's episodes not closed by then: given up
    reprotect_timeout_s: float = 180.0  # after the last fault, for promotions to be re-protected
    start_timeout_s: float = 600.0
    seed: int = 7
    policy: tuple[tuple[str, str], ...] = ()  # `--policy FIELD=VALUE`, set for the run

    def __post_init__(self):
        problems = []
        if not self.job_counts or any(not 1 <= n <= 32 for n in self.job_counts):
            problems.append("--jobs: job counts from 1 to 32, comma-separated")
        if not 1 <= self.rate <= 1000:
            problems.append("--rate: 1 to 1000 lines/s")
        if not 0 <= self.faults <= 100:
            problems.append("--faults: 0 to 100")
        if self.steady_s < 10:
            problems.append("--steady: at least 10 s")
        if problems:
            raise ValueError("; ".join(problems))


def parse_job_counts(text: str) -> tuple[int, ...]:
    """ "1,2,4,6" -> (1, 2, 4, 6); ValueError naming --jobs otherwise."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--jobs: whole numbers separated by commas, not {text!r}") from None
    if not counts:
        raise ValueError("--jobs: at least one job count")
    return counts


def process_cpu_s(pids: list[int]) -> dict[int, float]:
    """pid -> user+system CPU seconds so far, of the processes still there."""
    times = {}
    for pid in pids:
        try:
            cpu = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        times[pid] = cpu.user + cpu.system
    return times


class Density(Soak):
    """One run: the soak's cluster, then each job count in turn (module docstring)."""

    def __init__(self, settings: DensitySettings, say: Callable[[str], None], command: str):
        # The soak's harness wants its settings for the cluster's parts it shares (none of its
        # schedule is played here).
        super().__init__(
            SoakSettings(
                minutes=1,
                seed=settings.seed,
                out=settings.out,
                rate=settings.rate,
                policy=settings.policy,
            ),
            say,
            command,
        )
        self.density = settings
        self.runs: list[dict] = []

    def say(self, message: str) -> None:
        self.say_raw(f"[density {self.elapsed():.0f} s] {message}")

    def write(self, complete: bool = False) -> Path:
        """density.json as it stands (again after every job count)."""
        self.report.update(complete=complete, runs=self.runs)
        return write_report(self.out, "density.json", self.report)

    def run(self) -> dict:
        s = self.density
        self.out.mkdir(parents=True, exist_ok=True)
        with soak_services(self.out, self.say_raw) as (server, postgres, services, note):
            self.redis_server, self.postgres, self.redis_url = server, postgres, services.redis_url
            self.report = {
                "command": self.command,
                "machine": machine_description(),
                "cpu_count": psutil.cpu_count(),
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "rate": s.rate,
                "faults": s.faults,
                "steady_s": s.steady_s,
                "topologies": list(TOPOLOGIES),
                "services": {"redis": services.redis_url, "note": note},
            }
            finished = False
            try:
                self.start_cluster(services)
                self.t0 = time.time()
                for count in s.job_counts:
                    self.runs.append(self.measure_count(count))
                    self.write()
                finished = True
            finally:
                self.teardown()
                self.write(complete=finished)
        return self.report

    # --- one job count ------------------------------------------------------------------------

    def measure_count(self, count: int) -> dict:
        s = self.density
        refused: list[str] = []
        jobs = self.start_count(count, refused)
        if not jobs:  # the host reserve refused every launch: nothing to measure
            return density_report.density_run(
                jobs=count, cpu_cores=None, steady_p50_ms=None, episodes=[], audits=[],
                standbys=(0, 0), faults=[], refused=refused,
            )  # fmt: skip
        try:
            config = Policy.current().to_config()
            time.sleep(config.warmup_s)
            self.say(f"{count} job(s): steady window of {s.steady_s:g} s")
            start = time.time()
            rows = self.read_processes()
            cpu_before = process_cpu_s([row.pid for row in rows])
            kinds = soak_processes.classify(rows, self.replica_roles())
            time.sleep(s.steady_s)
            end = time.time()
            cpu_after = process_cpu_s(list(cpu_before))
            used = sum(cpu_after[pid] - cpu_before[pid] for pid in cpu_after)
            cpu_cores = used / (end - start)
            cpu_by_kind = density_report.cores_by_kind(cpu_before, cpu_after, kinds, end - start)
            standbys = self.standbys(jobs)
            steady_p50 = self.steady_p50(jobs, start, end)
            self.say(f"{count} job(s): {cpu_cores:.2f} cores, steady p50 {steady_p50} ms, "
                     f"hot standbys {standbys[0]}/{standbys[1]}")  # fmt: skip
            self.say("cores by kind: " + ", ".join(f"{k} {v:g}" for k, v in cpu_by_kind.items()))
            faults = [self.inject_and_wait(jobs[i % len(jobs)], i) for i in range(s.faults)]
            self.wait_reprotected(jobs)
            episodes = self.episode_figures(jobs)
            audits = self.audit_jobs(jobs)
        finally:
            self.end_count(jobs)
        row = density_report.density_run(
            jobs=count,
            cpu_cores=cpu_cores,
            cpu_by_kind=cpu_by_kind,
            steady_p50_ms=steady_p50,
            episodes=episodes,
            audits=audits,
            standbys=standbys,
            faults=faults,
            refused=refused,
        )
        rec, rep = row["recovery_s"], row["reprotect_s"]
        self.say(f"{count} job(s) done: recovery p50 {rec['p50']} p99 {rec['p99']} s "
                 f"({rec['count']}), re-protect p50 {rep['p50']} p99 {rep['p99']} s "
                 f"({rep['count']}), lost {row['lost']}, dup. {row['duplicates']}")  # fmt: skip
        return row

    def start_count(self, count: int, refused: list[str]) -> list[Job]:
        """Create `count` jobs at once and return them once they run, less those whose launch
        the host reserve refused (added to `refused`, with the reason)."""
        stamp = time.strftime("%H%M%S")
        jobs = [
            create_job(
                name=f"density-{count}-{index}-{stamp}",
                topology=TOPOLOGIES[index % len(TOPOLOGIES)],
                strategy=Job.Strategy.ADAPTIVE,
                params={"rate": self.density.rate, "seed": self.density.seed + index},
                user=soak_user(),
            )
            for index in range(count)
        ]
        self.jobs += jobs
        self.say(f"{count} job(s) created: " + ", ".join(j.name for j in jobs))
        running = list(jobs)

        def all_running() -> bool:
            close_old_connections()
            for job in list(running):
                job.refresh_from_db(fields=["status", "status_reason"])
                if job.status != Job.Status.FAILED:
                    continue
                if not job.status_reason.startswith(RESERVE_REFUSAL):
                    raise RuntimeError(f"job {job.name} failed to start: {job.status_reason}")
                # The host reserve (hold_host_reserve) had no room for it: a result, not an error.
                running.remove(job)
                refused.append(f"{job.name}: {job.status_reason}")
                self.say(f"launch refused: {job.name}: {job.status_reason}")
            return all(job.status == Job.Status.RUNNING for job in running)

        wait_for(all_running, self.density.start_timeout_s, f"{count} jobs to run", poll_s=2)
        self.say(f"{len(running)} job(s) running")
        return running

    def end_count(self, jobs: list[Job]) -> None:
        """Stop the count's jobs and end their processes (stage processes outlive an agent's
        kill request when the agent is slow), so the next count starts on an idle cluster."""
        for job in jobs:
            stop_job(job, "density count over")

        def stopped() -> bool:
            close_old_connections()
            for job in jobs:
                job.refresh_from_db(fields=["status"])
            return all(not job.is_live for job in jobs)

        try:
            wait_for(stopped, 120, "the jobs to stop", poll_s=1)
        finally:
            ended = kill_job_processes({job.key for job in jobs})
            self.say(f"{len(jobs)} job(s) stopped; {ended} leftover process(es) ended")
        # The host reserve judges the mean of each agent's newest samples, one a second: right
        # after a count they still hold its processes, and the next count's launches were all
        # refused on them ("cpu -5% free").
        self.say(f"{SETTLE_S:g} s for the agents' samples to leave the ended jobs behind")
        time.sleep(SETTLE_S)

    # --- measurements -------------------------------------------------------------------------

    def standbys(self, jobs: list[Job]) -> tuple[int, int]:
        """(stages with a running hot standby, stages the policy gives one) over the jobs."""
        kept = wanted = 0
        for job in jobs:
            stages = set(
                Operator.objects.filter(job=job, mode=Operator.Mode.ACTIVE)
                .exclude(stage="")
                .values_list("stage", flat=True)
            )
            running = set(
                Replica.objects.filter(
                    job=job, role=Replica.Role.STANDBY, state__in=LIVE_REPLICA_STATES
                ).values_list("stage", flat=True)
            )
            wanted += len(stages)
            kept += len(stages & running)
        return kept, wanted

    def steady_p50(self, jobs: list[Job], start: float, end: float) -> float | None:
        """The events-weighted p50 output latency (ms) of all the jobs over [start, end)."""
        client = redis_client()
        try:
            records = [
                record
                for job in jobs
                for record in read_progress(client, job.key, start - 5, count=20_000)
            ]
        finally:
            client.close()
        return steady_figures(records, start, end, input_stage="")["p50_ms"]

    def inject_and_wait(self, job: Job, number: int) -> dict:
        """A kill-driver into the job's key operator (its stage's primary; a stage with a
        running standby first), then wait until the episodes it opened are closed."""
        standby_stages = set(
            Replica.objects.filter(
                job=job, role=Replica.Role.STANDBY, state__in=LIVE_REPLICA_STATES
            ).values_list("stage", flat=True)
        )
        stage = sorted(standby_stages)[0] if standby_stages else None
        operator = key_operator(job, stage)
        row = {"number": number, "job": job.name, "operator": operator, "kind": FAULT_KIND}
        try:
            fault = request_fault(
                job, FAULT_KIND, target_operator=operator, requested_by=soak_user()
            )
        except FaultRefused as exc:
            row["outcome"] = f"refused: {exc}"
            self.say(f"fault #{number} on {job.name}/{operator}: {row['outcome']}")
            return row

        def injected() -> bool:
            close_old_connections()
            fault.refresh_from_db()
            return fault.outcome != FaultInjection.Outcome.PENDING

        wait_for(injected, INJECT_TIMEOUT_S, f"fault #{number} to be injected", poll_s=0.5)
        row["outcome"] = fault.outcome
        self.say(f"fault #{number}: {FAULT_KIND} on {job.name}/{operator}: {fault.outcome}")
        if fault.outcome != FaultInjection.Outcome.INJECTED:
            row["outcome"] += f": {fault.outcome_detail}"
            return row
        since = fault.injected_at.timestamp()
        while True:
            close_old_connections()
            episodes = list(fault.episodes.all())
            waited = time.time() - since
            if episodes and all(e.watched_s is not None for e in episodes):
                break
            if not episodes and waited > EPISODE_GRACE_S:
                break
            if waited > self.density.episode_timeout_s:
                row["note"] = f"episodes not closed within {self.density.episode_timeout_s:g} s"
                break
            time.sleep(1)
        row["episodes"] = [
            {"episode": e.pk, "action": e.action, "recovery_s": e.recovery_time_s,
             "downtime_s": e.downtime_s, "phases_s": phase_seconds(e.phases)}
            for e in episodes
        ]  # fmt: skip
        times = ", ".join(f"{e.action} {e.recovery_time_s} s" for e in episodes) or "no episode"
        self.say(f"fault #{number} measured: {times}")
        return row

    def wait_reprotected(self, jobs: list[Job]) -> None:
        """Up to reprotect_timeout_s for every promotion of the jobs to have its standby back."""
        deadline = time.time() + self.density.reprotect_timeout_s
        while time.time() < deadline:
            close_old_connections()
            open_ = [
                e
                for job in jobs
                for e in job.recoveries.filter(action="promote", reprotect_s__isnull=True)
            ]
            if not open_:
                return
            time.sleep(2)
        self.say(f"promotions not re-protected within {self.density.reprotect_timeout_s:g} s")

    def episode_figures(self, jobs: list[Job]) -> list[density_report.EpisodeFigures]:
        """Every recovery episode of the jobs (the faults' and any the load caused)."""
        return [
            density_report.EpisodeFigures(
                job=job.name,
                stage=e.stage,
                action=e.action,
                recovery_s=e.recovery_time_s,
                reprotect_s=e.reprotect_s,
                phases=phase_seconds(e.phases),
            )
            for job in jobs
            for e in job.recoveries.order_by("detected_at")
        ]

    def audit_jobs(self, jobs: list[Job]) -> list[dict]:
        """Each job's output against the plain-Python reference of its input."""
        client = redis_client()
        try:
            audits = []
            for job in jobs:
                comparison = audit_output(job, client)
                audits.append({
                    "job": job.name,
                    "lost": comparison.lost if comparison else None,
                    "duplicates": comparison.duplicates if comparison else None,
                    "cells": comparison.cells if comparison else None,
                })  # fmt: skip
                self.say(f"audit {job.name}: {audits[-1]}")
            return audits
        finally:
            client.close()
