"""The node and operator fault kinds against a running job, through the API, with the real
controller, node agents and Spark stages (kill-driver, kill-standby and the controller kill are
in test_supervision_live.py, pause-node in test_pause_node_live.py).

One adaptive wordcount job (split and count chained into the stage "count", with a hot standby)
takes, in turn:
- stress-node: CPU hogs on every core for 8 s. All three nodes are this one machine, so every
  replica is starved. Expected: nothing is restarted or promoted (a busy process with a late
  heartbeat is slow, not dead), and the output goes on;
- slow-driver on count: each batch of the primary 1.5 s longer for 8 s. Expected: the primary
  says so in its entry, nothing is restarted or promoted (its heartbeats go on), the output
  goes on;
- operator-exception on count: the primary's next batch raises, its process exits. Expected: the
  failure is recorded with the exception as its cause, the standby is promoted;
- kill-node on the node of count's (new) primary, once count is protected again. Expected: every
  replica of the job there fails, count's standby on another node is promoted.
The final counts equal the ground truth, and every episode's audit finds nothing lost or
duplicated.
"""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from console.models import ControlDecision, RecoveryEpisode, Replica
from console.redis import redis_client
from console.roles import OPERATOR
from infra.launcher import wait_for
from tests.factories import UserFactory
from tests.integration.live import (
    assert_episodes_audited_exact,
    inject,
    launch,
    replica_entry,
    results,
    wait_for_exact_results,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

LINES = 7200  # 120 s of input at 60 lines/s: the stress and the slow-down come while input flows
STRESS_S = 8.0
RECOVERY_KINDS = ("failure", "promote", "restart-stage", "restart-job", "give-up")


@pytest.fixture(autouse=True)
def operator_user(transactional_db):
    return UserFactory(username="opal", role=OPERATOR)


def live_primary(job, stage: str) -> Replica:
    """The stage's primary; while a promotion completes (the standby has not yet reported
    itself primary) there is none, so this waits for it."""

    def primaries():
        return (
            Replica.objects.filter(job=job, stage=stage, role="primary")
            .exclude(state__in=("failed", "stopped"))
            .select_related("node")
        )

    wait_for(lambda: primaries().count() == 1, 60, f"one primary of {stage}")
    return primaries().get()


def promotion_after(job, fault) -> RecoveryEpisode:
    """The promotion episode the controller recorded for `fault` (waits up to 60 s)."""
    wait_for(
        lambda: RecoveryEpisode.objects.filter(job=job, fault=fault, action="promote").exists(),
        60,
        f"a promotion after {fault.kind}",
    )
    return RecoveryEpisode.objects.get(job=job, fault=fault, action="promote")


def test_stress_operator_exception_and_kill_node_each_get_their_action(cluster):
    client = redis_client(decode_responses=False)
    job = launch("adaptive", LINES, name="it-fault-kinds")
    wait_for(lambda: sum(results(client, job.key).values()) > 0, 180, "first output")

    # stress-node: slow, not dead.
    primary = live_primary(job, "count")
    started = timezone.now()
    stress = inject(
        job,
        {"kind": "stress-node", "target_node": primary.node.name,
         "params": {"duration_s": STRESS_S, "workers": 2}},
    )  # fmt: skip
    during = sum(results(client, job.key).values())
    time.sleep(STRESS_S + 6)  # the stress, then time for a late heartbeat to be acted on
    acted = ControlDecision.objects.filter(job=job, at__gte=started, kind__in=RECOVERY_KINDS)
    assert not acted.exists(), [d.reason for d in acted]
    assert live_primary(job, "count").pid == primary.pid
    assert stress.outcome == "injected"
    wait_for(lambda: sum(results(client, job.key).values()) > during, 60, "output after the stress")

    # slow-driver: late, not dead.
    primary = live_primary(job, "count")
    started = timezone.now()
    slow = inject(
        job,
        {"kind": "slow-driver", "target_operator": "count",
         "params": {"delay_s": 1.5, "duration_s": STRESS_S}},
    )  # fmt: skip
    assert slow.outcome_detail == f"each batch of {primary.local_id} 1.5 s longer for 8 s"
    wait_for(
        lambda: replica_entry(client, job, primary.local_id).get("batch_delay_s") == 1.5,
        15,
        "the primary slowed down",
    )
    during = sum(results(client, job.key).values())
    time.sleep(STRESS_S + 6)
    acted = ControlDecision.objects.filter(job=job, at__gte=started, kind__in=RECOVERY_KINDS)
    assert not acted.exists(), [d.reason for d in acted]
    assert live_primary(job, "count").pid == primary.pid
    wait_for(lambda: sum(results(client, job.key).values()) > during, 60, "output after the slow")

    # operator-exception: the primary's process exits with the exception; the standby takes over.
    failing = live_primary(job, "count")
    fault = inject(job, {"kind": "operator-exception", "target_operator": "count"})
    episode = promotion_after(job, fault)
    failure = ControlDecision.objects.get(job=job, kind="failure", replica_id=failing.local_id)
    # The cause, as the stage wrote it before its process exited (its silence is seen first).
    assert "InjectedFault: injected operator exception in stage count" in failure.reason
    promoted = live_primary(job, "count")
    assert promoted.pk != failing.pk and promoted.node != failing.node

    # kill-node, once count has a promotable standby again.
    wait_for(
        lambda: RecoveryEpisode.objects.get(pk=episode.pk).reprotect_s is not None,
        180,
        "count protected again",
    )
    node = promoted.node.name
    on_node = set(
        Replica.objects.filter(job=job, node__name=node)
        .exclude(state__in=("failed", "stopped"))
        .values_list("replica_id", flat=True)
    )
    fault = inject(job, {"kind": "kill-node", "target_node": node})
    promotion_after(job, fault)
    wait_for(
        lambda: (
            {
                f"{job.key}/{d}"
                for d in ControlDecision.objects.filter(
                    job=job, kind="failure", node=node, at__gte=fault.injected_at
                ).values_list("replica_id", flat=True)
            }
            >= on_node
        ),
        60,
        f"a failure for every replica on {node}",
    )
    assert live_primary(job, "count").node.name != node

    wait_for_exact_results(client, job, LINES)
    assert_episodes_audited_exact(job)
