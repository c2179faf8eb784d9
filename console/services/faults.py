"""Asking for a fault: validation, rate limit, and the record of who asked."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from console.models import FaultInjection, Job, Node


class FaultRefused(Exception):
    """The fault cannot be injected; `field` names the offending input when there is one."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.field = field
        self.status = status


def fault_rate_limit_per_minute() -> int:
    return getattr(settings, "FAULT_RATE_LIMIT_PER_MINUTE", 6)


def request_fault(
    job: Job,
    kind: str,
    *,
    target_operator: str = "",
    target_node: Node | None = None,
    params: dict | None = None,
    requested_by=None,
) -> FaultInjection:
    """Validate and record a fault request; the controller injects pending faults.

    Refuses faults on jobs that are not running (409), unknown operators or missing nodes (400),
    and more than `FAULT_RATE_LIMIT_PER_MINUTE` faults per job per minute (429).
    """
    params = dict(params or {})
    if kind not in FaultInjection.Kind.values:
        raise FaultRefused(f"kind: unknown fault kind {kind!r}", field="kind")
    if job.status != Job.Status.RUNNING:
        raise FaultRefused(
            f"job {job.name!r} is {job.status}; faults can only be injected into running jobs",
            status=409,
        )
    if kind in FaultInjection.NODE_KINDS:
        if target_node is None:
            raise FaultRefused(f"target_node: {kind} needs a node", field="target_node")
    else:
        if not target_operator:
            raise FaultRefused(
                f"target_operator: {kind} needs an operator", field="target_operator"
            )
        if not job.operators.filter(name=target_operator).exists():
            raise FaultRefused(
                f"target_operator: job {job.name!r} has no operator {target_operator!r}",
                field="target_operator",
            )
    if "duration_s" in params:
        duration = params["duration_s"]
        if (
            isinstance(duration, bool)
            or not isinstance(duration, int | float)
            or not (0 < duration <= 600)
        ):
            raise FaultRefused(
                "params.duration_s: must be a number of seconds in (0, 600]", field="params"
            )
    recent = job.faults.filter(requested_at__gte=timezone.now() - timedelta(minutes=1)).count()
    if recent >= fault_rate_limit_per_minute():
        raise FaultRefused(
            f"rate limit: at most {fault_rate_limit_per_minute()} faults per job per minute",
            status=429,
        )
    return FaultInjection.objects.create(
        job=job,
        kind=kind,
        target_operator=target_operator,
        target_node=target_node,
        params=params,
        requested_by=requested_by if getattr(requested_by, "is_authenticated", False) else None,
    )
