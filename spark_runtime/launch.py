"""The one launcher of stage processes: `python -m MODULE ARGS` in a session of its own.

Every process that runs the data plane's code on a node starts here: a stage replica and a warm
spare (node agents, workers/node/, and the local runner, runner.py), the class-data archive's
builder (class_sharing.py), the input generator and the node agents' CPU hogs. What they share:

- this interpreter, `-m` the module;
- a session (and process group) of its own: a kill of the group takes the JVM and the Python
  workers down with the driver, and a restart of whoever started it does not take it down;
- the stage environment (stage_env.py: the data plane's variables, never the console's
  secrets), plus what the caller adds;
- its output appended to its log file, or discarded;
- a scratch directory of its own for its temporary files, removed once it is gone
  (scratch.py: Spark leaves them behind when a fault kills a driver);
- optionally a lower CPU priority, set in the child after `setsid` and before it runs a line:
  the nice level of its group and of its session's autogroup (cpu_priority.py: a nice level
  alone does nothing across sessions).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from spark_runtime.cpu_priority import set_group_nice
from spark_runtime.env import var_dir
from spark_runtime.scratch import claim, scratch_environment, sweep
from spark_runtime.stage_env import stage_environment

# The entry points of a stage replica and of a warm spare (infra.processes finds them by these).
STAGE_MODULE = "spark_runtime.stage"
SPARE_MODULE = "spark_runtime.spare"
# The class-data archive's builder (spark_runtime/class_sharing.py): a driver JVM of its own
# for about two minutes when a machine has no archive yet.
ARCHIVE_BUILDER_MODULE = "spark_runtime.class_sharing_build"

log = logging.getLogger(__name__)


def start_stage_process(
    module: str,
    args: Sequence[str],
    log_path: Path | None,
    *,
    env_overrides: Mapping[str, str] | None = None,
    nice: int = 0,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen:
    """Start `python -m module args...` in a new session and return its Popen (the caller reaps
    it). Its stdout and stderr are appended to `log_path` (its directory created), or discarded
    when `log_path` is None; its environment is `stage_environment(**env_overrides)`; a non-zero
    `nice` is set in the child for its group and autogroup (`set_group_nice`); `pass_fds` are
    inherited by the child (a lock it holds for its life).

    The child's temporary files go to a scratch directory of its own (`scratch.claim`), which
    the child holds for its life; after the start, a thread sweeps the directories of processes
    that ended (`scratch.sweep`)."""
    command = [sys.executable, "-m", module, *args]
    root = scratch_root()
    # In the child, after setsid: the nice level and the new session's autogroup.
    renice = (lambda: set_group_nice(nice)) if nice else None
    with contextlib.ExitStack() as opened:
        scratch, lock = claim(root)
        opened.callback(os.close, lock)  # the child's copy holds the lock from here on
        environment = stage_environment(**{**scratch_environment(scratch), **(env_overrides or {})})
        if log_path is None:
            stdout, stderr = subprocess.DEVNULL, subprocess.DEVNULL
        else:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # The child keeps its own descriptor of the log; this process's copy closes here.
            stdout, stderr = opened.enter_context(open(log_path, "ab")), subprocess.STDOUT
        proc = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=stderr,
            env=environment,
            start_new_session=True,
            preexec_fn=renice,
            pass_fds=(*pass_fds, lock),
        )
    # Off the caller's path (a restart's): removing a killed stage's files takes a while.
    threading.Thread(target=sweep_quietly, args=(root,), name="scratch-sweep", daemon=True).start()
    return proc


def sweep_quietly(root: Path) -> None:
    """`sweep(root)`, logging rather than raising what it cannot remove: a start has happened by
    then, and the next start sweeps again."""
    try:
        sweep(root)
    except OSError as exc:
        log.warning("scratch directories under %s not swept: %s", root, exc)


def scratch_root() -> Path:
    """Where the started processes' scratch directories are: `scratch/` of the var dir."""
    return var_dir() / "scratch"
