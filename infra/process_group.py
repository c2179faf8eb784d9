"""A group of child processes kept running like a process manager keeps them: the demo's, the
benchmarks' and the tests' Redis, broker, Celery workers and web server (infra/launcher.py
starts them). No Django imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spark_runtime.cpu_priority import set_session_nice

# A child that exits sooner than this after its start counts as crashing: its next start waits.
QUICK_EXIT_S = 30.0
RESTART_DELAY_CAP_S = 30.0


@dataclass
class Child:
    """One process of a ProcessGroup, with what it takes to start it again."""

    name: str
    argv: list[str]
    env: dict
    proc: subprocess.Popen
    started_at: float
    restarts: int = 0
    quick_exits: int = 0  # consecutive exits within QUICK_EXIT_S of a start
    exited_at: float | None = None  # when the group saw it exit (None while it runs)
    nice: int | None = None  # its session's CPU priority (None: the normal level)
    # time.monotonic() until which an exit is not restarted (`ProcessGroup.hold`); None: no hold
    held_until: float | None = None


@dataclass
class ProcessGroup:
    """Child processes started together, kept running, stopped together (SIGTERM, then SIGKILL).

    Like a process manager (compose's `restart: unless-stopped`, systemd's `Restart=always`), the
    group starts again a child that exits on its own: a Celery worker can stop for good on a
    broker error (kombu 5.7 does on a Redis restart; docs/RELIABILITY.md). A child that keeps
    exiting soon after its start waits longer each time (1 s doubling up to 30 s). `kill` and
    `stop` end children for good. `hold` keeps a child down on purpose for a while (the
    kafka-broker fault): it is started again when the hold ends (or at `release`).
    """

    log_dir: Path
    say: Callable[[str], None] | None = print  # restarts are reported there and in launcher.log
    children: dict[str, Child] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None
    # Threads that act on children (a Kafka broker's keeper): stopped before the children.
    _keepers: list = field(default_factory=list)

    def start(
        self, name: str, argv: list[str], env: dict | None = None, nice: int | None = None
    ) -> subprocess.Popen:
        """Start `name` (its output in log_dir/name.log) and keep it running; `nice`: the CPU
        priority of its session (spark_runtime.cpu_priority), given at every start."""
        with self._lock:
            child = Child(name, argv, {**os.environ, **(env or {})}, None, 0.0, nice=nice)
            self._spawn(child)
            self.children[name] = child
        self._watch()
        return child.proc

    def _spawn(self, child: Child) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{child.name}.log", "ab")  # noqa: SIM115 (kept open for the child)
        child.proc = subprocess.Popen(
            child.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child.env,
            start_new_session=True,  # Ctrl-C reaches us, and we stop children in order
        )
        child.started_at = time.monotonic()
        if child.nice is not None:
            set_session_nice(child.proc.pid, child.nice)

    def restart_exited(self) -> list[str]:
        """Start again each child that has exited and waited out its delay; returns their names."""
        restarted = []
        with self._lock:
            for child in self.children.values():
                code = child.proc.poll()
                now = time.monotonic()
                if code is None or self._stopping.is_set():
                    if code is None and child.held_until is not None and now >= child.held_until:
                        child.held_until = None  # held, but it never exited: the hold is over
                    continue
                if child.held_until is not None:
                    if now < child.held_until:
                        continue  # kept down on purpose
                    # An exit asked for: not a crash, so no quick-exit delay.
                    child.held_until, child.exited_at, child.quick_exits = None, now, 0
                if child.exited_at is None:
                    child.exited_at = now
                    quick = now - child.started_at < QUICK_EXIT_S
                    child.quick_exits = child.quick_exits + 1 if quick else 0
                delay_s = min(RESTART_DELAY_CAP_S, 2.0 ** (child.quick_exits - 1))
                if child.quick_exits and now - child.exited_at < delay_s:
                    continue
                child.exited_at = None
                child.restarts += 1
                self._spawn(child)
                restarted.append(child.name)
                self._report(
                    f"restarted {child.name} (it exited with code {code}; restart {child.restarts})"
                )
        return restarted

    def hold(self, name: str, seconds: float, sig: int | None = None) -> subprocess.Popen:
        """Keep `name` down for `seconds`: if it exits before they are over, it is started again
        only then (not counted as a crash). With `sig`, send its process group that signal now
        (SIGTERM, SIGKILL): the way to take a child down for a while. Returns the process held."""
        with self._lock:
            child = self.children[name]
            child.held_until = time.monotonic() + seconds
            proc = child.proc
        self._report(f"holding {name} down for {seconds:g} s (pid {proc.pid})")
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        return proc

    def release(self, name: str) -> subprocess.Popen:
        """End `name`'s hold now: started again at once if it is down. Returns its process."""
        with self._lock:
            child = self.children[name]
            if child.held_until is not None:
                child.held_until = time.monotonic()
        self.restart_exited()
        with self._lock:
            return self.children[name].proc

    def _report(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.log_dir / "launcher.log", "a") as log:
            log.write(f"[{stamp}] {message}\n")
        if self.say is not None:
            self.say(message)

    def _watch(self) -> None:
        if self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch_loop, name="process-group", daemon=True)
        self._watcher.start()

    def _watch_loop(self) -> None:
        while not self._stopping.wait(1.0):
            self.restart_exited()

    def kill(self, name: str) -> None:
        """SIGKILL `name` and its process group, for good (it is not restarted)."""
        with self._lock:
            child = self.children.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=30)

    def keep(self, keeper):
        """Stop `keeper` (anything with a `stop()`) when the group stops, before its children."""
        self._keepers.append(keeper)
        return keeper

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every child, newest first, then SIGKILL those still running after `grace_s`."""
        for keeper in reversed(self._keepers):
            keeper.stop()
        self._keepers.clear()
        self._stopping.set()
        with self._lock:
            children = list(reversed(self.children.values()))
            self.children.clear()
        for child in children:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
