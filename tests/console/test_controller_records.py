"""What the controller writes when the state machine overtakes a restart with a promotion."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console.models import ControlDecision, Job, RecoveryEpisode
from console.services.controller import record_promotion_over_restart
from spark_runtime.supervision import HeartbeatSeen, KillReplica, PromoteStandby
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def test_a_standby_overtaking_a_restart_turns_the_open_restart_episode_into_a_promotion():
    job = make_job(status=Job.Status.RUNNING, strategy="adaptive")
    episode = RecoveryEpisode.objects.create(
        job=job,
        strategy=job.strategy,
        stage="count",
        action=RecoveryEpisode.Action.RESTART_STAGE,
        detected_at=timezone.now(),
        notes="count-2 on node-2: ProcessExited",
    )
    event = HeartbeatSeen("count-3", 15.0, {"stage": "count", "state": "running"})
    actions = [KillReplica("count-2"), PromoteStandby("count-3", "count")]
    record_promotion_over_restart(job, event, actions)
    episode.refresh_from_db()
    assert episode.action == RecoveryEpisode.Action.PROMOTE
    assert "restart overtaken by count-3" in episode.notes
    decision = ControlDecision.objects.get(job=job, kind=ControlDecision.Kind.PROMOTE)
    assert decision.replica_id == "count-3" and decision.stage == "count"
    assert "caught up before the restarted primary produced output" in decision.reason
