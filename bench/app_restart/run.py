"""`manage.py bench --topology NAME@VERSION --strategies cold-restart,restart-all`: an existing
app's recovery from a killed driver, restarted cold by a `spark-submit` loop (cold.py) and by
Backstop, whose restart takes over a warm spare (docs/JOBS.md, "A warm spare takes over a failed
app"), one after the other in one run, on the same workload and fault schedule.

Per strategy: fresh input, output and checkpoint directories; an input writer adds one click
file per FILE_EVERY_S; once the app has completed a batch and the warm-up has passed, `faults`
kills of its driver process `interval` seconds apart (SIGKILL of its process group: by the loop,
or Backstop's kill-driver fault through `request_fault`). Each kill is timed when the process is
seen gone, and its recovery is the first batch the query completes after it
(workload.first_commit_after). After the last fault and a tail, the input stops, and the run
waits until the app's committed windows equal the plain-Python reference (workload.exactness).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from bench.app_restart import workload
from bench.app_restart.cold import SparkSubmitLoop
from bench.results import write_report, write_subsection
from bench.strategy.run import BenchCluster, bench_user, sleep_until, wait_status
from console.models import Job
from console.redis import redis_client
from console.services.faults import request_fault
from console.services.jobs import JobRequestError, create_job, kill_job_processes, stop_job
from infra.launcher import wait_for
from infra.processes import stage_processes
from spark_runtime import keys as data_keys
from spark_runtime.apps import APP_OPERATOR
from spark_runtime.jobdef import registered_app

COLD = "cold-restart"
WARM = "restart-all"
APP_STRATEGIES = (COLD, WARM)
# One file of 10 clicks every 3 s: the app reads at most 2 files per 1 s trigger, and its
# batches took 5-16 s each on the 2 shared cores (load average near 30), so 1 file per second
# outran it.
FILE_EVERY_S = 3.0
RESULTS_SECTION = "## Existing apps: a warm restart against spark-submit (manage.py bench)"
# How long a run waits for the app's first batch, a kill to be seen, a recovery, exact output.
FIRST_BATCH_TIMEOUT_S = 600.0
KILL_SEEN_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 240.0
EXACT_TIMEOUT_S = 300.0
# How long the Backstop run waits for an idle warm spare on the app's node before its first
# fault (a spare starts when the app's job asks for it and warms up in about a minute here).
SPARE_READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class AppBenchSettings:
    """What an app benchmark runs: the registered app, its `--args` template, the strategies
    (from APP_STRATEGIES), and the fault schedule."""

    topology: str
    args: str = workload.DEFAULT_ARGS
    strategies: tuple[str, ...] = APP_STRATEGIES
    faults: int = 3
    interval_s: float = 30.0
    warmup_s: float = 20.0
    out: Path = Path("var/bench")

    def __post_init__(self):
        if registered_app(self.topology) is None:
            raise ValueError(
                f"--topology: {self.topology!r} is not a registered app (NAME@VERSION)"
            )
        unknown = [s for s in self.strategies if s not in APP_STRATEGIES]
        if unknown or not self.strategies:
            raise ValueError(
                f"--strategies: an app's runs are {', '.join(APP_STRATEGIES)}, not {unknown}"
            )
        if not 1 <= self.faults <= 10:
            raise ValueError("--faults: an app benchmark needs 1 to 10 faults")
        missing = [p for p in ("in", "out") if "{" + p + "}" not in self.args]
        if missing:
            raise ValueError(
                f"--args: must place the run's directories {{in}} and {{out}} (missing "
                f"{', '.join('{' + p + '}' for p in missing)})"
            )
        workload.expand_args(self.args, {p: p for p in workload.PLACEHOLDERS})


class InputWriter:
    """Writes click file after click file, one per FILE_EVERY_S, into `directory`, until
    stopped; `written` holds every click written."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.written: list[dict] = []
        self.files = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._write, name="app-input", daemon=True)

    def add_file(self) -> None:
        rows = workload.clicks(self.files)
        workload.write_input(self.directory, self.files, rows)
        self.written += rows
        self.files += 1

    def _write(self) -> None:
        while not self.stopping.wait(FILE_EVERY_S):
            self.add_file()

    def start(self, first_files: int = 3) -> None:
        for _ in range(first_files):
            self.add_file()
        self.thread.start()

    def stop(self) -> None:
        """No more files (again: nothing)."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()


def wait_gone(pid: int) -> float:
    """When process `pid` was seen gone (epoch seconds)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(KILL_SEEN_TIMEOUT_S)
    return time.time()


def wait_commit(checkpoint: Path, after: float, timeout_s: float) -> float | None:
    """The first completed batch of the query after `after`, waited for up to `timeout_s`."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        done = workload.first_commit_after(checkpoint, after)
        if done is not None:
            return done
        time.sleep(0.05)
    return None


class ColdApp:
    """The app under a `spark-submit` loop."""

    def __init__(self, app_file: Path, args: list[str], log_path: Path):
        self.loop = SparkSubmitLoop(app_file, args, log_path)

    def start(self) -> None:
        self.loop.start()

    def kill(self) -> dict:
        pid = self.loop.pid()
        if pid is None:
            raise RuntimeError("spark-submit is not running at the fault")
        self.loop.kill()
        return {"pid": pid, "killed_at": wait_gone(pid)}

    def after_restart(self, killed_at: float) -> dict:
        return {"warm_spare": None, "process_started_before_kill": False}

    def stop(self) -> None:
        self.loop.stop()


class BackstopApp:
    """The app as a Backstop job under restart-all (its restarts take over warm spares)."""

    def __init__(self, topology: str, args: list[str], say):
        self.user = bench_user()
        self.client = redis_client()
        self.say = say
        try:
            self.job = create_job(
                name=f"bench-app-{time.strftime('%H%M%S')}",
                topology=topology,
                strategy=WARM,
                params={},
                user=self.user,
                args=args,
            )
        except JobRequestError as exc:
            raise RuntimeError(f"{WARM}: the job was refused: {exc}") from None

    def start(self) -> None:
        wait_status(self.job, (Job.Status.RUNNING, Job.Status.FAILED), 300, "the app's job")
        if self.job.status != Job.Status.RUNNING:
            raise RuntimeError(f"the app's job failed to start: {self.job.status_reason}")

    def replica_entries(self) -> list[dict]:
        raw = self.client.hgetall(data_keys.replicas(self.job.key))
        return [json.loads(value) for value in raw.values()]

    def app_node(self) -> str:
        return max(self.replica_entries(), key=lambda e: e.get("started_at", 0))["node"]

    def idle_spares(self, node: str) -> int:
        entries = self.client.hvals(data_keys.spares(node))
        return sum(1 for raw in entries if json.loads(raw).get("state") == "idle")

    def wait_for_spare(self) -> float | None:
        """Seconds until an idle warm spare is on the app's node (None: not within the
        timeout; the faults are injected anyway and say whether a spare took over)."""
        started, node = time.time(), self.app_node()
        try:
            wait_for(lambda: self.idle_spares(node) > 0, SPARE_READY_TIMEOUT_S, "a warm spare")
        except (TimeoutError, RuntimeError, AssertionError):
            return None
        return time.time() - started

    def kill(self) -> dict:
        [process] = stage_processes(job=self.job.key)
        spare_idle = self.idle_spares(self.app_node())
        request_fault(self.job, "kill-driver", target_operator=APP_OPERATOR, requested_by=self.user)
        return {"pid": process.pid, "killed_at": wait_gone(process.pid), "idle_spares": spare_idle}

    def after_restart(self, killed_at: float) -> dict:
        """Which process runs the app now: a warm spare's (named in its replica entry, and
        started before the kill) or a cold one."""
        newest = max(self.replica_entries(), key=lambda e: e.get("started_at", 0))
        try:
            created = psutil.Process(int(newest["pid"])).create_time()
        except (psutil.NoSuchProcess, KeyError, ValueError):
            created = None
        return {
            "replica": newest.get("replica"),
            "warm_spare": newest.get("warm_spare"),
            "process_started_before_kill": created is not None and created < killed_at,
        }

    def stop(self) -> None:
        stop_job(self.job, "benchmark run over")
        try:
            wait_status(self.job, (Job.Status.STOPPED, Job.Status.FAILED), 60, "the job to stop")
        finally:
            kill_job_processes({self.job.key})
            self.client.close()


def run_strategy(bench: AppBenchSettings, strategy: str, say) -> dict:
    """One strategy's run of the app through the workload and the faults; its bench.json run."""
    base = (bench.out / "runs" / strategy).resolve()
    directories = {p: str(base / p) for p in workload.PLACEHOLDERS}
    args = workload.expand_args(bench.args, directories)
    checkpoint = Path(directories["checkpoint"])
    writer = InputWriter(Path(directories["in"]))
    writer.start()
    if strategy == COLD:
        definition = registered_app(bench.topology)
        app_file = base / Path(definition.path).name
        app_file.write_text(definition.source)
        app = ColdApp(app_file, args, base / "spark-submit.log")
    else:
        app = BackstopApp(bench.topology, args, say)
    faults, spare_ready_s = [], None
    try:
        launched = time.time()
        app.start()
        first = wait_commit(checkpoint, 0.0, FIRST_BATCH_TIMEOUT_S)
        if first is None:
            raise RuntimeError(f"{strategy}: the app completed no batch in {checkpoint}")
        say(f"      first batch {first - launched:.1f} s after the start")
        if isinstance(app, BackstopApp):
            spare_ready_s = app.wait_for_spare()
            say(f"      warm spare ready: {spare_ready_s and round(spare_ready_s)} s")
        t0 = time.time() + bench.warmup_s
        for number in range(bench.faults):
            sleep_until(t0 + number * bench.interval_s)
            kill = app.kill()
            done = wait_commit(checkpoint, kill["killed_at"], RECOVERY_TIMEOUT_S)
            recovery = None if done is None else round(done - kill["killed_at"], 2)
            fault = {**kill, "recovery_s": recovery, **app.after_restart(kill["killed_at"])}
            faults.append(fault)
            say(f"      kill {number + 1}/{bench.faults}: first batch after "
                f"{recovery} s (warm spare: {fault['warm_spare']})")  # fmt: skip
        sleep_until(t0 + bench.faults * bench.interval_s)
        writer.stop()
        expected = workload.closed_windows(writer.written)

        def caught_up() -> bool:
            return workload.exactness(expected, workload.committed_rows(Path(directories["out"])))[
                "exact"
            ]

        try:
            wait_for(caught_up, EXACT_TIMEOUT_S, "exact output", poll_s=1)
        except (TimeoutError, RuntimeError, AssertionError) as exc:
            say(f"      output not exact: {exc}")
        outcome = workload.exactness(expected, workload.committed_rows(Path(directories["out"])))
    finally:
        writer.stop()
        app.stop()
    return {
        "strategy": strategy,
        "args": args,
        "input_files": writer.files,
        "clicks": len(writer.written),
        "spare_ready_s": spare_ready_s and round(spare_ready_s, 1),
        "faults": faults,
        "recovery": workload.summary([f["recovery_s"] for f in faults]),
        "output": outcome,
    }


def run_app_bench(bench: AppBenchSettings, say) -> dict:
    """Every strategy of `bench`, one after the other; the result bench.json holds. The
    Backstop run has its cluster (bench.strategy.run.BenchCluster) for its duration only: the
    `spark-submit` loop runs on a machine without it."""
    runs = []
    load_at_start = os.getloadavg()
    for strategy in bench.strategies:
        say(f"   {strategy}: {bench.topology}, kill-driver x{bench.faults}, "
            f"{bench.interval_s:g} s apart")  # fmt: skip
        if strategy == COLD:
            runs.append(run_strategy(bench, strategy, say))
            continue
        with BenchCluster(bench.out / "logs", say):
            runs.append(run_strategy(bench, strategy, say))
    means = {run["strategy"]: run["recovery"]["mean_s"] for run in runs}
    settings = {
        **asdict(bench),
        "out": str(bench.out),
        "machine": machine(),
        # The machine is shared: how busy it was says how far the figures are from an idle one.
        "loadavg_start": [round(x, 2) for x in load_at_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    return {
        "kind": "app-restart",
        "settings": settings,
        "runs": runs,
        "warm_to_cold": workload.warm_to_cold(means.get(WARM), means.get(COLD)),
    }


def machine() -> str:
    """The machine, as RESULTS.md names it."""
    memory = psutil.virtual_memory().total // 2**30
    return f"{psutil.cpu_count()} cores, {memory} GiB, {platform.system()}"


def to_markdown(result: dict) -> str:
    """bench.md's table: per strategy, each kill's recovery and the output's exactness."""
    lines = [
        "| run | recovery per kill (s) | mean (s) | taken over by a warm spare | windows | lost | "
        "duplicated | wrong |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        per_kill = ", ".join(
            "-" if f["recovery_s"] is None else f"{f['recovery_s']:.1f}" for f in run["faults"]
        )
        spares = sum(1 for f in run["faults"] if f["warm_spare"])
        out = run["output"]
        label = "spark-submit loop (cold)" if run["strategy"] == COLD else "Backstop, restart-all"
        lines.append(
            f"| {label} | {per_kill} | {run['recovery']['mean_s']} | {spares} of "
            f"{len(run['faults'])} | {out['windows']} | {out['lost']} | {out['duplicated']} | "
            f"{out['wrong']} |"
        )
    ratio = result.get("warm_to_cold")
    if ratio is not None:
        lines += [
            "",
            f"Backstop's mean recovery: {ratio:.0%} of the cold restart's (goal: <= 40%).",
        ]
    return "\n".join(lines) + "\n"


def write_outputs(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_report(out, "bench.json", result)
    (out / "bench.md").write_text(to_markdown(result))


def write_results(result: dict, command: str) -> str:
    """Put the run's table and its command into docs/RESULTS.md; returns where."""
    settings = result["settings"]
    subsection = (
        f"{settings['topology']}, kill-driver x{settings['faults']} "
        f"{settings['interval_s']:g} s apart"
    )
    load = ""
    if "loadavg_start" in settings:
        load = (
            f"; load average {', '.join(map(str, settings['loadavg_start']))} at the start, "
            f"{', '.join(map(str, settings['loadavg_end']))} at the end"
        )
    body = (
        f"`{command}` on {time.strftime('%Y-%m-%d')} ({settings['machine']}{load}). Recovery: "
        "from the killed driver seen gone to the first batch its query completed after the "
        "restart (its checkpoint's next commit file).\n\n" + to_markdown(result)
    )
    write_subsection(RESULTS_SECTION, subsection, body)
    return f"docs/RESULTS.md / {subsection}"
