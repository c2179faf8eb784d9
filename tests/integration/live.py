"""What the live integration tests share: an operator's API client, launching a wordcount job
through the API, injecting a fault, and checking the final results and each episode's audit
against ground truth computed in plain Python from the input stream."""

from __future__ import annotations

import collections
import json
import time

from rest_framework.test import APIClient

from console.models import FaultInjection, Job, RecoveryEpisode, Replica
from console.redis import redis_client
from infra.launcher import wait_for
from spark_runtime import keys

RATE = 60  # input lines per second


def api() -> APIClient:
    """An APIClient logged in as the operator "opal" (each test module creates the user)."""
    client = APIClient()
    assert client.login(username="opal", password="pw-for-tests")
    return client


def expected_counts(client, job_key: str) -> collections.Counter:
    """Ground truth in plain Python: the words of every input line."""
    counts = collections.Counter()
    for _, fields in client.xrange(keys.input_stream(job_key)):
        counts.update(fields[b"text"].decode().split())
    return counts


def results(client, job_key: str) -> collections.Counter:
    raw = client.hgetall(keys.results(job_key))
    return collections.Counter({k.decode(): int(v) for k, v in raw.items()})


def launch(strategy: str, lines: int, name: str | None = None) -> Job:
    """A wordcount job of `lines` input lines at RATE, created through the API; returns once it
    runs."""
    response = api().post(
        "/api/jobs/",
        {"name": name or f"it-{strategy}", "topology": "wordcount", "strategy": strategy,
         "params": {"rate": RATE, "count": lines}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "job running")
    return Job.objects.get(pk=job.pk)


def replica_entry(client, job: Job, replica_id: str) -> dict:
    """What the replica last wrote about itself in the job's replicas hash ({} if nothing)."""
    raw = client.hget(keys.replicas(job.key), replica_id)
    return json.loads(raw) if raw else {}


def wait_for_caught_up_standby(job: Job, stage: str, timeout_s: float = 180) -> Replica:
    """The standby of `stage` once it is promotable, waiting for it: its row says running, and
    its own entry in Redis (what the controller decides on at a fault) says it is running and
    has measured its lag (after a batch, or on finding its input idle: a seeded standby with
    nothing new to read). The row alone can be a controller cycle old: a standby that has
    measured nothing counts as caught up while its primary has written nothing, and its row may
    still say so after the primary's first output, when a fault restarts the primary instead
    of promoting it (a fresh-clone CI run, 2026-11-26)."""
    client = redis_client()
    found: list[Replica] = []

    def caught_up() -> bool:
        rows = Replica.objects.filter(
            job=job, stage=stage, role=Replica.Role.STANDBY, state=Replica.State.RUNNING
        )
        for row in rows:
            entry = replica_entry(client, job, row.local_id)
            if entry.get("state") == Replica.State.RUNNING and entry.get("lag_s") is not None:
                found[:] = [row]
                return True
        return False

    wait_for(caught_up, timeout_s, f"a caught-up standby of {stage}")
    return found[0]


def inject(job: Job, fault: dict) -> FaultInjection:
    """Ask for `fault` through the API and wait until the controller has injected it."""
    response = api().post(f"/api/jobs/{job.pk}/faults/", fault, format="json")
    assert response.status_code == 201, response.content
    fault_id = response.json()["id"]
    wait_for(lambda: FaultInjection.objects.get(pk=fault_id).outcome == "injected", 30, "injection")
    return FaultInjection.objects.get(pk=fault_id)


def wait_for_exact_results(client, job: Job, lines: int) -> None:
    """Once the generator is done and the pipeline drained, results equal the ground truth."""
    wait_for(lambda: client.xlen(keys.input_stream(job.key)) >= lines, 180, "all input")

    def drained() -> bool:
        return sum(results(client, job.key).values()) >= sum(
            expected_counts(client, job.key).values()
        )

    wait_for(drained, 240, "the pipeline to catch up", poll_s=2)
    time.sleep(3)  # a duplicate would show up as an overshoot after the catch-up
    assert results(client, job.key) == expected_counts(client, job.key)


def assert_episodes_audited_exact(job: Job) -> None:
    """Stopping the job closes its open episodes; each then gets the audit of the output (its
    counts against the input up to each count's version)."""
    assert api().post(f"/api/jobs/{job.pk}/stop/").status_code == 200

    def all_audited() -> bool:
        return not RecoveryEpisode.objects.filter(job=job, lost__isnull=True).exists()

    # Closed by the controller when the job stops, then audited by a Celery task.
    wait_for(all_audited, 60, "every episode closed and audited")
    for episode in RecoveryEpisode.objects.filter(job=job):
        assert episode.watched_s is not None, episode.notes
        assert (episode.lost, episode.duplicates) == (0, 0), episode.notes
        assert "output audited after it: 0 lost and 0 duplicated" in episode.notes
