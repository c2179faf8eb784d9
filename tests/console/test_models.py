"""Lifecycle and versioning rules of the domain models."""

import pytest
from django.core.exceptions import ValidationError

from console.models import InvalidTransition, Job, Policy
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def test_job_happy_lifecycle_sets_timestamps():
    job = make_job()
    assert job.mark_starting() is True
    assert job.mark_running() is True
    assert job.started_at is not None
    assert job.request_stop("done") is True
    assert job.mark_stopped() is True
    job.refresh_from_db()
    assert job.status == Job.Status.STOPPED
    assert job.status_reason == ""
    assert job.stopped_at >= job.started_at


def test_transitions_are_idempotent():
    job = make_job()
    job.mark_starting()
    assert job.mark_starting() is False  # a retried task asking again changes nothing
    job.mark_running()
    assert job.mark_running() is False
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING


def test_invalid_transition_is_refused():
    job = make_job()
    with pytest.raises(InvalidTransition, match="cannot go from created to running"):
        job.mark_running()
    assert Job.objects.get(pk=job.pk).status == Job.Status.CREATED


def test_stop_of_a_stopped_or_failed_job_is_a_no_op():
    job = make_job(status=Job.Status.RUNNING)
    job.mark_failed("driver lost")
    assert job.request_stop() is False
    assert job.status == Job.Status.FAILED
    assert job.status_reason == "driver lost"


def test_failed_job_can_be_started_again():
    job = make_job(status=Job.Status.FAILED)
    assert job.mark_starting() is True
    assert job.stopped_at is None


def test_job_keys_are_unique_and_redis_safe():
    first, second = make_job(), make_job()
    assert first.key != second.key
    assert first.key.startswith("job-") and ":" not in first.key


def test_operators_follow_the_topology_edges():
    job = make_job(topology="traffic")
    join = job.operators.get(name="join")
    assert join.upstream == ["speed_source", "flow_source"]
    assert join.downstream == ["location_aggregate"]
    assert job.operators.count() == 5


def test_policy_current_creates_defaults_once():
    first = Policy.current()
    assert first.version == 1
    assert Policy.current().pk == first.pk
    assert first.to_config().priority_threshold == 0.4


def test_policy_versions_are_immutable():
    policy = Policy.current()
    policy.priority_threshold = 0.9
    with pytest.raises(ValidationError, match="immutable"):
        policy.save()


def test_policy_clean_names_the_field():
    policy = Policy(w_type=1.5)
    with pytest.raises(ValidationError) as excinfo:
        policy.clean()
    assert "w_type" in excinfo.value.message_dict
