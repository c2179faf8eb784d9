"""Which node this agent serves and what that node has: its name (BACKSTOP_NODE) and its
capacity (the BACKSTOP_NODE_* settings, else the host's)."""

from __future__ import annotations

import psutil

from infra.node_metrics import Capacity
from spark_runtime.env import env


def this_node() -> str:
    """The node this agent serves (env BACKSTOP_NODE); tasks for other nodes are refused."""
    node = env("BACKSTOP_NODE", "")
    if not node:
        raise RuntimeError("BACKSTOP_NODE is not set: this worker is not a node agent")
    return node


def capacity_from_env() -> Capacity:
    """The node's capacity: BACKSTOP_NODE_CPU / _MEM_MB / _DISK_MBPS / _BW_MBPS or the host's."""
    return Capacity(
        cpu_total=env("BACKSTOP_NODE_CPU", float(psutil.cpu_count() or 1), float),
        mem_total_mb=env("BACKSTOP_NODE_MEM_MB", psutil.virtual_memory().total / 2**20, float),
        disk_max_mbps=env("BACKSTOP_NODE_DISK_MBPS", 200.0, float),
        bw_total_mbps=env("BACKSTOP_NODE_BW_MBPS", 1000.0, float),
    )
