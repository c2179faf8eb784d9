"""Fault prediction made live: train the predictor on what Backstop recorded, and give the policy
cycle each operator's fr with where it came from.

The maths (features, rows, the held-out judgement) is in console/policy/prediction.py; this
module only reads the database into a RecordedHistory and stores PredictorTraining rows.
Failures are the controller's FAILURE decisions (one per failed replica, with its stage and
node); node load is the agents' utilisation samples; stage load is the primaries' progress.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from console.models import ControlDecision, Job, MetricSample, Policy, PredictorTraining, Replica
from console.policy.config import PolicyConfig
from console.policy.prediction import (
    FEATURE_NAMES,
    JOB_LATENCY,
    NODE_METRICS,
    RECENT_WINDOWS,
    STAGE_THROUGHPUT,
    Failure,
    FaultPredictor,
    RecordedHistory,
    Series,
    Tenure,
    train_and_judge,
    training_rows,
)

log = logging.getLogger(__name__)


def _epoch(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def load_history(
    start: datetime, end: datetime, failures_since: datetime, job_ids=None
) -> RecordedHistory:
    """The recorded history of [start, end], failures from `failures_since` (features count the
    failures of the RECENT_WINDOWS windows before a row). `job_ids` limits the stage metrics and
    primaries to those jobs (None: all); failures are every job's, since node_fault_rate counts
    the failures of any replica on a node, in training and in the policy cycle alike."""
    jobs = Q() if job_ids is None else Q(job_id__in=list(job_ids))
    node_points = defaultdict(list)
    for node, name, at, value in MetricSample.objects.filter(
        node__isnull=False, name__in=list(NODE_METRICS.values()), at__gte=start, at__lte=end
    ).values_list("node__name", "name", "at", "value"):
        node_points[(node, name)].append((at.timestamp(), value))
    stage_points = defaultdict(list)
    for job, stage, name, at, value in MetricSample.objects.filter(
        jobs,
        (Q(name=STAGE_THROUGHPUT) & ~Q(stage="")) | Q(name=JOB_LATENCY, stage=""),
        job__isnull=False,
        at__gte=start,
        at__lte=end,
    ).values_list("job_id", "stage", "name", "at", "value"):
        stage_points[(job, stage, name)].append((at.timestamp(), value))
    failures = [
        Failure(at.timestamp(), job, stage, node)
        for at, job, stage, node in ControlDecision.objects.filter(
            kind=ControlDecision.Kind.FAILURE, at__gte=failures_since, at__lte=end
        )
        .exclude(stage="")
        .values_list("at", "job_id", "stage", "node")
    ]
    tenures = [
        Tenure(job, stage, node, started.timestamp(), _epoch(ended))
        for job, stage, node, started, ended in Replica.objects.filter(
            jobs,
            Q(ended_at__isnull=True) | Q(ended_at__gte=start),
            role=Replica.Role.PRIMARY,
            started_at__lte=end,
        ).values_list("job_id", "stage", "node__name", "started_at", "ended_at")
    ]
    return RecordedHistory(
        node_metrics={key: Series(points) for key, points in node_points.items()},
        stage_metrics={key: Series(points) for key, points in stage_points.items()},
        failures=sorted(failures, key=lambda f: f.at),
        tenures=tenures,
    )


def train_fault_predictor(config: PolicyConfig | None = None, now=None) -> PredictorTraining:
    """Train on the last prediction_history_s of every job and store the run (used or not)."""
    config = config or Policy.current().to_config()
    now = now or timezone.now()
    window = config.prediction_window_s
    start = now - timedelta(seconds=config.prediction_history_s)
    history = load_history(start, now, start - timedelta(seconds=RECENT_WINDOWS * window))
    spans = {}
    for job in Job.objects.filter(started_at__isnull=False, started_at__lte=now).filter(
        Q(stopped_at__isnull=True) | Q(stopped_at__gte=start)
    ):
        stages = sorted(set(job.operators.exclude(stage="").values_list("stage", flat=True)))
        job_end = min(now, job.stopped_at) if job.stopped_at else now
        if stages:
            spans[job.pk] = (stages, max(start, job.started_at).timestamp(), job_end.timestamp())
    rows = training_rows(history, spans, window)
    outcome = train_and_judge(rows, config.fault_rate_prior, config.prediction_min_samples)
    run = PredictorTraining.objects.create(
        trained_at=now,
        window_s=window,
        history_s=config.prediction_history_s,
        samples=outcome.samples,
        failures=outcome.failures,
        holdout_samples=outcome.holdout_samples,
        features=list(FEATURE_NAMES),
        prior=config.fault_rate_prior,
        r2=outcome.r2,
        mae=outcome.mae,
        prior_mae=outcome.prior_mae,
        mse=outcome.mse,
        prior_mse=outcome.prior_mse,
        used=outcome.used,
        reason=outcome.reason,
        predictor=outcome.predictor.to_dict(),
    )
    log.info("fault predictor #%s: %s", run.pk, outcome.reason)
    return run


def latest_training() -> PredictorTraining | None:
    """The newest training run of the fault predictor: the one whose verdict is in force."""
    return PredictorTraining.objects.order_by("-trained_at").first()


_READ_NOW = object()


def predicted_fault_rates(
    job: Job, stage_of: Mapping[str, str], config: PolicyConfig, now=None, latest=_READ_NOW
) -> dict[str, tuple[float, str]]:
    """operator -> (fr, where it came from) for the policy cycle.

    The newest training run decides (`latest`: as a controller read it for all its jobs, or
    read now): a used model predicts each stage's fr from the stage's last window (its
    operators share it); otherwise, or for a stage without features (no primary, or its node
    has no samples yet), the prior with the reason.
    """
    now = now or timezone.now()
    prior = config.fault_rate_prior
    if latest is _READ_NOW:
        latest = latest_training()
    if latest is None:
        return {op: (prior, "prior (predictor not trained yet)") for op in stage_of}
    if not latest.used:  # the placement page shows why
        return {op: (prior, f"prior (model #{latest.pk} not used)") for op in stage_of}
    predictor = FaultPredictor.from_dict(latest.predictor)
    window = latest.window_s
    # live_features reads the window ending at most two windows ago, and the failures of the
    # RECENT_WINDOWS windows before that.
    history = load_history(
        now - timedelta(seconds=3 * window),
        now,
        now - timedelta(seconds=(RECENT_WINDOWS + 2) * window),
        job_ids=[job.pk],
    )
    by_stage = {}  # the operators of a stage share its row
    for stage in set(stage_of.values()):
        found = history.live_features(job.pk, stage, now.timestamp(), window)
        if found is None:
            by_stage[stage] = (prior, f"prior (no recent samples of {stage}'s node)")
        else:
            by_stage[stage] = (predictor.predict(found[1]), f"model #{latest.pk} on {found[0]}")
    return {op: by_stage[stage] for op, stage in stage_of.items()}
