"""Admin pages for every model, with the list columns and filters ops teams search by."""

from django.contrib import admin, messages
from django.http import HttpResponseRedirect

from console.models import (
    FaultInjection,
    Job,
    MetricSample,
    Node,
    Operator,
    Policy,
    RecoveryEpisode,
    Replica,
)
from console.services import policy as policy_service


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "state", "cpu_total", "mem_total_mb", "last_heartbeat"]
    list_filter = ["state"]
    search_fields = ["name"]


class OperatorInline(admin.TabularInline):
    model = Operator
    extra = 0
    fields = [
        "name",
        "kind",
        "stage",
        "priority",
        "mode",
        "checkpoint_interval_s",
        "predicted_fault_rate",
    ]
    readonly_fields = fields
    can_delete = False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["name", "topology", "strategy", "status", "created_by", "created_at"]
    list_filter = ["status", "strategy", "topology"]
    search_fields = ["name", "key"]
    readonly_fields = ["key", "status", "status_reason", "created_at", "started_at", "stopped_at"]
    inlines = [OperatorInline]


@admin.register(Operator)
class OperatorAdmin(admin.ModelAdmin):
    list_display = ["name", "job", "kind", "stage", "priority", "mode", "checkpoint_interval_s"]
    list_filter = ["mode", "kind"]
    search_fields = ["name", "job__name"]


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = [
        "replica_id",
        "job",
        "stage",
        "role",
        "state",
        "node",
        "pid",
        "fencing_epoch",
        "last_heartbeat",
    ]
    list_filter = ["role", "state", "node"]
    search_fields = ["replica_id", "job__name"]


@admin.register(FaultInjection)
class FaultInjectionAdmin(admin.ModelAdmin):
    list_display = [
        "kind",
        "job",
        "target_operator",
        "target_node",
        "requested_by",
        "requested_at",
        "outcome",
    ]
    list_filter = ["kind", "outcome"]
    search_fields = ["job__name", "target_operator"]


@admin.register(RecoveryEpisode)
class RecoveryEpisodeAdmin(admin.ModelAdmin):
    list_display = [
        "job",
        "stage",
        "strategy",
        "action",
        "detected_at",
        "downtime_s",
        "recovery_time_s",
        "peak_p99_ms",
        "lost",
        "duplicates",
    ]
    list_filter = ["strategy", "action"]
    date_hierarchy = "detected_at"


@admin.register(MetricSample)
class MetricSampleAdmin(admin.ModelAdmin):
    list_display = ["at", "name", "value", "job", "stage", "node"]
    list_filter = ["name"]
    date_hierarchy = "at"


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    """Versions are immutable: "add" starts from the version in force and writes a new one."""

    list_display = [
        "version",
        "created_at",
        "created_by",
        "reason",
        "priority_threshold",
        "resource_reserve",
        "checkpoint_min_s",
        "checkpoint_max_s",
    ]
    readonly_fields = ["version", "created_at", "created_by"]

    def get_changeform_initial_data(self, request):
        current = Policy.current()
        return {name: getattr(current, name) for name in Policy.threshold_field_names()}

    def has_change_permission(self, request, obj=None):
        # Viewing a version is allowed; editing one in place is not (the history is the audit).
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        changes = {name: form.cleaned_data[name] for name in Policy.threshold_field_names()}
        created = policy_service.change_policy(
            changes, user=request.user, reason=form.cleaned_data.get("reason", "")
        )
        obj.pk, obj.version = created.pk, created.version

    def response_add(self, request, obj, post_url_continue=None):
        messages.success(request, f"Policy version {obj.version} is now in force.")
        return HttpResponseRedirect("../")
