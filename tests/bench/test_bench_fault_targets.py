"""The strategy bench requests its faults as an operator would (`request_bench_fault`): an
operator fault names the operator it was given, a node fault takes the node of that operator's
stage's primary, through the real fault service. The live runs are tests/bench/test_bench_*.py
(slow)."""

from __future__ import annotations

import pytest

from bench.strategy.run import request_bench_fault
from console.models import FaultInjection, Job, Operator
from tests.factories import UserFactory, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    job = make_job(status=Job.Status.RUNNING, name="bench-targets")
    Operator.objects.filter(job=job, name__in=("split", "count")).update(stage="count")
    return job


@pytest.mark.parametrize("kind", ["kill-driver", "operator-exception", "slow-driver"])
def test_an_operator_fault_names_the_operator_it_was_given(job, kind):
    fault, refusal = request_bench_fault(job, kind, "count", UserFactory())
    assert refusal == ""
    assert (fault.kind, fault.target_operator, fault.target_node) == (kind, "count", None)
    assert fault.outcome == FaultInjection.Outcome.PENDING


def test_a_node_fault_without_a_placed_primary_is_not_requested(job):
    fault, refusal = request_bench_fault(job, "kill-node", "count", UserFactory())
    assert fault is None and refusal == "no primary of count to take down"
    assert not FaultInjection.objects.filter(job=job).exists()


def test_a_refused_fault_says_why(job):
    fault, refusal = request_bench_fault(job, "kill-driver", "no-such-operator", UserFactory())
    assert fault is None and refusal.startswith("refused: ") and "no-such-operator" in refusal
