"""CPU priority of a stage or spare process: its nice level, and its autogroup's.

Every stage and spare starts in a session of its own (spark_runtime/launch.py), so that
a kill reaches its whole process tree (driver, JVM, Python workers). On Linux with
`kernel.sched_autogroup_enabled = 1` (Debian's default) the scheduler first shares the CPU
fairly between autogroups, one per session, and only then between the processes of a group by
their nice levels. A nice level alone therefore did nothing between replicas: a spare at nice 19
warming up its JVM got as much CPU as a primary at nice 0 (measured: docs/RESULTS.md, "CPU
priority"). The autogroup has a nice level of its own (`/proc/self/autogroup`, sched(7));
setting both makes a lower priority hold across sessions too.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from pathlib import Path

log = logging.getLogger(__name__)

AUTOGROUP = "/proc/self/autogroup"
AUTOGROUP_TRIES, AUTOGROUP_RETRY_S = 10, 0.11  # the kernel's limit: one change per 100 ms
CAP_SYS_NICE = 23  # capability(7)


def lowest_nice() -> int:
    """The lowest nice level (highest priority) this process may set: -20 with CAP_SYS_NICE
    (root has it), else 20 - RLIMIT_NICE (sched(7)); any level above its current one is allowed
    anyway."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or _has_cap_sys_nice():
        return -20
    return max(-20, 20 - soft)


def _has_cap_sys_nice() -> bool:
    try:
        with open("/proc/self/status") as status:
            effective = next(line for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return os.geteuid() == 0
    return bool(int(effective.split()[1], 16) >> CAP_SYS_NICE & 1)


def can_raise_priority() -> bool:
    """Whether this process may go back to nice 0 after lowering its priority: with
    CAP_SYS_NICE (root has it), or an RLIMIT_NICE of 20 (the lowest nice allowed is 20 - limit).
    A process that cannot should not lower a priority it will need again."""
    return lowest_nice() <= 0


def allowed_nice(level: int, current: int, lowest: int) -> int:
    """The level to set when `level` is asked for at `current`: the process may go down (to
    a higher priority) only as far as `lowest`. A promoted standby at nice 5 whose limit stops
    it short of a primary's -5 goes to 0 rather than stay at 5, below the standby catching up
    beside it."""
    if level >= current:
        return level
    return max(level, min(lowest, current))


def set_group_nice(level: int) -> int:
    """Set the nice level of this process group and, when this process leads its session, of
    the session's autogroup, as far as this process may (`allowed_nice`: a level above the
    lowest it may take is raised to that); returns the nice level in force."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    target = allowed_nice(level, current, lowest_nice())
    if target != level:
        log.warning(
            "cannot set nice %s (needs CAP_SYS_NICE or RLIMIT_NICE %s); setting %s",
            level,
            20 - level,
            target,
        )
    try:
        os.setpriority(os.PRIO_PGRP, 0, target)
    except PermissionError:  # another process of the group, say, that this one may not renice
        log.warning("cannot set nice %s; staying at %s", target, current)
    # The autogroup is the whole session's: only its leader (a process a node agent started)
    # may change it, never a process that shares a session with others (a test runner).
    if os.getsid(0) == os.getpid():
        set_autogroup_nice(target)
    return os.getpriority(os.PRIO_PROCESS, 0)


def set_session_nice(pid: int, level: int) -> int:
    """Set the nice level of the session that process `pid` leads (its process group and its
    autogroup), from another process: a launcher gives a child its priority before the child
    has run a line, so a slow start-up (imports) already runs at it. As far as this process
    may (`allowed_nice`); returns the level set."""
    target = allowed_nice(level, os.getpriority(os.PRIO_PROCESS, pid), lowest_nice())
    try:
        os.setpriority(os.PRIO_PGRP, pid, target)
    except (PermissionError, ProcessLookupError) as exc:
        log.warning("cannot set nice %s for process %s: %s", target, pid, exc)
        return os.getpriority(os.PRIO_PROCESS, 0)
    set_autogroup_nice(target, f"/proc/{pid}/autogroup")
    return target


def autogroup_nice(path: str = AUTOGROUP) -> int | None:
    """The nice level of this session's autogroup (`path`: another process's), or None where
    there is none to set: a kernel without autogroups, or a session that never left init's
    root group (a service's process tree: the file reads empty there, sched(7))."""
    try:
        fields = Path(path).read_text().split()  # "/autogroup-123 nice 0"
    except FileNotFoundError:
        return None
    return int(fields[-1]) if fields else None


def set_autogroup_nice(level: int, path: str = AUTOGROUP) -> None:
    """Set the nice level of this session's autogroup (`path`: another process's, to set that
    one's session; nothing where the kernel has none).
    Without CAP_SYS_ADMIN the kernel takes one autogroup change per 100 ms on the whole machine
    and refuses the others with EAGAIN (kernel/sched/autogroup.c): a promotion and the spares
    renicing at the same moment would otherwise leave a level unset, so it tries again."""
    for attempt in range(AUTOGROUP_TRIES):
        try:
            with open(path, "w") as autogroup:
                autogroup.write(str(level))
            return
        except FileNotFoundError:
            return  # not Linux, a kernel built without autogroups, or the process has ended
        except BlockingIOError:  # EAGAIN: another autogroup changed less than 100 ms ago
            if attempt + 1 < AUTOGROUP_TRIES:
                time.sleep(AUTOGROUP_RETRY_S)
                continue
            log.warning("cannot set the autogroup's nice to %s: busy", level)
        except OSError as exc:  # EPERM/EACCES without CAP_SYS_NICE, as for setpriority
            log.warning("cannot set the autogroup's nice to %s: %s", level, exc)
            return
