"""CPU priority of a stage or spare process: its nice level, and its autogroup's.

Node agents start every stage and spare in a session of its own (`start_new_session`), so that
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

log = logging.getLogger(__name__)

AUTOGROUP = "/proc/self/autogroup"
CAP_SYS_NICE = 23  # capability(7)


def can_raise_priority() -> bool:
    """Whether this process may go back to nice 0 after lowering its priority: with
    CAP_SYS_NICE (root has it), or an RLIMIT_NICE of 20 (the lowest nice allowed is 20 - limit).
    A process that cannot should not lower a priority it will need again."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or soft >= 20:
        return True
    try:
        with open("/proc/self/status") as status:
            effective = next(line for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return os.geteuid() == 0
    return bool(int(effective.split()[1], 16) >> CAP_SYS_NICE & 1)


def set_group_nice(level: int) -> int:
    """Set the nice level of this process group and, when this process leads its session, of
    the session's autogroup; returns the nice level in force. Raising the priority again needs
    CAP_SYS_NICE: without it the process stays where it was and reports the level it has."""
    try:
        os.setpriority(os.PRIO_PGRP, 0, level)
    except PermissionError:
        log.warning("cannot set nice %s (needs CAP_SYS_NICE); staying at %s", level, os.nice(0))
    # The autogroup is the whole session's: only its leader (a process a node agent started)
    # may change it, never a process that shares a session with others (a test runner).
    if os.getsid(0) == os.getpid():
        set_autogroup_nice(level)
    return os.getpriority(os.PRIO_PROCESS, 0)


def set_autogroup_nice(level: int) -> None:
    """Set the nice level of this session's autogroup (nothing where the kernel has none)."""
    try:
        with open(AUTOGROUP, "w") as autogroup:
            autogroup.write(str(level))
    except FileNotFoundError:
        return  # not Linux, or a kernel built without autogroups
    except OSError as exc:  # EPERM/EACCES without CAP_SYS_NICE, as for setpriority
        log.warning("cannot set the autogroup's nice to %s: %s", level, exc)
