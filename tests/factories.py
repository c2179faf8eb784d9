"""factory_boy factories for the domain models."""

import factory
from django.contrib.auth.models import Group, User
from django.utils import timezone

from console.models import (
    FaultInjection,
    Job,
    MetricSample,
    Node,
    RecoveryEpisode,
    Replica,
    ReportSubscription,
    Team,
)
from console.services.jobs import create_job
from console.services.teams import DEFAULT_TEAM
from spark_runtime.progress import ProgressRecord


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")

    @factory.post_generation
    def password(self, create, extracted, **kwargs):
        self.set_password(extracted or "pw-for-tests")
        if create:
            self.save(update_fields=["password"])

    @factory.post_generation
    def role(self, create, extracted, **kwargs):
        if create and extracted:
            self.groups.add(Group.objects.get_or_create(name=extracted)[0])

    @factory.post_generation
    def team(self, create, extracted, **kwargs):
        """`team="name"` puts the user in that team; a user with a role and no team given is in
        the team "default", as migration 0028 put every user with a role."""
        if not create:
            return
        if extracted:
            self.groups.add(Team.named(extracted).group)
        elif self.groups.exists():
            self.groups.add(Team.named(DEFAULT_TEAM).group)


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"node-{n + 1}")
    cpu_total = 4.0
    mem_total_mb = 8192.0
    state = Node.State.UP


def make_job(status: str = Job.Status.CREATED, topology: str = "wordcount", **kwargs) -> Job:
    """A job with its operators (via the real service), forced into `status`; in the team
    "default" unless `team` (a Team) is given."""
    job = create_job(
        team=kwargs.pop("team", None) or Team.named(DEFAULT_TEAM),
        name=kwargs.pop("name", "wc"),
        topology=topology,
        strategy=kwargs.pop("strategy", Job.Strategy.ADAPTIVE),
        params=kwargs.pop("params", {}),
    )
    Job.objects.filter(pk=job.pk).update(status=status)
    job.refresh_from_db()
    return job


class FaultFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = FaultInjection

    kind = FaultInjection.Kind.KILL_DRIVER
    target_operator = "count"


def _watched_until_recovery(episode) -> float | None:
    recovered_at = getattr(episode, "recovered_at", None)
    if recovered_at is None:
        return None
    recovery = getattr(episode, "recovery_time_s", None)
    return (
        recovery if recovery is not None else (recovered_at - episode.detected_at).total_seconds()
    )


class EpisodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RecoveryEpisode

    strategy = Job.Strategy.ADAPTIVE
    stage = "count"
    detected_at = factory.LazyFunction(timezone.now)
    # A recovered episode has final figures: it was watched until its recovery.
    watched_s = factory.LazyAttribute(lambda e: _watched_until_recovery(e))


class MetricFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = MetricSample

    at = factory.LazyFunction(timezone.now)
    name = "throughput_eps"
    value = 100.0


class ReplicaFactory(factory.django.DjangoModelFactory):
    """A running primary of a stage; pass job, node, stage and role to place it."""

    class Meta:
        model = Replica

    replica_id = factory.Sequence(lambda n: f"replica-{n}")
    stage = "count"
    role = Replica.Role.PRIMARY
    state = Replica.State.RUNNING
    pid = factory.Sequence(lambda n: 10_000 + n)
    last_heartbeat = factory.LazyFunction(timezone.now)


class ReportSubscriptionFactory(factory.django.DjangoModelFactory):
    """A report subscription for all jobs (daily at 07:00 UTC unless `crontab` is given)."""

    class Meta:
        model = ReportSubscription
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"report-{n}")
    recipients = "ops@example.org"
    scope = ReportSubscription.Scope.ALL
    period_hours = 24

    @factory.post_generation
    def jobs(self, create, extracted, **kwargs):
        if create and extracted:
            self.jobs.set(extracted)


def progress_record(**fields) -> ProgressRecord:
    """A data-plane progress record: a primary's final batch, with `fields` overridden."""
    base = {
        "replica": "count-0",
        "stage": "count",
        "role": "primary",
        "node": "node-1",
        "query": "job.count.0",
        "segment": "0",
        "batch": 0,
        "at": 0.0,
        "input_rows": 0,
        "input_rate": None,
        "processed_rate": None,
        "batch_ms": None,
        "state_rows": 0,
        "state_memory_bytes": 0,
        "rows_out": 0,
        "written": 0,
        "final": True,
        "buffered": 0,
    }
    return ProgressRecord(**{**base, **fields})
