"""REST API views. Thin: validation and side effects live in console.services."""

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api import filters
from console.api.pagination import JobListPagination, bounded_int
from console.api.permissions import AdminWrites
from console.api.serializers import (
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
from console.dash.data import fleet_totals, job_queryset
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
from console.services import faults as fault_service
from console.services import jobs as job_service
from console.services import policy as policy_service
from console.services import topologies as topology_service
from console.services import upgrades as upgrade_service
from console.services.control.record import reconcile_failures
from console.services.results import read_results


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


@extend_schema_view(list=extend_schema(parameters=_params(filters.JOB_PARAMS)))
class JobViewSet(
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
    queryset = Job.objects.select_related("created_by").prefetch_related(
        "operators", REPLICAS_WITH_NODES
    )
    pagination_class = JobListPagination
    shared_params = filters.JOB_PARAMS

    def get_queryset(self):
        if self.action != "list":
            return super().get_queryset()
        flt, ordering = filters.job_filter(self.request)
        jobs = job_queryset(flt, ordering)
        return jobs.select_related("created_by").prefetch_related("operators", REPLICAS_WITH_NODES)

    def perform_create(self, serializer):
        data = serializer.validated_data
        try:
            serializer.instance = job_service.create_job(
                name=data["name"],
                topology=data["topology"],
                strategy=data.get("strategy", Job.Strategy.ADAPTIVE),
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
    def stop(self, request, pk=None):
        job = job_service.stop_job(self.get_object(), f"stopped by {request.user.username}")
        return Response(self.get_serializer(job).data)

    @extend_schema(request=None, responses={202: JobSerializer})
    @action(detail=True, methods=["post"])
    def restart(self, request, pk=None):
        """Run a failed or stopped job again (accepted: the controller starts it)."""
        job = job_service.restart_job(self.get_object())
        return Response(self.get_serializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def supervision(self, request, pk=None):
        """How the controller's reconciles of the job fare: `reconcile_failure` is null while
        they succeed, else the failures in a row, since when, the last error and when the
        job is tried again (console.services.control.record.record_reconcile_failure)."""
        job = self.get_object()
        failures = reconcile_failures(redis_client(), [job.key])
        return Response({"reconcile_failure": failures.get(job.key)})

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def results(self, request, pk=None):
        return Response(read_results(self.get_object()))

    @extend_schema(request=UpgradeRequestSerializer, responses={202: JobUpgradeSerializer})
    @action(detail=True, methods=["post"])
    def upgrade(self, request, pk=None):
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


class JobUpgradeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Upgrades of one job, newest first (its version history), and the `confirm` and
    `rollback` actions on one under way (operator role)."""

    serializer_class = JobUpgradeSerializer
    queryset = JobUpgrade.objects.all()  # the schema's types; requests read get_queryset()

    def get_queryset(self):
        job = get_object_or_404(Job, pk=self.kwargs["job_pk"])
        return job.upgrades.select_related("requested_by", "ended_by")

    @extend_schema(request=None, responses={202: JobUpgradeSerializer})
    @action(detail=True, methods=["post"])
    def confirm(self, request, job_pk=None, pk=None):
        """Retire the old version now (the new one writes the output)."""
        return self._end(upgrade_service.CONFIRM)

    @extend_schema(request=None, responses={202: JobUpgradeSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request, job_pk=None, pk=None):
        """Give the output back to the old version, which never stopped."""
        return self._end(upgrade_service.ROLLBACK)

    def _end(self, action_name: str):
        try:
            upgrade = upgrade_service.request_end(self.get_object(), action_name, self.request.user)
        except upgrade_service.UpgradeRequestError as exc:
            raise_refusal(exc)
        return Response(JobUpgradeSerializer(upgrade).data, status=status.HTTP_202_ACCEPTED)


@extend_schema_view(list=extend_schema(parameters=_params(filters.FAULT_PARAMS)))
class JobFaultViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Faults of one job, newest first: list them (filtered by kind and outcome), or ask for one
    (operator role)."""

    serializer_class = FaultInjectionSerializer

    def get_job(self) -> Job:
        return get_object_or_404(Job, pk=self.kwargs["job_pk"])

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
class JobRecoveryViewSet(SharedList, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Recovery episodes of one job, newest first (filtered by open, action, strategy)."""

    serializer_class = RecoveryEpisodeSerializer
    shared_params = filters.EPISODE_PARAMS

    def get_queryset(self):
        job = get_object_or_404(Job, pk=self.kwargs["job_pk"])
        return filters.filter_episodes(self.request, job.recoveries.all())


@extend_schema_view(
    list=extend_schema(parameters=[*_params(filters.EPISODE_PARAMS), filters.EPISODE_JOB])
)
class RecoveryViewSet(SharedList, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Recovery episodes of every job, newest first: `?open=true` lists the ones still being
    measured across the fleet."""

    serializer_class = FleetRecoverySerializer
    shared_params = (*filters.EPISODE_PARAMS, filters.EPISODE_JOB_ID)

    def get_queryset(self):
        episodes = filters.filter_episodes(self.request, RecoveryEpisode.objects.all())
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
        return shared_read(request, lambda: Response(FleetTotalsSerializer(fleet_totals()).data))


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
