"""Admin pages for every model, with the list columns and filters ops teams search by."""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import Group
from django.forms.models import construct_instance
from django.http import HttpResponseRedirect
from django.utils.html import format_html, format_html_join

from console.auth_throttle import LockoutAwareAdminAuthenticationForm
from console.models import (
    Alert,
    AlertDelivery,
    AlertRoute,
    FaultInjection,
    Job,
    JobUpgrade,
    MetricSample,
    Node,
    Operator,
    Policy,
    PredictorTraining,
    RecoveryEpisode,
    RegisteredTopology,
    Replica,
    ReportSubscription,
    SentAlert,
    Team,
)
from console.models.teams import TEAM_GROUP_PREFIX
from console.policy.config import BOUNDS, PolicyConfig, PolicyConfigError
from console.roles import ADMIN, OPERATOR, VIEWER, has_role
from console.services import alert_routing
from console.services import policy as policy_service
from console.services import reports as report_service
from console.services import topologies as topology_service
from console.services.audit_log import record


class RoleReadable:
    """Shown in the admin to `read_role` and the roles above it."""

    read_role = VIEWER

    def has_module_permission(self, request):
        return has_role(request.user, self.read_role)

    def has_view_permission(self, request, obj=None):
        return has_role(request.user, self.read_role)


class AdminsWrite(RoleReadable, admin.ModelAdmin):
    """Rows an admin edits here (`read_role` and up read them)."""

    def has_add_permission(self, request):
        return has_role(request.user, ADMIN)

    def has_change_permission(self, request, obj=None):
        return has_role(request.user, ADMIN)

    def has_delete_permission(self, request, obj=None):
        return has_role(request.user, ADMIN)


class ServiceOwnedAdmin(admin.ModelAdmin):
    """Rows that console/services/ write (for the controller, the API and the console's
    controls): read-only here. An edit in the admin would skip the service's checks and what it
    does beside the row (tasks for the controller and the agents, Redis keys, audit records); a
    job's strategy, for one, changes only through an upgrade."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Team)
class TeamAdmin(AdminsWrite):
    """Teams: admins add them by name (their group `team:<name>` comes with them). Members are
    the group's users: add or remove them on the user's page (Groups) or the group's. An empty
    team can be deleted; one with jobs cannot (Job.team is PROTECT)."""

    list_display = ["name", "group", "member_names"]
    search_fields = ["name"]
    fields = ["name", "group", "member_names"]
    readonly_fields = ["group", "member_names"]

    @admin.display(description="members")
    def member_names(self, team):
        return ", ".join(sorted(team.group.user_set.values_list("username", flat=True))) or "-"

    def get_readonly_fields(self, request, obj=None):
        # The name is the group's too: it is given once, when the team is added.
        return [*self.readonly_fields, "name"] if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if not change:
            obj.group, _ = Group.objects.get_or_create(name=f"{TEAM_GROUP_PREFIX}{obj.name}")
        super().save_model(request, obj, form, change)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    """Nodes are registered here (name and the capacity they offer); their state and heartbeat
    are the controller's."""

    list_display = ["name", "state", "cpu_total", "mem_total_mb", "last_heartbeat"]
    list_filter = ["state"]
    search_fields = ["name"]
    readonly_fields = ["state", "last_heartbeat"]


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
        "fault_rate_source",
    ]
    readonly_fields = fields
    can_delete = False


@admin.register(Job)
class JobAdmin(ServiceOwnedAdmin):
    """Jobs are created, started, stopped and upgraded through the API, the console or the
    management commands."""

    list_display = ["name", "team", "topology", "strategy", "status", "created_by", "created_at"]
    list_filter = ["team", "status", "strategy", "topology"]
    search_fields = ["name", "key"]
    inlines = [OperatorInline]


@admin.register(Operator)
class OperatorAdmin(ServiceOwnedAdmin):
    list_display = ["name", "job", "kind", "stage", "priority", "mode", "checkpoint_interval_s"]
    list_filter = ["mode", "kind"]
    search_fields = ["name", "job__name"]


@admin.register(Replica)
class ReplicaAdmin(ServiceOwnedAdmin):
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
class FaultInjectionAdmin(ServiceOwnedAdmin):
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


@admin.register(JobUpgrade)
class JobUpgradeAdmin(ServiceOwnedAdmin):
    """Upgrades are records of what happened (ask for one through the API, the console or
    `manage.py upgrade_job`)."""

    list_display = [
        "job", "from_topology", "to_topology", "case", "status", "requested_by", "requested_at",
        "switched_at", "ended_at", "gap_s",
    ]  # fmt: skip
    list_filter = ["status", "case"]
    search_fields = ["job__name", "from_topology", "to_topology"]


@admin.register(RecoveryEpisode)
class RecoveryEpisodeAdmin(ServiceOwnedAdmin):
    list_display = [
        "job",
        "stage",
        "strategy",
        "action",
        "detected_at",
        "downtime_s",
        "recovery_time_s",
        "watched_s",
        "peak_p99_ms",
        "lost",
        "duplicates",
    ]
    list_filter = ["strategy", "action"]
    date_hierarchy = "detected_at"


@admin.register(MetricSample)
class MetricSampleAdmin(ServiceOwnedAdmin):
    list_display = ["at", "name", "value", "job", "stage", "node"]
    list_filter = ["name"]
    date_hierarchy = "at"


class VersionedAdmin(RoleReadable, admin.ModelAdmin):
    """Permissions of a history of immutable versions (policies, registered topologies): every
    staff user with a role reads it; only admins add a version; nobody edits or deletes one."""

    def has_add_permission(self, request):
        # The role decides, not Django model permissions: an operator who happens to hold
        # console.add_policy still cannot change thresholds.
        return has_role(request.user, ADMIN)

    def has_change_permission(self, request, obj=None):
        # Viewing a version is allowed; editing one in place is not (the history is the audit).
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PolicyAdminForm(forms.ModelForm):
    """A new policy version: every threshold checked by PolicyConfig, each error on its field."""

    reason = forms.CharField(
        max_length=300, required=True, help_text="Required: why the thresholds change."
    )

    class Meta:
        model = Policy
        fields = ["reason", *Policy.threshold_field_names()]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Show each field's range (the browser keeps number inputs in it; clean() decides).
        for name, bound in BOUNDS.items():
            field = self.fields.get(name)
            if field is None:
                continue  # a stored version: its fields are read-only, not form fields
            field.widget.attrs.update(min=bound.low, max=bound.high)
            described = f"Range {bound.interval()}: {bound.why}."
            field.help_text = f"{field.help_text} {described}" if field.help_text else described

    def clean(self):
        cleaned = super().clean()
        names = Policy.threshold_field_names()
        if any(name not in cleaned for name in names):
            # A field already failed its own check (e.g. not a number); its message is shown and
            # the cross-field rules cannot be evaluated without it.
            return cleaned
        try:
            PolicyConfig(**{name: cleaned[name] for name in names}).validate()
        except PolicyConfigError as exc:
            for field, message in exc.errors.items():
                self.add_error(field if field in self.fields else None, message)
        return cleaned

    def _post_clean(self):
        # clean() has applied PolicyConfig's rules field by field. ModelForm's default
        # _post_clean would run Policy.clean() again (the same rules, on an instance missing the
        # rejected fields) and repeat every message, so only build the instance here.
        self.instance = construct_instance(self, self.instance, self._meta.fields)


@admin.register(Policy)
class PolicyAdmin(VersionedAdmin):
    """Versions are immutable: "add" starts from the version in force and writes a new one.

    Every staff user with a role may read the history with what each version changed; only
    admins may add a version or revert to an old one (which adds a version too).
    """

    form = PolicyAdminForm
    list_display = [
        "version",
        "in_force",
        "created_at",
        "created_by",
        "reason",
        "changes_summary",
    ]
    list_display_links = ["version"]
    readonly_fields = ["version", "created_at", "created_by", "changes_table"]
    actions = ["revert_to_version"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("created_by")

    def get_fields(self, request, obj=None):
        names = ["reason", *Policy.threshold_field_names()]
        if obj is None:
            return names
        return ["version", "created_at", "created_by", "changes_table", *names]

    def get_changeform_initial_data(self, request):
        current = Policy.current()
        return {name: getattr(current, name) for name in Policy.threshold_field_names()}

    @admin.display(description="in force", boolean=True)
    def in_force(self, obj):
        return (
            obj.version
            == Policy.objects.order_by("-version").values_list("version", flat=True).first()
        )

    @admin.display(description="changes")
    def changes_summary(self, obj):
        changes = obj.changes_from_previous()
        if not changes:
            return "-"
        return ", ".join(f"{name}: {old} → {new}" for name, (old, new) in changes.items())

    @admin.display(description="changes from the previous version")
    def changes_table(self, obj):
        changes = obj.changes_from_previous() if obj.pk else {}
        if not changes:
            return "no change from the previous version" if obj.pk else "-"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((name, old, new) for name, (old, new) in changes.items()),
        )
        return format_html("<table><tr><th>field</th><th>old</th><th>new</th></tr>{}</table>", rows)

    @admin.action(
        description="Revert to the selected version (writes a new version)", permissions=["add"]
    )
    def revert_to_version(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one version to revert to.", messages.ERROR)
            return
        target = queryset.get()
        created = policy_service.revert_policy(target.version, user=request.user)
        self.message_user(
            request,
            f"Policy version {created.version} (a copy of v{target.version}) is now in force.",
            messages.SUCCESS,
        )

    def save_model(self, request, obj, form, change):
        changes = {name: form.cleaned_data[name] for name in Policy.threshold_field_names()}
        created = policy_service.change_policy(
            changes, user=request.user, reason=form.cleaned_data["reason"]
        )
        obj.pk, obj.version = created.pk, created.version

    def response_add(self, request, obj, post_url_continue=None):
        messages.success(request, f"Policy version {obj.version} is now in force.")
        return HttpResponseRedirect("../")


class TopologyRegistrationForm(forms.ModelForm):
    """Register a user job: the module is checked and dry-run (docs/JOBS.md); every problem is
    shown on the module field. (An existing app registers through the API or manage.py.)"""

    # Required here though the model allows it empty (an app's version has no module).
    module = forms.CharField(max_length=200, help_text="package.module:attribute in the jobs dir")

    class Meta:
        model = RegisteredTopology
        fields = ["module"]

    def clean(self):
        cleaned = super().clean()
        module = cleaned.get("module")
        if module:
            try:
                self.registered, self.created = topology_service.register(module, self.user)
            except topology_service.RegistrationRefused as exc:
                for error in exc.errors:
                    self.add_error("module", error)
        return cleaned

    def _post_clean(self):
        # The service has saved the version; there is no instance of this form to build.
        return None


@admin.register(RegisteredTopology)
class RegisteredTopologyAdmin(VersionedAdmin):
    """Registered user jobs. Versions are immutable; "add" registers a module (admins only) and
    writes the next version when it changed, with who and when."""

    form = TopologyRegistrationForm
    list_display = [
        "name", "version", "module", "app", "registered_by", "registered_at", "description",
    ]  # fmt: skip
    list_filter = ["name"]
    readonly_fields = [
        "name",
        "version",
        "module",
        "app",
        "description",
        "source_sha256",
        "shape",
        "registered_by",
        "registered_at",
        "source",
    ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.user = request.user
        return form

    def get_fields(self, request, obj=None):
        return ["module"] if obj is None else self.readonly_fields

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        # The form's clean() registered it (the service saves); keep what it did for the message.
        obj.pk, obj.name, obj.version = (
            form.registered.pk,
            form.registered.name,
            form.registered.version,
        )
        obj.registered_now = form.created

    def response_add(self, request, obj, post_url_continue=None):
        if obj.registered_now:
            messages.success(request, f"{obj.module} is registered as {obj.ident}.")
        else:
            messages.info(request, f"{obj.module} is unchanged: {obj.ident} is the newest version.")
        return HttpResponseRedirect("../")


class ReportSubscriptionForm(forms.ModelForm):
    class Meta:
        model = ReportSubscription
        fields = [
            "name",
            "enabled",
            "recipients",
            "scope",
            "jobs",
            "team",
            "period_hours",
            "crontab",
            "alert_recovery_over_s",
            "alert_on_job_failure",
        ]

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("scope") == ReportSubscription.Scope.SELECTED and not cleaned.get("jobs"):
            self.add_error("jobs", "jobs: choose at least one job when the scope is selected jobs")
        if cleaned.get("scope") == ReportSubscription.Scope.TEAM and not cleaned.get("team"):
            self.add_error("team", "team: choose the team when the scope is a team's jobs")
        return cleaned


@admin.register(ReportSubscription)
class ReportSubscriptionAdmin(AdminsWrite):
    """Report subscriptions: admins edit them (the crontab too); operators may "send now"."""

    form = ReportSubscriptionForm
    list_display = [
        "name",
        "enabled",
        "recipients",
        "scope",
        "period_hours",
        "crontab",
        "alert_recovery_over_s",
        "alert_on_job_failure",
        "last_sent_at",
    ]
    list_filter = ["enabled", "scope", "team"]
    search_fields = ["name", "recipients"]
    filter_horizontal = ["jobs"]
    readonly_fields = ["periodic_task", "last_sent_at"]
    actions = ["send_now"]

    def has_send_permission(self, request):
        return has_role(request.user, OPERATOR)

    @admin.action(description="Send the report now", permissions=["send"])
    def send_now(self, request, queryset):
        for subscription in queryset:
            try:
                report_service.send_report(subscription)
            except OSError as exc:
                # SMTP errors, refused connections and timeouts are all OSErrors: say what went
                # wrong on the page instead of answering 500.
                self.message_user(
                    request, f"{subscription.name}: sending failed: {exc}", messages.ERROR
                )
            else:
                self.message_user(
                    request,
                    f"{subscription.name}: report sent to {subscription.recipients}.",
                    messages.SUCCESS,
                )


@admin.register(SentAlert)
class SentAlertAdmin(RoleReadable, ServiceOwnedAdmin):
    """The alerts already emailed (read-only): what was sent to whom and when."""

    list_display = ["sent_at", "subscription", "key", "subject"]
    list_filter = ["subscription"]
    search_fields = ["key", "subject"]


@admin.register(PredictorTraining)
class PredictorTrainingAdmin(SentAlertAdmin):
    """The fault predictor's training runs (read-only). Its schedule is the periodic task
    "backstop: train fault predictor" under Periodic tasks, which admins edit."""

    list_display = ["trained_at", "samples", "failures", "r2", "mse", "prior_mse", "used"]
    list_filter = ["used"]
    search_fields = ["reason"]


class AlertRouteForm(forms.ModelForm):
    """A route; the secret is kept when left blank (one is generated for a new route)."""

    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Webhook HMAC secret or PagerDuty routing key; blank keeps the current one "
        "(a new route gets a generated one, shown in the API's answer to its creation).",
    )

    class Meta:
        model = AlertRoute
        fields = ["name", "enabled", "channel", "target", "events", "min_severity", "teams",
                  "jobs", "secret"]  # fmt: skip

    def clean_secret(self):
        given = self.cleaned_data.get("secret")
        return given or self.instance.secret or alert_routing.new_secret()


@admin.register(AlertRoute)
class AlertRouteAdmin(AdminsWrite):
    """Alert routes (docs/ALERTING.md): admins edit them, each write goes to the audit log."""

    read_role = OPERATOR

    form = AlertRouteForm
    list_display = ["name", "enabled", "channel", "target", "min_severity", "events"]
    list_filter = ["enabled", "channel", "min_severity"]
    search_fields = ["name", "target"]
    filter_horizontal = ["teams", "jobs"]

    def save_model(self, request, obj, form, change):
        # Read before the save: the teams and jobs are saved after it (save_related).
        stored = AlertRoute.objects.get(pk=obj.pk) if change else None
        form.audit_before = alert_routing.route_audit(stored) if stored else None
        form.secret_changed = stored is not None and stored.secret != obj.secret
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        route = form.instance
        after = alert_routing.route_audit(route)
        if change:
            before = form.audit_before
            detail = {k: [before[k], v] for k, v in after.items() if before[k] != v}
            if form.secret_changed:
                detail["secret"] = "changed"
            record("route.change", request=request, target=f"route:{route.pk}", detail=detail)
        else:
            record("route.create", request=request, target=f"route:{route.pk}", detail=after)

    def delete_model(self, request, obj):
        detail, pk = alert_routing.route_audit(obj), obj.pk
        super().delete_model(request, obj)
        record("route.delete", request=request, target=f"route:{pk}", detail=detail)

    def delete_queryset(self, request, queryset):
        for route in queryset:
            self.delete_model(request, route)


@admin.register(Alert)
class AlertAdmin(RoleReadable, ServiceOwnedAdmin):
    """Every alert by its key: open or resolved, since when, how many checks saw it
    (read-only: the controller raises and clears them)."""

    read_role = OPERATOR

    list_display = ["key", "event", "severity", "state", "opened_at", "last_seen_at",
                    "resolved_at", "seen", "summary"]  # fmt: skip
    list_filter = ["state", "event", "severity"]
    search_fields = ["key", "summary"]


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(RoleReadable, ServiceOwnedAdmin):
    """Every delivery of an alert to a route, with its attempts and outcome (read-only)."""

    read_role = OPERATOR

    list_display = ["created_at", "alert", "route", "action", "status", "attempts",
                    "response_status", "last_error"]  # fmt: skip
    list_filter = ["status", "action", "route"]
    search_fields = ["alert__key", "last_error"]
    list_select_related = ["alert", "route"]


# The admin login says "locked out" when the throttle refused the attempt (console.auth_throttle).
admin.site.login_form = LockoutAwareAdminAuthenticationForm
