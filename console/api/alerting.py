"""The API of alert routing: routes (`/api/alert-routes/`: operators read, admins write, every
write in the audit log) and deliveries (`/api/alert-deliveries/`: read-only, newest first)."""

from __future__ import annotations

from rest_framework import mixins, serializers, status, viewsets
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.response import Response

from console.alerting_payloads import EVENTS
from console.models import Alert, AlertDelivery, AlertRoute, Job, Team, route_target_error
from console.roles import ADMIN, OPERATOR, has_role
from console.services import alert_routing
from console.services.audit_log import record


class RoutePermission(BasePermission):
    """Operators and admins read routes and deliveries; only admins write routes."""

    message = "your role does not allow this"

    def has_permission(self, request, view):
        return has_role(request.user, OPERATOR if request.method in SAFE_METHODS else ADMIN)


class AlertRouteSerializer(serializers.ModelSerializer):
    """A route; `secret` is write-only (shown once, in the answer to the create)."""

    events = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(EVENTS)), required=False, allow_empty=True
    )
    teams = serializers.SlugRelatedField(
        many=True, slug_field="name", queryset=Team.objects.all(), required=False
    )
    jobs = serializers.PrimaryKeyRelatedField(many=True, queryset=Job.objects.all(), required=False)
    secret = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=200
    )

    class Meta:
        model = AlertRoute
        fields = [
            "id",
            "name",
            "channel",
            "target",
            "events",
            "min_severity",
            "teams",
            "jobs",
            "enabled",
            "secret",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]

    def validate_events(self, events):
        return sorted(set(events))

    def validate(self, attrs):
        channel = attrs.get("channel", getattr(self.instance, "channel", None))
        target = attrs.get("target", getattr(self.instance, "target", ""))
        problem = route_target_error(channel, target)
        if problem:
            raise serializers.ValidationError({"target": [problem]})
        if "secret" in attrs and not attrs["secret"]:
            attrs.pop("secret")
        return attrs

    def create(self, validated_data):
        validated_data.setdefault("secret", alert_routing.new_secret())
        return super().create(validated_data)


class VisibleFirst:
    """One object in the path that the user may not see (get_queryset narrows to what they may)
    answers 404 before any role check, to every method: as another team's job does
    (console/api/views.py, JobScoped), never 403."""

    def check_permissions(self, request):
        if "pk" in self.kwargs and request.user.is_authenticated:
            get_object_or_404(self.get_queryset(), pk=self.kwargs["pk"])
        super().check_permissions(request)


class AlertRouteViewSet(VisibleFirst, viewsets.ModelViewSet):
    """Alert routes: where the chosen events of the chosen jobs or teams go (docs/ALERTING.md).
    POST, PUT, PATCH and DELETE are for admins and written to the audit log. A route naming
    another team or its jobs is "not found" for viewers and operators, to every method, as
    another team's job is (console/api/views.py, JobScoped)."""

    permission_classes = [RoutePermission]
    serializer_class = AlertRouteSerializer

    def get_queryset(self):
        # Admins write every route; others read the routes of their teams and jobs only.
        return alert_routing.routes_visible_to(self.request.user).prefetch_related("teams", "jobs")

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        route = serializer.save()
        after = alert_routing.route_audit(route)
        record("route.create", request=request, target=f"route:{route.pk}", detail=after)
        # The secret (given or generated) is shown this once, to configure the receiver.
        return Response({**serializer.data, "secret": route.secret}, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer):
        before = alert_routing.route_audit(serializer.instance)
        route = serializer.save()
        after = alert_routing.route_audit(route)
        changes = {
            name: [before[name], after[name]] for name in after if before[name] != after[name]
        }
        if "secret" in serializer.validated_data:
            changes["secret"] = "changed"
        record("route.change", request=self.request, target=f"route:{route.pk}", detail=changes)

    def perform_destroy(self, instance):
        detail = alert_routing.route_audit(instance)
        pk = instance.pk
        instance.delete()
        record("route.delete", request=self.request, target=f"route:{pk}", detail=detail)


class AlertDeliverySerializer(serializers.ModelSerializer):
    """One delivery with its alert's key and event and its route's name and channel."""

    alert_key = serializers.CharField(source="alert.key")
    event = serializers.CharField(source="alert.event")
    severity = serializers.CharField(source="alert.severity")
    summary = serializers.CharField(source="alert.summary")
    job = serializers.IntegerField(source="alert.job_id", allow_null=True)
    route = serializers.CharField(source="route.name")
    channel = serializers.CharField(source="route.channel")

    class Meta:
        model = AlertDelivery
        fields = [
            "id",
            "alert_key",
            "event",
            "severity",
            "summary",
            "job",
            "route",
            "channel",
            "action",
            "status",
            "attempts",
            "created_at",
            "next_attempt_at",
            "delivered_at",
            "response_status",
            "last_error",
        ]
        read_only_fields = fields


class AlertDeliveryViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Alert deliveries, newest first: `?status=pending|delivered|failed`, `?route=<id>`,
    `?alert_key=<key>` narrow the list."""

    permission_classes = [RoutePermission]
    serializer_class = AlertDeliverySerializer

    def get_queryset(self):
        rows = alert_routing.deliveries_visible_to(self.request.user)
        rows = rows.select_related("alert", "route").order_by("-created_at", "-id")
        params = self.request.query_params
        if params.get("status"):
            rows = rows.filter(status=params["status"])
        if params.get("route", "").isdigit():
            rows = rows.filter(route_id=int(params["route"]))
        if params.get("alert_key"):
            rows = rows.filter(alert__key=params["alert_key"])
        return rows


class AlertSerializer(serializers.ModelSerializer):
    """One alert: its condition's key, state and how many checks saw it."""

    class Meta:
        model = Alert
        fields = [
            "id",
            "key",
            "event",
            "severity",
            "job",
            "state",
            "opened_at",
            "last_seen_at",
            "resolved_at",
            "seen",
            "summary",
            "details",
        ]
        read_only_fields = fields


class AlertViewSet(
    VisibleFirst, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Alerts of the jobs the user sees, newest opened first: `?state=open|resolved`,
    `?event=`, `?job=<id>` narrow the list."""

    permission_classes = [RoutePermission]
    serializer_class = AlertSerializer

    def get_queryset(self):
        rows = alert_routing.alerts_visible_to(self.request.user).order_by("-opened_at", "-id")
        params = self.request.query_params
        if params.get("state"):
            rows = rows.filter(state=params["state"])
        if params.get("event"):
            rows = rows.filter(event=params["event"])
        if params.get("job", "").isdigit():
            rows = rows.filter(job_id=int(params["job"]))
        return rows
