"""Auditing an upgrade across its switch, as a recovery episode is audited (console/services/
recovery.py): the product's figures on the JobUpgrade record.

Once an upgrade that switched the job's output over has ended (confirmed or rolled back), the
controller task `audit_upgrade` (workers/controller.py) writes on its record:

- `gap_s`: the output gap across the switch, the downtime of a fault at `switched_at` measured
  as every recovery episode's is (console.policy.recovery.measure_switch: measure_faults on the
  job's progress records, with the policy's settings);
- `lost`, `duplicates`: the job's output so far against the reference of the version in force
  (recovery.audit_output), as a closed episode's audit.

The gap is recorded once its measurement is final (the output after the switch back to normal
for the stable window and judged, or watched for GIVE_UP_AFTER_S, or the job no longer live);
until then the upgrade stays not audited, and the watchdog asks again (`enqueue_unaudited`),
which also covers an end whose task was lost. An audited upgrade has its "audited" decision in
the job's log: that decision is what marks it (written with the figures, in one transaction),
so an upgrade whose figures cannot all be known (no reference, progress records gone) is
audited once too.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

import redis
from django.db import transaction
from django.utils import timezone

from console.models import ControlDecision, JobUpgrade, Policy
from console.policy.config import PolicyConfig
from console.policy.recovery import FaultMeasurement, measure_switch
from console.services.control.record import decide
from console.services.recovery import (
    GIVE_UP_AFTER_S,
    PROGRESS_READ_LIMIT,
    audit_output,
    input_started_at,
    judged_until,
    recovery_settings,
)
from infra import keys, tasks
from infra.child import ChildTimedOut
from spark_runtime.progress import read_progress

logger = logging.getLogger(__name__)

# The ends after which an upgrade is audited: the output went over to green and stayed there
# (confirmed) or came back to blue (rolled back). An abandoned upgrade ended with its job.
AUDITED_ENDS = (JobUpgrade.Status.CONFIRMED, JobUpgrade.Status.ROLLED_BACK)
# The key in an "audited" decision's detail naming the upgrade (the mark of an audited one).
AUDITED = "audited_upgrade"
# The watchdog asks for the audit of an upgrade that ended at least this long ago (its end's own
# task had its chance), at most this often per upgrade (an audit reads the job's whole input),
# and no longer once it ended this long ago: the job's progress across the switch is trimmed
# by then (spark_runtime.keys.PROGRESS_MAXLEN), and a final measurement never takes longer
# than GIVE_UP_AFTER_S after the switch.
CATCH_UP_AFTER_S = 30.0
CATCH_UP_EVERY_S = 30
CATCH_UP_WITHIN_S = 3600.0


def due(upgrade: JobUpgrade) -> bool:
    """Whether the upgrade is one to audit: it switched the output over and has ended."""
    return upgrade.switched_at is not None and upgrade.status in AUDITED_ENDS


def audited(upgrade: JobUpgrade) -> bool:
    """Whether the upgrade has been audited (its "audited" decision is in the job's log)."""
    return ControlDecision.objects.filter(
        job_id=upgrade.job_id,
        kind=ControlDecision.Kind.UPGRADE,
        **{f"detail__{AUDITED}": upgrade.pk},
    ).exists()


def measure_gap(
    upgrade: JobUpgrade, client, config: PolicyConfig, now: float
) -> FaultMeasurement | None:
    """The output across the upgrade's switch on the job's progress records judged by `now`,
    as measure_open_episodes judges a fault (console.policy.recovery.measure_switch); None while
    the measurement is not final."""
    job = upgrade.job
    switched = upgrade.switched_at.timestamp()
    started = input_started_at(client, job.key)
    records = read_progress(
        client, job.key, switched - config.reference_window_s - 5, count=PROGRESS_READ_LIMIT
    )
    return measure_switch(
        records,
        switched,
        # No input yet: nothing was normal before the switch (not measurable).
        input_started_at=now if started is None else started,
        end=now - judged_until(config),
        watch_ended=not job.is_live or now - switched > GIVE_UP_AFTER_S,
        settings=recovery_settings(config),
    )


def audit_upgrade(upgrade_id: int, client, now: float | None = None) -> str:
    """Write the output gap across the switch and the lost and duplicated results on an ended,
    switched upgrade, and the "audited" decision; returns what was done, in words. Idempotent:
    an audited upgrade is left alone; one whose measurement is not final yet, or whose output
    audit failed, stays not audited (the watchdog asks again)."""
    now = time.time() if now is None else now
    with transaction.atomic():
        upgrade = (
            JobUpgrade.objects.select_for_update().select_related("job").filter(pk=upgrade_id)
        ).first()
        if upgrade is None:
            return f"upgrade {upgrade_id} is gone"
        if not due(upgrade):
            return f"upgrade {upgrade_id} is {upgrade.status}, never switched or not ended"
        if audited(upgrade):
            return f"upgrade {upgrade_id} is audited already"
        measured = measure_gap(upgrade, client, Policy.current().to_config(), now)
        if measured is None:
            return f"upgrade {upgrade_id}: the output after the switch is not judged yet"
        job = upgrade.job
        try:
            comparison = audit_output(job, client)
        except (redis.RedisError, ValueError, KeyError, ChildTimedOut) as exc:
            logger.warning(
                "upgrade %s of job %s: output audit failed: %s", upgrade_id, job.key, exc
            )
            return f"upgrade {upgrade_id}: output audit failed ({exc})"
        upgrade.gap_s = measured.downtime_s
        upgrade.lost = None if comparison is None else comparison.lost
        upgrade.duplicates = None if comparison is None else comparison.duplicates
        upgrade.save(update_fields=["gap_s", "lost", "duplicates"])
        gap = (
            f"gap {upgrade.gap_s:g} s"
            if upgrade.gap_s is not None
            else f"gap unknown ({measured.note})"
        )
        results = (
            f"{comparison.lost} lost, {comparison.duplicates} duplicated of {comparison.cells} "
            f"results against {job.topology}'s reference"
            if comparison is not None
            else f"lost and duplicated unknown ({job.topology} has no reference to audit against)"
        )
        decision = decide(
            job,
            ControlDecision.Kind.UPGRADE,
            f"upgrade {upgrade.pk} audited: {gap}, {results}",
            stage=upgrade.stage,
            detail={
                AUDITED: upgrade.pk,
                "gap_s": upgrade.gap_s,
                "gap_note": measured.note,
                "lost": upgrade.lost,
                "duplicates": upgrade.duplicates,
                "cells": None if comparison is None else comparison.cells,
            },
        )
        return decision.reason


def enqueue_unaudited(client, now: datetime | None = None) -> list[int]:
    """Ask for the audit of every ended, switched upgrade not audited yet (its end's task was
    lost, or came before the measurement was final) that ended between CATCH_UP_AFTER_S and
    CATCH_UP_WITHIN_S ago, each at most every CATCH_UP_EVERY_S; returns their ids."""
    now = timezone.now() if now is None else now
    candidates = list(
        JobUpgrade.objects.filter(
            status__in=AUDITED_ENDS,
            switched_at__isnull=False,
            ended_at__lte=now - timedelta(seconds=CATCH_UP_AFTER_S),
            ended_at__gte=now - timedelta(seconds=CATCH_UP_WITHIN_S),
        )
        .order_by("ended_at", "pk")
        .values_list("pk", "job_id", "job__key")
    )
    if not candidates:
        return []
    done = set(
        ControlDecision.objects.filter(
            job_id__in={job_id for _, job_id, _ in candidates},
            kind=ControlDecision.Kind.UPGRADE,
            **{f"detail__{AUDITED}__isnull": False},
        ).values_list(f"detail__{AUDITED}", flat=True)
    )
    sent = []
    for upgrade_id, _, job_key in candidates:
        if upgrade_id in done:
            continue
        if client.set(
            keys.upgrade_audit_asked(job_key, upgrade_id), 1, nx=True, ex=CATCH_UP_EVERY_S
        ):
            tasks.send(tasks.AUDIT_UPGRADE, upgrade_id)
            sent.append(upgrade_id)
    return sent
