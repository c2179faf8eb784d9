"""Celery queue names, in one place.

The controller consumes `control`, the alerts worker `alerts`; each node agent consumes the
queue of its own node, so a task sent to `node.node-2` runs on node-2's host and nowhere else.
"""

CONTROL_QUEUE = "control"
# Alert deliveries (workers/alerting.py): a worker of their own, so a slow receiver never
# delays the controller's tasks.
ALERTS_QUEUE = "alerts"
NODE_QUEUE_PREFIX = "node."


def node_queue(node_name: str) -> str:
    """The queue a node agent for `node_name` consumes."""
    if not node_name or any(ch.isspace() for ch in node_name):
        raise ValueError(f"invalid node name {node_name!r}")
    return f"{NODE_QUEUE_PREFIX}{node_name}"
