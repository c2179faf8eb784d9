"""What a lower CPU priority gives a stage process here (bench.dataplane.cpu_priority), the
measurement behind spark_runtime/cpu_priority.py's autogroup setting."""

import os
from pathlib import Path

import pytest

from bench.dataplane.cpu_priority import NICE_AND_AUTOGROUP, NICE_ONLY, low_priority_share
from spark_runtime import cpu_priority

autogroups = pytest.mark.skipif(
    not os.path.exists(cpu_priority.AUTOGROUP), reason="kernel without autogroups"
)


@autogroups
def test_a_low_priority_process_in_its_own_session_yields_the_cpu():
    # Two CPU-bound processes in sessions of their own, pinned to one CPU: with the autogroup's
    # nice set too, the nice-19 one gets a few percent (the weights give 1.4%).
    assert low_priority_share(19, NICE_AND_AUTOGROUP, seconds=2.0) < 0.15


@autogroups
def test_the_nice_level_alone_does_not_hold_across_sessions():
    # Why set_group_nice sets the autogroup: with the nice level alone each session's autogroup
    # gets an equal share, whatever the nice levels inside. (On a kernel with autogrouping
    # switched off this would fail: then the nice level alone is enough.)
    if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() != "1":
        pytest.skip("autogrouping is switched off")
    assert low_priority_share(19, NICE_ONLY, seconds=2.0) > 0.35
