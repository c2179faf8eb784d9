"""REST API views. Thin: validation and side effects live in console.services."""

from django.db.models import Prefetch
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import SAFE_METHODS
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api import filters
from console.api.pagination import JobListPagination, bounded_int
from console.api.permissions import AdminOnly, AdminWrites
from console.api.renderers import AuditCSVRenderer
from console.api.serializers import (
    AuditEventSerializer,
    FaultInjectionSerializer,
    FleetRecoverySerializer,
    FleetTotalsSerializer,
    JobSerializer,
    JobUpgradeSerializer,
    NodeSerializer,
    PolicySerializer,
    PolicyVersionSerializer,
    RecoveryEpisodeSerializer,
    RegisteredTopologySerializer,
    TopologyRegistrationSerializer,
    UpgradeRequestSerializer,
)
from console.api.sharing import SharedList, SharedRetrieve, shared_read
from console.models import (
    Job,
    JobUpgrade,
    Node,
    Policy,
    RecoveryEpisode,
    RegisteredTopology,
    Replica,
)
from console.policy.config import request_errors
from console.redis import redis_client
from console.services import audit_log
from console.services import faults as fault_service
from console.services import jobs as job_service
from console.services import policy as policy_service
from console.services import topologies as topology_service
from console.services import upgrades as upgrade_service
from console.services.app_operators import app_view
from console.services.control.record import reconcile_failures
from console.services.control.reserve import admission_refusal
from console.services.queries import fleet_totals, job_queryset
from console.services.results import read_results
from console.services.teams import (
    TeamRequestError,
    jobs_visible_to,
    team_for_new_job,
    visible_job_or_404,
)


def launch_admission(topology: str, strategy: str) -> str | None:
    """Why a job of `topology` may not launch now (it would push a host past the resource
    reserve, measured), or None; None too for a topology create_job refuses (it names why)."""
    try:
        _, spec = topology_service.job_topology(topology)
    except KeyError:
        return None
    config = Policy.current().to_config()
    return admission_refusal(redis_client(), spec, strategy, config)


class Refused(APIException):
    """A request refused for a reason other than bad input (conflict, rate limit)."""

    def __init__(self, detail: str, status_code: int, code: str):
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.default_code = code


# A job's replicas with their nodes in the one query that reads the replicas of the jobs shown
# ("replicas__node" would read the nodes in a query of their own).
REPLICAS_WITH_NODES = Prefetch("replicas", queryset=Replica.objects.select_related("node"))


def _params(params) -> list:
    return [param.schema() for param in params]


class JobScoped:
    """A view of one job's data, the job named in the path by `job_url_kwarg`: a job the user
    may not see (another team's, or none) answers 404, also to a write the role would refuse
    (a viewer's) and before the body is validated, so reads and writes of another team's job
    are "not found" for viewers and operators alike, never 403 or 400."""

    job_url_kwarg = "job_pk"

    def check_permissions(self, request):
        names_job = self.job_url_kwarg in self.kwargs
        try:
            super().check_permissions(request)
        except PermissionDenied:
            if names_job and request.user.is_authenticated:
                self.get_job()
            raise
        # Reads look the job up through get_queryset / get_object anyway.
        if names_job and request.method not in SAFE_METHODS:
            self.get_job()

    def get_job(self) -> Job:
        """The job in the path, among the ones the user sees (Http404 otherwise)."""
        if getattr(self, "_job", None) is None:
            self._job = visible_job_or_404(self.request.user, self.kwargs[self.job_url_kwarg])
        return self._job


@extend_schema_view(list=extend_schema(parameters=_params(filters.JOB_PARAMS)))
class JobViewSet(
    JobScoped,
    SharedList,
    SharedRetrieve,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Jobs: list, create (operator), detail, and the `stop` and `restart` actions (operator).

    The list is paged (`limit`, `offset`), filtered and ordered by the query parameters of
    console.api.filters, and carries the fleet's `totals` beside the page."""

    serializer_class = JobSerializer
    queryset = Job.objects.select_related("created_by", "team").prefetch_related(
        "operators", REPLICAS_WITH_NODES
    )
    pagination_class = JobListPagination
    shared_params = filters.JOB_PARAMS
    job_url_kwarg = "pk"

    def get_queryset(self):
        if self.action != "list":
            return jobs_visible_to(self.request.user, super().get_queryset())
        flt, ordering = filters.job_filter(self.request)
        jobs = job_queryset(flt, ordering, jobs=jobs_visible_to(self.request.user))
        return jobs.select_related("created_by", "team").prefetch_related(
            "operators", REPLICAS_WITH_NODES
        )

    def retrieve(self, request, *args, **kwargs):
        """The job; for an app (spark_runtime/apps.py) also `app`: each query's newest batch
        (rates, batch duration, state rows, watermark, sources' offsets and lag) with its
        stateful operators, and the tail of the app's output (console.services.app_operators)."""

        def respond():
            response = mixins.RetrieveModelMixin.retrieve(self, request, *args, **kwargs)
            view = app_view(response.data["topology"], response.data["key"], redis_client())
            if view is not None:
                response.data["app"] = {"queries": view["queries"], "output": view["output"]}
            return response

        return shared_read(request, respond)

    def perform_create(self, serializer):
        data = serializer.validated_data
        try:
            team = team_for_new_job(self.request.user, getattr(data.get("team"), "name", None))
        except TeamRequestError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        strategy = data.get("strategy", Job.Strategy.ADAPTIVE)
        refusal = launch_admission(data["topology"], strategy)
        if refusal is not None:
            # Nothing is created: the client may try again once the hosts have room.
            unavailable = status.HTTP_503_SERVICE_UNAVAILABLE
            raise Refused(f"launch refused: {refusal}", unavailable, "reserve")
        try:
            serializer.instance = job_service.create_job(
                team=team,
                name=data["name"],
                topology=data["topology"],
                strategy=strategy,
                params=data.get("params", {}),
                args=data.get("args"),
                user=self.request.user,
                source=data.get("source"),
                sink=data.get("sink"),
                trigger=data.get("trigger"),
            )
        except job_service.JobRequestError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc

    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None, format=None):
        job = job_service.stop_job(
            self.get_object(), f"stopped by {request.user.username}", user=request.user
        )
        return Response(self.get_serializer(job).data)

    @extend_schema(request=None, responses={202: JobSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request, pk=None, format=None):
        """Run a failed or stopped job again (accepted: the controller starts it)."""
        job = job_service.restart_job(self.get_object(), user=request.user)
        return Response(self.get_serializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def supervision(self, request, pk=None, format=None):
        """How the controller's reconciles of the job fare: `reconcile_failure` is null while
        they succeed, else the failures in a row, since when, the last error and when the
        job is tried again (console.services.control.record.record_reconcile_failure)."""
        job = self.get_object()
        failures = reconcile_failures(redis_client(), [job.key])
        return Response({"reconcile_failure": failures.get(job.key)})

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def results(self, request, pk=None, format=None):
        return Response(read_results(self.get_object()))

    @extend_schema(request=UpgradeRequestSerializer, responses={202: JobUpgradeSerializer})
    @action(detail=True, methods=["post"])
    def upgrade(self, request, pk=None, format=None):
        """Upgrade the running job blue/green to another version of its topology or other
        operator parameters, or change its strategy in place (accepted: the state check and
        the switch follow; the record at /api/jobs/{id}/upgrades/{upgrade id}/ says how far it
        is)."""
        ask = UpgradeRequestSerializer(data=request.data)
        ask.is_valid(raise_exception=True)
        try:
            upgrade = upgrade_service.request_upgrade(
                self.get_object(),
                topology=ask.validated_data.get("topology"),
                params=ask.validated_data.get("params"),
                user=request.user,
                mode=ask.validated_data.get("mode", JobUpgrade.Mode.BLUE_GREEN),
                strategy=ask.validated_data.get("strategy"),
                result_preserving=ask.validated_data["result_preserving"],
            )
        except upgrade_service.UpgradeRequestError as exc:
            raise_refusal(exc)
        return Response(JobUpgradeSerializer(upgrade).data, status=status.HTTP_202_ACCEPTED)


def raise_refusal(exc) -> None:
    """An UpgradeRequestError as the API's answer: 400 naming the field, or 409."""
    if exc.field:
        raise ValidationError({exc.field: [str(exc)]}) from exc
    if exc.status == 409:
        raise Refused(str(exc), 409, "conflict") from exc
    raise ValidationError({"non_field_errors": [str(exc)]}) from exc


class JobUpgradeViewSet(
    JobScoped, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Upgrades of one job, newest first (its version history), and the `confirm` and
    `rollback` actions on one under way (operator role)."""

    serializer_class = JobUpgradeSerializer
    queryset = JobUpgrade.objects.all()  # the schema's types; requests read get_queryset()

    def get_queryset(self):
        return self.get_job().upgrades.select_related("requested_by", "ended_by")

    @extend_schema(request=None, responses={202: JobUpgradeSerializer})
    @action(detail=True, methods=["post"])
    def confirm(self, request, job_pk=None, pk=None, format=None):
        """Retire the old version now (the new one writes the output)."""
        return self._end(upgrade_service.CONFIRM)

    @extend_schema(request=None, responses={202: JobUpgradeSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request, job_pk=None, pk=None, format=None):
        """Give the output back to the old version, which never stopped."""
        return self._end(upgrade_service.ROLLBACK)

    def _end(self, action_name: str):
        try:
            upgrade = upgrade_service.request_end(self.get_object(), action_name, self.request.user)
        except upgrade_service.UpgradeRequestError as exc:
            raise_refusal(exc)
        return Response(JobUpgradeSerializer(upgrade).data, status=status.HTTP_202_ACCEPTED)


@extend_schema_view(list=extend_schema(parameters=_params(filters.FAULT_PARAMS)))
class JobFaultViewSet(
    JobScoped, mixins.ListModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Faults of one job, newest first: list them (filtered by kind and outcome), or ask for one
    (operator role)."""

    serializer_class = FaultInjectionSerializer

    def get_queryset(self):
        faults = self.get_job().faults.select_related("target_node", "requested_by")
        return filters.filter_faults(self.request, faults) if self.action == "list" else faults

    def perform_create(self, serializer):
        data = serializer.validated_data
        try:
            serializer.instance = fault_service.request_fault(
                self.get_job(),
                data["kind"],
                target_operator=data.get("target_operator", ""),
                target_node=data.get("target_node"),
                params=data.get("params", {}),
                requested_by=self.request.user,
            )
        except fault_service.FaultRefused as exc:
            if exc.field:
                raise ValidationError({exc.field: [str(exc)]}) from exc
            code = "conflict" if exc.status == 409 else "throttled"
            raise Refused(str(exc), exc.status, code) from exc


@extend_schema_view(list=extend_schema(parameters=_params(filters.EPISODE_PARAMS)))
class JobRecoveryViewSet(JobScoped, SharedList, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Recovery episodes of one job, newest first (filtered by open, action, strategy)."""

    serializer_class = RecoveryEpisodeSerializer
    shared_params = filters.EPISODE_PARAMS

    def get_queryset(self):
        return filters.filter_episodes(self.request, self.get_job().recoveries.all())


@extend_schema_view(
    list=extend_schema(parameters=[*_params(filters.EPISODE_PARAMS), filters.EPISODE_JOB])
)
class RecoveryViewSet(SharedList, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Recovery episodes of every job, newest first: `?open=true` lists the ones still being
    measured across the fleet."""

    serializer_class = FleetRecoverySerializer
    shared_params = (*filters.EPISODE_PARAMS, filters.EPISODE_JOB_ID)

    def get_queryset(self):
        episodes = filters.filter_episodes(
            self.request,
            RecoveryEpisode.objects.filter(job__in=jobs_visible_to(self.request.user).values("pk")),
        )
        raw = self.request.query_params.get(filters.EPISODE_JOB_ID.name)
        if raw is not None:
            episodes = episodes.filter(job_id=bounded_int(raw, "job", 1, 2**63 - 1))
        return episodes


@extend_schema_view(list=extend_schema(parameters=_params(filters.NODE_PARAMS)))
class NodeViewSet(SharedList, SharedRetrieve, viewsets.ReadOnlyModelViewSet):
    """Nodes with capacities, state and last heartbeat (the list filtered by state and name)."""

    serializer_class = NodeSerializer
    queryset = Node.objects.all()
    shared_params = filters.NODE_PARAMS

    def get_queryset(self):
        nodes = super().get_queryset()
        return filters.filter_nodes(self.request, nodes) if self.action == "list" else nodes


class FleetView(APIView):
    """The fleet at a glance: jobs by status, live replicas by role, nodes by state, open
    recovery episodes. The same object is `totals` of the job list."""

    serializer_class = FleetTotalsSerializer

    @extend_schema(responses={200: FleetTotalsSerializer})
    def get(self, request):
        def respond():
            return Response(FleetTotalsSerializer(fleet_totals(jobs_visible_to(request.user))).data)

        return shared_read(request, respond)


class TopologyViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Registered user jobs, every version (GET), and registration (POST, admin): the module is
    checked against the contract and dry-run on a local Spark session (docs/JOBS.md); a refusal
    lists every problem, naming the operator. `{"app": PATH, "name": NAME}` registers an
    existing app instead: it must compile and import, a refusal naming the app's line.
    Registering an unchanged module or app again answers 200 with its current version; a
    changed one becomes the next version (201)."""

    permission_classes = [AdminWrites]
    serializer_class = RegisteredTopologySerializer
    queryset = RegisteredTopology.objects.select_related("registered_by")

    @extend_schema(
        request=TopologyRegistrationSerializer, responses={201: RegisteredTopologySerializer}
    )
    def create(self, request):
        registration = TopologyRegistrationSerializer(data=request.data)
        registration.is_valid(raise_exception=True)
        data = registration.validated_data
        field = "app" if data.get("app") else "module"
        try:
            if data.get("app"):
                version, created = topology_service.register_app(
                    data["app"], data.get("name"), user=request.user
                )
            else:
                version, created = topology_service.register(data["module"], user=request.user)
        except topology_service.RegistrationRefused as exc:
            named = [e for e in exc.errors if e.startswith("name: ")]
            if named:
                raise ValidationError({"name": named}) from exc
            raise ValidationError({field: exc.errors}) from exc
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(RegisteredTopologySerializer(version).data, status=code)


class PolicyView(APIView):
    """The policy version in force (GET) and changes to it (admin), each written as a new version:
    PATCH changes the fields given; PUT replaces the whole policy (every field required). Unknown
    fields and booleans are refused, values must stay within the bounds of docs/POLICY.md."""

    permission_classes = [AdminWrites]
    serializer_class = PolicySerializer

    def get(self, request):
        return Response(PolicySerializer(Policy.current()).data)

    @extend_schema(responses={201: PolicySerializer})
    def patch(self, request):
        return self._change(request, partial=True)

    @extend_schema(responses={201: PolicySerializer})
    def put(self, request):
        return self._change(request, partial=False)

    def _change(self, request, partial: bool):
        # Checked on the raw body: the serializer would drop unknown keys and turn `true` into 1.0.
        errors = request_errors(request.data, full=not partial)
        if errors:
            raise ValidationError({field: [message] for field, message in errors.items()})
        serializer = PolicySerializer(data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        reason = changes.pop("reason", "")
        try:
            policy = policy_service.change_policy(changes, user=request.user, reason=reason)
        except policy_service.PolicyRejected as exc:
            raise ValidationError({k: [v] for k, v in exc.errors.items()}) from exc
        return Response(PolicySerializer(policy).data, status=status.HTTP_201_CREATED)


class PolicyHistoryView(APIView):
    """The newest 200 policy versions, newest first, each with `changes`: {field: [old, new]}."""

    serializer_class = PolicyVersionSerializer

    @extend_schema(responses={200: PolicyVersionSerializer(many=True)})
    def get(self, request):
        versions = []
        for policy, changes in policy_service.policy_history(limit=200):
            policy.changes = changes
            versions.append(policy)
        return Response(PolicyVersionSerializer(versions, many=True).data)


class PolicyRevertView(APIView):
    """POST (admin): a NEW version with the values of version `version`, reason "revert to vN"."""

    permission_classes = [AdminWrites]
    serializer_class = PolicySerializer

    @extend_schema(request=None, responses={201: PolicySerializer})
    def post(self, request, version: int):
        try:
            policy = policy_service.revert_policy(version, user=request.user)
        except Policy.DoesNotExist as exc:
            raise NotFound(f"no policy version {version}") from exc
        except policy_service.PolicyRejected as exc:
            raise ValidationError({k: [v] for k, v in exc.errors.items()}) from exc
        return Response(PolicySerializer(policy).data, status=status.HTTP_201_CREATED)


AUDIT_FILTERS = [
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="from this time (ISO 8601)"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="before this time (ISO 8601)"),
    OpenApiParameter("action", OpenApiTypes.STR, description="an action or its domain: fault"),
    OpenApiParameter("actor", OpenApiTypes.STR, description="the actor's username"),
    OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"], description="default json"),
]


class AuditView(APIView):
    """The audit log (admin), newest first: every write with who, when, what and from where,
    as a JSON list or CSV (`?format=csv`, a header row), filtered by time, action and actor.
    A time that does not parse is a 400 naming the parameter."""

    permission_classes = [AdminOnly]
    renderer_classes = [JSONRenderer, AuditCSVRenderer]

    @extend_schema(parameters=AUDIT_FILTERS, responses={200: AuditEventSerializer(many=True)})
    def get(self, request):
        times = {}
        for name in ("since", "until"):
            raw = request.query_params.get(name)
            if raw is None:
                continue
            try:
                times[name] = audit_log.parse_time(raw)
            except ValueError:
                raise ValidationError(
                    {name: [f"not an ISO 8601 date and time: {raw[:40]!r}"]}
                ) from None
        events = audit_log.search(
            **times,
            actor=filters.text(request, filters.Param("actor", "")),
            action=filters.text(request, filters.Param("action", "")),
        )
        return Response(AuditEventSerializer(events.iterator(), many=True).data)

    def perform_content_negotiation(self, request, force=False):
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:  # DRF's answer to a ?format= that no renderer has
            raise ValidationError({"format": ["one of json, csv"]}) from None

    def finalize_response(self, request, response, *args, **kwargs):
        # Errors are JSON like everywhere in the API, also when CSV was asked for.
        if response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)
