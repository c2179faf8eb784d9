"""Jobs with a Kafka source and sink through the API: what is accepted, stored and shown, and
every refusal a 400 naming the field (no broker is needed: nothing is launched)."""

import pytest

from console.models import Job
from console.roles import OPERATOR
from console.services.jobs import REALTIME_REFUSAL

pytestmark = pytest.mark.django_db

WORDCOUNT = {"name": "wc", "topology": "wordcount", "strategy": "adaptive"}


def post(api_as, **fields):
    return api_as(OPERATOR).post("/api/jobs/", {**WORDCOUNT, **fields}, format="json")


def detail(response) -> str:
    return str(response.json()["error"]["detail"])


def test_a_kafka_source_and_sink_are_stored_and_shown(api_as, settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
    source = {"kind": "kafka", "topic": "lines", "starting_offsets": "latest", "accept_loss": True}
    response = post(api_as, source=source, sink={"kind": "kafka", "topic": "counts"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["source"] == source
    assert body["sink"] == {"kind": "kafka", "topic": "counts"}
    assert body["trigger"] == "microbatch"
    job = Job.objects.get(pk=body["id"])
    assert (job.source["topic"], job.sink["topic"]) == ("lines", "counts")


def test_a_job_without_source_keeps_its_own_input(api_as):
    response = post(api_as)
    assert response.status_code == 201
    assert (response.json()["source"], response.json()["sink"]) == ({}, {})


@pytest.mark.parametrize(
    "source, field, words",
    [
        ({"kind": "kinesis", "topic": "x"}, "source", "only 'kafka'"),
        ({"kind": "kafka"}, "source", "source.topic"),
        ({"kind": "kafka", "topic": "a b"}, "source", "not a Kafka topic name"),
        ({"kind": "kafka", "topic": "x", "starting_offsets": "middle"}, "source", "earliest"),
        ({"kind": "kafka", "topic": "x", "event_time": "when"}, "source", "source.event_time"),
        ({"kind": "kafka", "topic": "x", "max_records_per_trigger": 0}, "source", "positive"),
        ({"kind": "kafka", "topic": "x", "colour": "red"}, "source", "source.colour"),
    ],
)
def test_a_bad_source_is_refused_naming_the_field(api_as, settings, source, field, words):
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
    response = post(api_as, source=source)
    assert response.status_code == 400
    assert field in response.json()["error"]["detail"]
    assert words in detail(response)
    assert not Job.objects.exists()


def test_an_event_time_field_must_be_declared(api_as, settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
    # wordcount's input declares `text` only: an event time read from it is accepted as a name.
    ok = post(api_as, source={"kind": "kafka", "topic": "x", "event_time": "text"})
    assert ok.status_code == 201


def test_kafka_without_a_cluster_is_refused(api_as, settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = None
    response = post(api_as, sink={"kind": "kafka", "topic": "counts"})
    assert response.status_code == 400
    assert "KAFKA_BOOTSTRAP_SERVERS" in detail(response)


def test_real_time_mode_is_refused_with_the_reason(api_as, settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
    response = post(api_as, source={"kind": "kafka", "topic": "x"}, trigger="realtime")
    assert response.status_code == 400
    assert "trigger" in response.json()["error"]["detail"]
    assert REALTIME_REFUSAL in detail(response)
    assert "INPUT_STREAM_NOT_SUPPORTED" in detail(response)


def test_an_unknown_trigger_is_refused(api_as):
    response = post(api_as, trigger="continuous")
    assert response.status_code == 400
    assert "trigger" in response.json()["error"]["detail"]
