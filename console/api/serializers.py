"""API representations of the domain models."""

from rest_framework import serializers

from console.models import (
    AuditEvent,
    FaultInjection,
    Job,
    JobUpgrade,
    Node,
    Operator,
    Policy,
    RecoveryEpisode,
    RegisteredTopology,
    Replica,
    Team,
)
from console.policy import recovery_phases


class NodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "cpu_total",
            "mem_total_mb",
            "disk_max_mbps",
            "bw_total_mbps",
            "state",
            "last_heartbeat",
        ]
        read_only_fields = ["state", "last_heartbeat"]


class OperatorSerializer(serializers.ModelSerializer):
    class Meta:
        model = Operator
        fields = [
            "name",
            "kind",
            "stage",
            "upstream",
            "downstream",
            "cpu_demand",
            "mem_demand_mb",
            "demand_source",
            "type_score",
            "resource_score",
            "dependency_score",
            "priority",
            "predicted_fault_rate",
            "fault_rate_source",
            "mode",
            "checkpoint_interval_s",
            "updated_at",
        ]
        read_only_fields = fields


class ReplicaSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Replica
        fields = [
            "replica_id",
            "stage",
            "node",
            "role",
            "state",
            "pid",
            "fencing_epoch",
            "last_heartbeat",
            "started_at",
            "ended_at",
            "checkpoint_interval_s",
            "interval_since",
            "nice",
            "batch_every_s",
            "placement",
        ]
        read_only_fields = fields


class JobSerializer(serializers.ModelSerializer):
    operators = OperatorSerializer(many=True, read_only=True)
    replicas = ReplicaSerializer(many=True, read_only=True)
    # null for jobs started by the system (demo, bench) or whose user was deleted.
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    # The owning team's name; on create, the user's only team when left out
    # (console.services.teams.team_for_new_job). null for jobs the system started.
    team = serializers.SlugRelatedField(
        slug_field="name", queryset=Team.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "team",
            "key",
            "topology",
            "strategy",
            "params",
            "args",
            "source",
            "sink",
            "trigger",
            "status",
            "status_reason",
            "created_by",
            "created_at",
            "started_at",
            "stopped_at",
            "operators",
            "replicas",
        ]
        read_only_fields = [
            "key",
            "status",
            "status_reason",
            "created_by",
            "created_at",
            "started_at",
            "stopped_at",
        ]


class JobUpgradeSerializer(serializers.ModelSerializer):
    """An upgrade of a running job (console.services.upgrades), as recorded."""

    requested_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    ended_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = JobUpgrade
        fields = [
            "id", "job", "requested_by", "requested_at", "stage", "from_topology", "to_topology",
            "from_params", "to_params", "from_strategy", "to_strategy", "mode",
            "result_preserving", "results_compared", "results_differing", "case",
            "reason", "status", "requested_action",
            "blue_replica", "green_replica", "checkpoint_batch", "switched_at", "ended_at",
            "ended_by", "outcome", "gap_s", "lost", "duplicates",
        ]  # fmt: skip
        read_only_fields = fields


class UpgradeRequestSerializer(serializers.Serializer):
    """What POST /api/jobs/{id}/upgrade/ takes: a version of the job's topology and operator
    parameters ({"OPERATOR.KEY": value}), or on its own another strategy; at least one of them
    changes something. `result_preserving`: the new version computes the same results (checked
    while validating)."""

    topology = serializers.CharField(required=False, max_length=48)
    params = serializers.JSONField(required=False)
    strategy = serializers.CharField(required=False, max_length=20)
    mode = serializers.ChoiceField(choices=JobUpgrade.Mode.choices, required=False)
    result_preserving = serializers.BooleanField(required=False, default=False)


class FaultInjectionSerializer(serializers.ModelSerializer):
    target_node = serializers.SlugRelatedField(
        slug_field="name", queryset=Node.objects.all(), required=False, allow_null=True
    )
    requested_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = FaultInjection
        fields = [
            "id",
            "kind",
            "target_operator",
            "target_node",
            "params",
            "requested_by",
            "requested_at",
            "injected_at",
            "outcome",
            "outcome_detail",
        ]
        read_only_fields = [
            "requested_by",
            "requested_at",
            "injected_at",
            "outcome",
            "outcome_detail",
        ]


class RecoveryEpisodeSerializer(serializers.ModelSerializer):
    # Where the recovery's time went: each phase's seconds, null where not seen
    # (console/policy/recovery_phases.py); `phase_marks` the epoch seconds they come from.
    phases = serializers.SerializerMethodField()
    phase_marks = serializers.JSONField(source="phases", read_only=True)

    def get_phases(self, episode) -> dict[str, float | None]:
        return recovery_phases.phase_seconds(episode.phases)

    class Meta:
        model = RecoveryEpisode
        fields = [
            "id",
            "fault",
            "strategy",
            "stage",
            "action",
            "detected_at",
            "recovered_at",
            "downtime_s",
            "recovery_time_s",
            "peak_p99_ms",
            "reprotect_s",
            "watched_s",
            "lost",
            "duplicates",
            "notes",
            "phases",
            "phase_marks",
        ]
        read_only_fields = fields


class PolicySerializer(serializers.ModelSerializer):
    # null for the default version (no one wrote it) or when the user was deleted.
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = Policy
        fields = ["version", "created_at", "created_by", "reason", *Policy.threshold_field_names()]
        read_only_fields = ["version", "created_at", "created_by"]


class PolicyVersionSerializer(PolicySerializer):
    """A policy version in the history, with what it changed: `{field: [old, new]}`."""

    changes = serializers.DictField(
        child=serializers.ListField(), read_only=True, help_text="{field: [old, new]}"
    )

    class Meta(PolicySerializer.Meta):
        fields = [*PolicySerializer.Meta.fields, "changes"]
        read_only_fields = fields


class RegisteredTopologySerializer(serializers.ModelSerializer):
    """One registered version of a user job (the snapshot's source is left out)."""

    registered_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    ident = serializers.CharField(read_only=True, help_text="what a job runs: NAME@VERSION")

    class Meta:
        model = RegisteredTopology
        fields = [
            "id",
            "name",
            "version",
            "ident",
            "module",
            "app",
            "description",
            "source_sha256",
            "shape",
            "registered_by",
            "registered_at",
        ]
        read_only_fields = fields


class TopologyRegistrationSerializer(serializers.Serializer):
    """A registration request: a job module's reference inside the jobs directory, or an
    existing app's path there (with the job's name, by default the file's)."""

    module = serializers.CharField(
        max_length=200,
        required=False,
        help_text="package.module:attribute inside BACKSTOP_JOBS_DIR",
    )
    app = serializers.CharField(
        max_length=200, required=False, help_text="an existing app's path inside BACKSTOP_JOBS_DIR"
    )
    name = serializers.CharField(
        max_length=32, required=False, help_text="the app's job name (default: its file's name)"
    )

    def validate(self, attrs):
        if bool(attrs.get("module")) == bool(attrs.get("app")):
            raise serializers.ValidationError(
                {"module": ["give either module (package.module:attribute) or app (a path)"]}
            )
        if attrs.get("name") and not attrs.get("app"):
            raise serializers.ValidationError({"name": ["name names an app: give app too"]})
        return attrs


class FleetRecoverySerializer(RecoveryEpisodeSerializer):
    """A recovery episode in the fleet-wide list: with the job it belongs to."""

    class Meta(RecoveryEpisodeSerializer.Meta):
        fields = ["job", *RecoveryEpisodeSerializer.Meta.fields]
        read_only_fields = fields


class _JobTotalsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    live = serializers.IntegerField(help_text="starting, running or stopping")
    by_status = serializers.DictField(child=serializers.IntegerField())


class _ReplicaTotalsSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="live replicas (not stopped or failed)")
    primary = serializers.IntegerField()
    standby = serializers.IntegerField()


class _NodeTotalsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    up = serializers.IntegerField()
    down = serializers.IntegerField(help_text="every node not up (down, draining, unknown)")
    by_state = serializers.DictField(child=serializers.IntegerField())


class FleetTotalsSerializer(serializers.Serializer):
    """The whole fleet at a glance (console.services.queries.fleet_totals)."""

    jobs = _JobTotalsSerializer()
    replicas = _ReplicaTotalsSerializer()
    nodes = _NodeTotalsSerializer()
    open_recoveries = serializers.IntegerField(help_text="episodes still being measured")
    jobs_with_open_recoveries = serializers.IntegerField()


class AuditEventSerializer(serializers.ModelSerializer):
    """One audit log event as exported (console.services.audit_log.EXPORT_FIELDS)."""

    # The name at the time of the event: it stays when the user is deleted.
    actor = serializers.CharField(source="actor_name", read_only=True)
    detail = serializers.JSONField(read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["at", "actor", "action", "target", "detail", "address"]
        read_only_fields = fields
