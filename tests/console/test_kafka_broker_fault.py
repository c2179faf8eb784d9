"""The kafka-broker fault through the API, the console control and `manage.py inject_fault`:
its params typed and bounded (a 400 naming the field), no target, and refused with the reason
for a job without Kafka or on a Kafka cluster that is not a broker Backstop keeps. No broker
runs here: a keeper's registration (infra/kafka_outage.py) stands for one."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from console.dash import controls
from console.dash.job import callbacks as job_callbacks
from console.models import ControlDecision, FaultInjection, Job
from console.redis import redis_client
from console.roles import OPERATOR
from console.services import faults
from infra import keys
from infra.kafka_outage import ASKED, BrokerKeeper, outage
from spark_runtime import external_io
from spark_runtime.external_io import ExternalIO, KafkaSink, KafkaSource
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db

BOOTSTRAP = "127.0.0.1:39092"


class StandIn:
    """A broker's process as a keeper sees it (never stopped here)."""

    supervisor = "owner"
    pid = 4242


@pytest.fixture
def kafka_job(settings):
    """A running job recorded as reading and writing Kafka at BOOTSTRAP (as its launch does)."""
    settings.KAFKA_BOOTSTRAP_SERVERS = BOOTSTRAP
    job = make_job(status=Job.Status.RUNNING, name="wc-kafka")
    io = ExternalIO(KafkaSource("lines", BOOTSTRAP), KafkaSink("counts", BOOTSTRAP))
    external_io.save(redis_client(), job.key, io)
    return job


@pytest.fixture
def kept(settings, tmp_path):
    """The broker at BOOTSTRAP registered as Backstop's own, by a keeper of this process."""
    keeper = BrokerKeeper(StandIn(), settings.REDIS_URL, tmp_path, BOOTSTRAP)
    keeper.register()
    return keeper


def post(api_as, job, body):
    return api_as(OPERATOR).post(f"/api/jobs/{job.pk}/faults/", body, format="json")


def error(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json()["error"]["detail"]


BAD = [
    ({"duration_s": 0}, "params", "params.duration_s: must be more than 0 and at most 600"),
    ({"duration_s": 601}, "params", "params.duration_s: must be more than 0 and at most 600"),
    ({"duration_s": "ten"}, "params", "params.duration_s: must be a number of seconds"),
    ({"duration_s": True}, "params", "params.duration_s: must be a number of seconds"),
    ({"hard": "yes"}, "params", "params.hard: must be true or false"),
    ({"hard": 1}, "params", "params.hard: must be true or false"),
    (
        {"workers": 2},
        "params",
        "params.workers: not a parameter of kafka-broker (accepted: duration_s, hard)",
    ),
]


@pytest.mark.parametrize("params, field, message", BAD)
def test_bad_params_are_a_400_naming_the_field(api_as, kafka_job, kept, params, field, message):
    detail = error(post(api_as, kafka_job, {"kind": "kafka-broker", "params": params}))
    assert list(detail) == [field]
    assert detail[field][0].startswith(message)
    assert FaultInjection.objects.count() == 0


@override_settings(FAULT_MAX_DURATION_S=20)
def test_the_longest_outage_comes_from_settings(api_as, kafka_job, kept):
    detail = error(post(api_as, kafka_job, {"kind": "kafka-broker", "params": {"duration_s": 21}}))
    assert "at most 20 seconds" in detail["params"][0]


def test_it_takes_no_target(api_as, kafka_job, kept):
    NodeFactory(name="node-1")
    body = {"kind": "kafka-broker", "target_operator": "count"}
    detail = error(post(api_as, kafka_job, body))
    assert detail == {"target_operator": ["target_operator: kafka-broker takes no target "
                                          "(it acts on the job's Kafka broker)"]}  # fmt: skip
    detail = error(post(api_as, kafka_job, {"kind": "kafka-broker", "target_node": "node-1"}))
    assert list(detail) == ["target_node"]


def test_a_job_without_kafka_is_refused_with_the_reason(api_as, kept):
    job = make_job(status=Job.Status.RUNNING)
    detail = error(post(api_as, job, {"kind": "kafka-broker"}))
    assert detail["kind"][0] == (
        "kind: kafka-broker stops the Kafka broker of a job on Kafka; job 'wc' reads and "
        "writes Backstop's Redis streams only"
    )


def test_a_cluster_backstop_does_not_keep_is_refused_with_the_reason(api_as, kafka_job):
    """KAFKA_BOOTSTRAP_SERVERS names a cluster no keeper registered: Backstop did not start
    it, so it may not stop it."""
    detail = error(post(api_as, kafka_job, {"kind": "kafka-broker", "params": {"duration_s": 5}}))
    assert list(detail) == ["kind"]
    assert detail["kind"][0].startswith(
        f"kind: kafka-broker is refused: the Kafka cluster at {BOOTSTRAP} is not a broker "
        "Backstop started and keeps (a cluster given by KAFKA_BOOTSTRAP_SERVERS"
    )
    assert FaultInjection.objects.count() == 0


def test_backstops_own_broker_gets_the_outage_asked_once(api_as, kafka_job, kept):
    response = post(api_as, kafka_job, {"kind": "kafka-broker", "params": {"duration_s": 15}})
    assert response.status_code == 201, response.content
    assert response.json()["params"] == {"duration_s": 15.0, "hard": True}
    assert (response.json()["target_operator"], response.json()["target_node"]) == ("", None)
    fault = FaultInjection.objects.get(pk=response.json()["id"])
    fault = faults.inject(fault)  # as the controller's task does
    assert fault.outcome == FaultInjection.Outcome.INJECTED
    assert fault.outcome_detail == (
        f"SIGKILL to the Kafka broker at {BOOTSTRAP}, started again on its data after 15 s "
        "(by the process that keeps it)"
    )
    asked = outage(redis_client(), BOOTSTRAP)
    assert (asked.state, asked.fault, asked.job, asked.token) == (
        ASKED, fault.pk, kafka_job.key, kept.token,
    )  # fmt: skip
    assert (asked.duration_s, asked.hard) == (15.0, True)
    assert faults.inject(fault) == fault  # no longer pending: left as it is
    # One outage at a time: a second fault is refused while this one is asked or under way.
    again = post(api_as, kafka_job, {"kind": "kafka-broker"})
    assert again.status_code == 409
    assert f"already asked for fault #{fault.pk}" in again.json()["error"]["detail"]
    decision = ControlDecision.objects.filter(job=kafka_job, kind=ControlDecision.Kind.FAULT)
    assert decision.get().reason.startswith("kafka-broker injected: SIGKILL")


def test_an_outage_refused_at_injection_marks_the_fault_refused(api_as, kafka_job, kept):
    fault = faults.request_fault(kafka_job, "kafka-broker", params={"duration_s": 5})
    redis_client().delete(keys.kafka_broker(BOOTSTRAP))  # its keeper is gone since
    fault = faults.inject(fault)
    assert fault.outcome == FaultInjection.Outcome.REFUSED
    assert "no broker of Backstop's own is registered" in fault.outcome_detail


def test_the_console_control_offers_it_without_a_target(kafka_job, kept, users):
    assert job_callbacks.target_fields("kafka-broker") == (True, True)
    displayed, message = job_callbacks.ask_fault(
        1, "kafka-broker", "count", None, f"/console/jobs/{kafka_job.pk}/"
    )
    assert message == f"Inject kafka-broker on the Kafka broker of job #{kafka_job.pk}?"
    result = job_callbacks.inject_confirmed(
        1, "kafka-broker", "count", None, 12, f"/console/jobs/{kafka_job.pk}/",
        user=users[OPERATOR],
    )  # fmt: skip
    assert "requested" in str(result)
    fault = FaultInjection.objects.get(kind="kafka-broker")
    assert (fault.target_operator, fault.target_node, fault.params) == (
        "", None, {"duration_s": 12.0, "hard": True},
    )  # fmt: skip
    with pytest.raises(controls.ActionRefused, match="params.duration_s: must be a number"):
        controls.inject_fault(
            users[OPERATOR], kafka_job.pk, kind="kafka-broker", operator=None, node_id=None,
            duration_s="soon",
        )  # fmt: skip


def test_the_console_control_shows_the_refusal_for_a_cluster_not_backstops(kafka_job, users):
    result = job_callbacks.inject_confirmed(
        1, "kafka-broker", None, None, 10, f"/console/jobs/{kafka_job.pk}/",
        user=users[OPERATOR],
    )  # fmt: skip
    assert "is not a broker Backstop started and keeps" in str(result)


def test_manage_inject_fault_asks_for_it_and_refuses_bad_params(kafka_job, kept, users):
    def run(*extra):
        call_command("inject_fault", str(kafka_job.pk), "kafka-broker", "--as", "otto", *extra)

    with pytest.raises(CommandError, match="params.duration_s: must be more than 0"):
        run("--duration", "0")
    with pytest.raises(CommandError, match="params.hard: must be true or false"):
        run("--params", '{"hard": "no"}')
    with pytest.raises(CommandError, match="target_operator: kafka-broker takes no target"):
        run("--operator", "count")
    run("--duration", "7", "--clean-stop")
    fault = FaultInjection.objects.get()
    assert fault.params == {"duration_s": 7.0, "hard": False}
    assert fault.outcome == FaultInjection.Outcome.INJECTED
    assert fault.outcome_detail.startswith(f"SIGTERM to the Kafka broker at {BOOTSTRAP}")
    assert outage(redis_client(), BOOTSTRAP).hard is False
