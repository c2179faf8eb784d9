"""The cluster: nodes running a node agent, and the replicas of a job's stages placed on them."""

from __future__ import annotations

from django.db import models

from console.models.jobs import Job
from infra.queues import node_queue


class Node(models.Model):
    """A host running a node agent; replicas of stages are placed on nodes.

    Capacities are what the node offers Backstop (cores, MiB, MB/s); live usage arrives as
    MetricSample rows from the node agent, and `last_heartbeat` tells the controller it is alive.
    """

    class State(models.TextChoices):
        UP = "up", "up"
        DOWN = "down", "down"
        DRAINING = "draining", "draining"
        UNKNOWN = "unknown", "unknown"

    name = models.SlugField(max_length=64, unique=True)
    cpu_total = models.FloatField(help_text="Cores offered to Backstop.")
    mem_total_mb = models.FloatField(help_text="Memory offered to Backstop, MiB.")
    disk_max_mbps = models.FloatField(default=200.0, help_text="Disk throughput ceiling, MB/s.")
    bw_total_mbps = models.FloatField(default=1000.0, help_text="Network bandwidth, Mbit/s.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.UNKNOWN)
    last_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue of this node's agent."""
        return node_queue(self.name)


class Replica(models.Model):
    """A process running one stage of a job on a node, as primary or hot standby.

    `fencing_epoch` is the epoch the replica writes with; the sink refuses writes from an epoch
    older than the stage's current one, so a stale primary can never write after a promotion.
    """

    class Role(models.TextChoices):
        PRIMARY = "primary", "primary"
        STANDBY = "standby", "standby"

    class State(models.TextChoices):
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        CATCHING_UP = "catching_up", "catching up (standby too far behind to take over)"
        SLOW = "slow", "slow (no heartbeat, but its process is busy)"
        BACKOFF = "backoff", "waiting to restart (it keeps failing before its first batch)"
        PROMOTING = "promoting", "promoting"
        STOPPED = "stopped", "stopped"
        FAILED = "failed", "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="replicas")
    replica_id = models.CharField(max_length=100, unique=True)
    stage = models.CharField(max_length=64)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="replicas")
    role = models.CharField(max_length=10, choices=Role.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    pid = models.IntegerField(null=True, blank=True)
    fencing_epoch = models.PositiveIntegerField(default=0)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    checkpoint_interval_s = models.FloatField(
        null=True, blank=True, help_text="The checkpoint interval in force, as the replica reports."
    )
    interval_since = models.DateTimeField(null=True, blank=True, help_text="In force since.")
    nice = models.IntegerField(
        null=True,
        blank=True,
        help_text="Its CPU priority as it reports it (nice level: lower runs first; "
        "spark_runtime/strategies.py has the levels).",
    )
    batch_every_s = models.FloatField(
        null=True,
        blank=True,
        help_text="A caught-up standby's pace: it reads new input every this many seconds "
        "(empty: on every trigger).",
    )
    # A standby's latest StandbyVerdict from the policy (console/policy/placement.py): the rule
    # that placed, moved or kept it there, with its Q figures and the reserve check, and "at"
    # (ISO time). Written at launch and by every policy cycle that may move standbys.
    placement = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job", "stage", "role"]

    def __str__(self):
        return f"{self.replica_id} ({self.role} on {self.node.name})"

    @staticmethod
    def full_id(job_key: str, local_id: str) -> str:
        """The stored `replica_id` of the replica the data plane calls `local_id` in `job_key`
        (replica ids are unique per job there, and across jobs here)."""
        return f"{job_key}/{local_id}"

    @property
    def local_id(self) -> str:
        """The replica's id in the data plane (its Redis entries, its agent's process list)."""
        return self.replica_id.split("/", 1)[1]
