"""An existing app written for Spark's Kafka connector (jobs/apps/kafka_word_counts.py, plain
PySpark, `format("kafka")` in and out) on the real controller, node agents and broker:
registered and started through the API, its process killed by a kill-driver fault and
restarted from its checkpoint, its counts on the output topic exact against plain Python and
no update written twice (a read_committed reader), its recovery episode closed at the
restarted app's first batch."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka.admin import NewTopic
from rest_framework.test import APIClient

from console.models import Job, RecoveryEpisode
from infra.launcher import wait_for
from spark_runtime.kafka_admin import create_missing
from tests.conftest import wait_until
from tests.integration.live import api, inject
from tests.kafka_topics import counts_written, produce_lines

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.kafka,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("jobs_dir", "people"),
]


def test_a_kafka_app_survives_the_kill_of_its_process(cluster, kafka_broker, people):
    bootstrap = kafka_broker.bootstrap_servers
    source, out = "app-lines", "app-counts"
    create_missing(bootstrap, [NewTopic(source, 3, 1), NewTopic(out, 1, 1)])
    admin = APIClient()
    admin.force_authenticate(people)
    registered = admin.post(
        "/api/topologies/", {"app": "apps/kafka_word_counts.py", "name": "kwc"}, format="json"
    )
    assert registered.status_code == 201, registered.content
    lines = [f"w{i % 11} w{i % 4} every" for i in range(300)]
    produce_lines(bootstrap, source, lines)
    response = api().post(
        "/api/jobs/",
        {"name": "it-kafka-app", "topology": "kwc@1", "strategy": "restart-all",
         "args": ["--bootstrap", bootstrap, "--in-topic", source, "--out-topic", out]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    wait_until(
        lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING,
        180,
        lambda: "job running, it is {0.status}: {0.status_reason}".format(
            Job.objects.get(pk=job.pk)
        ),
    )
    expected = Counter(word for line in lines for word in line.split())

    def newest() -> dict[str, int]:
        return counts_written(bootstrap, out)[0]

    wait_for(lambda: newest() == expected, 180, "the first counts", poll_s=1)

    fault = inject(job, {"kind": "kill-driver", "target_operator": "app"})
    more = [f"w{i % 7} after" for i in range(200)]
    produce_lines(bootstrap, source, more)
    expected += Counter(word for line in more for word in line.split())
    wait_for(lambda: newest() == expected, 180, "exact counts after the kill", poll_s=1)
    # The episode closes at the restarted app's first batch (an app has no latency band).
    episode = wait_until(
        lambda: RecoveryEpisode.objects.filter(
            job=job, fault=fault, recovered_at__isnull=False
        ).first(),
        60,
        "the episode closed",
    )
    assert episode.action == RecoveryEpisode.Action.RESTART_JOB
    assert 0 < episode.recovery_time_s < 60 and episode.downtime_s == episode.recovery_time_s
    _newest, written = counts_written(bootstrap, out)
    # A count only grows, so a (word, count) seen twice is an update written twice.
    assert len(written) == len(set(written)), "an update was written twice"

    stopped = api().post(f"/api/jobs/{job.pk}/stop/")
    assert stopped.status_code == 200, stopped.content
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.STOPPED, 60, "job stopped")
