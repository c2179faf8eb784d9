"""Commands to a job's processes, fenced by the lease this thread acts under
(console/services/control/fence.py): a kill through a node agent's queue, a command on a
replica's command list. Below act.py, so that the fault injections (console/services/faults.py)
send theirs without importing the controller's acting."""

from __future__ import annotations

import json

from console.models import Job
from console.services.control.fence import lease_fields
from infra import tasks
from infra.queues import node_queue
from spark_runtime import keys as data_keys


def send_kill(job_key: str, replica_id: str, node: str) -> None:
    """Ask `node`'s agent to kill replica `replica_id` of the job (fenced)."""
    tasks.send(
        tasks.KILL_REPLICA, replica_id, job_key=job_key, queue=node_queue(node), **lease_fields()
    )


def send_command(client, job: Job, replica_id: str, command: dict) -> None:
    """Push a control command (promote, stop, trigger, fault) to a replica's command list,
    with the token of the lease this thread acts under."""
    client.rpush(data_keys.control(job.key, replica_id), json.dumps(command | lease_fields()))


def command_sender(client, job: Job):
    """`send_command` bound to a job, in the shape the state machine's `execute` wants."""
    return lambda replica_id, command: send_command(client, job, replica_id, command)
