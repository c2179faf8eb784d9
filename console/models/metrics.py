"""Metric samples of jobs, stages and nodes over time."""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils import timezone

from console.models.jobs import Job
from console.models.replicas import Node


class MetricSampleQuerySet(models.QuerySet):
    def older_than(self, hours: float):
        return self.filter(at__lt=timezone.now() - timedelta(hours=hours))


class MetricSample(models.Model):
    """One measurement at one time, for a job (optionally one stage/operator) or a node.

    Stored long-form (name, value) so new metrics need no migration; the indexes serve the two
    queries the console makes: one metric of one job over time, one metric of one node over time.
    """

    at = models.DateTimeField(db_index=True)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="metrics"
    )
    stage = models.CharField(max_length=64, blank=True)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="metrics"
    )
    name = models.CharField(max_length=48, help_text="e.g. throughput_eps, latency_p99_ms")
    value = models.FloatField()

    objects = MetricSampleQuerySet.as_manager()

    class Meta:
        ordering = ["at"]
        indexes = [
            models.Index(fields=["job", "name", "at"], name="metric_job_name_at"),
            models.Index(fields=["node", "name", "at"], name="metric_node_name_at"),
        ]

    def __str__(self):
        return f"{self.name}={self.value} @ {self.at:%H:%M:%S}"
