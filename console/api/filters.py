"""Query parameters of the API's lists: filters and orderings, checked like the pagination's.

Plain query parameters, no django-filter: each list names what it accepts here, the schema
documents it (`parameters`), and a value that does not parse is a 400 naming the parameter,
never a 500 and never silently ignored. A list parameter may be repeated (`?status=running&
status=failed`) or comma-separated (`?status=running,failed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError

from console.models import FaultInjection, Job, Node, RecoveryEpisode
from console.services.queries import DEFAULT_JOB_SORT, JOB_SORTS, JobFilter

MAX_TEXT = 100
TRUE = {"true", "1", "yes"}
FALSE = {"false", "0", "no"}


@dataclass(frozen=True)
class Param:
    """One filter or ordering parameter: its name, what it means, and the values it takes
    (`choices`; None for free text, `bool` for true/false)."""

    name: str
    description: str
    choices: tuple[str, ...] | None = None
    many: bool = False
    boolean: bool = False

    def schema(self) -> OpenApiParameter:
        if self.boolean:
            return OpenApiParameter(self.name, OpenApiTypes.BOOL, description=self.description)
        return OpenApiParameter(
            self.name,
            OpenApiTypes.STR,
            description=self.description,
            enum=list(self.choices) if self.choices else None,
            many=self.many or None,
        )


def _texts(request, param: Param) -> list[str]:
    values = []
    for raw in request.query_params.getlist(param.name):
        parts = raw.split(",") if param.many else [raw]
        values += [part.strip() for part in parts if part.strip()]
    for value in values:
        # NUL and other control characters never name anything, and PostgreSQL refuses NUL.
        if len(value) > MAX_TEXT or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValidationError({param.name: [f"not a valid value: {value[:40]!r}"]})
        if param.choices is not None and value not in param.choices:
            allowed = ", ".join(param.choices)
            raise ValidationError({param.name: [f"{value[:40]!r} is not one of {allowed}"]})
    if len(values) > 1 and not param.many:
        raise ValidationError({param.name: ["give it once"]})
    return values


def text(request, param: Param) -> str:
    values = _texts(request, param)
    return values[0] if values else ""


def texts(request, param: Param) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_texts(request, param)))


def boolean(request, param: Param) -> bool | None:
    value = text(request, Param(param.name, param.description))
    if not value:
        return None
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise ValidationError({param.name: [f"must be true or false, got {value[:40]!r}"]})


def _choices(text_choices) -> tuple[str, ...]:
    return tuple(value for value, _ in text_choices.choices)


# --- /api/jobs/ --------------------------------------------------------------------------------

JOB_STATUS = Param("status", "Only jobs in these statuses.", _choices(Job.Status), many=True)
JOB_STRATEGY = Param("strategy", "Only jobs under these strategies.", _choices(Job.Strategy), True)
JOB_TOPOLOGY = Param("topology", "Only jobs running these topologies (e.g. wordcount, name@2).",
                     many=True)  # fmt: skip
JOB_NODE = Param("node", "Only jobs with a live replica on the node of this name.")
JOB_OPEN = Param(
    "open_recovery",
    "true: only jobs with a recovery episode still being measured; false: only jobs without one.",
    boolean=True,
)
JOB_SEARCH = Param("search", "Only jobs whose name contains this (case-insensitive).")
JOB_ORDERING = Param(
    "ordering",
    f"Order of the list (default {DEFAULT_JOB_SORT}): newest or oldest first, by name, status, "
    "strategy or topology, or the highest throughput, p99 or count of open episodes first.",
    tuple(JOB_SORTS),
)
JOB_PARAMS = (JOB_STATUS, JOB_STRATEGY, JOB_TOPOLOGY, JOB_NODE, JOB_OPEN, JOB_SEARCH, JOB_ORDERING)


def job_filter(request) -> tuple[JobFilter, str]:
    """The filter and the order a request asks for."""
    flt = JobFilter(
        status=texts(request, JOB_STATUS),
        strategy=texts(request, JOB_STRATEGY),
        topology=texts(request, JOB_TOPOLOGY),
        node=text(request, JOB_NODE),
        open_recovery=boolean(request, JOB_OPEN),
        search=text(request, JOB_SEARCH),
    )
    return flt, text(request, JOB_ORDERING) or DEFAULT_JOB_SORT


# --- /api/nodes/ -------------------------------------------------------------------------------

NODE_STATE = Param("state", "Only nodes in these states.", _choices(Node.State), many=True)
NODE_SEARCH = Param("search", "Only nodes whose name contains this (case-insensitive).")
NODE_ORDERINGS = {
    "name": ("name",),
    "-name": ("-name",),
    "state": ("state", "name"),
    "last_heartbeat": ("last_heartbeat", "name"),
    "-last_heartbeat": ("-last_heartbeat", "name"),
}
NODE_ORDERING = Param("ordering", "Order of the list (default name).", tuple(NODE_ORDERINGS))
NODE_PARAMS = (NODE_STATE, NODE_SEARCH, NODE_ORDERING)


def filter_nodes(request, nodes):
    states = texts(request, NODE_STATE)
    if states:
        nodes = nodes.filter(state__in=states)
    search = text(request, NODE_SEARCH)
    if search:
        nodes = nodes.filter(name__icontains=search)
    return nodes.order_by(*NODE_ORDERINGS[text(request, NODE_ORDERING) or "name"])


# --- faults of a job ---------------------------------------------------------------------------

FAULT_KIND = Param("kind", "Only faults of these kinds.", _choices(FaultInjection.Kind), True)
FAULT_OUTCOME = Param(
    "outcome", "Only faults with these outcomes.", _choices(FaultInjection.Outcome), True
)
FAULT_PARAMS = (FAULT_KIND, FAULT_OUTCOME)


def filter_faults(request, faults):
    kinds, outcomes = texts(request, FAULT_KIND), texts(request, FAULT_OUTCOME)
    if kinds:
        faults = faults.filter(kind__in=kinds)
    if outcomes:
        faults = faults.filter(outcome__in=outcomes)
    return faults.order_by("-requested_at", "-id")


# --- recovery episodes (of a job, or of the fleet) ---------------------------------------------

EPISODE_OPEN = Param(
    "open",
    "true: only episodes still being measured (no watched_s yet); false: only closed ones.",
    boolean=True,
)
EPISODE_ACTION = Param(
    "action", "Only episodes the controller answered so.", _choices(RecoveryEpisode.Action), True
)
EPISODE_STRATEGY = Param(
    "strategy", "Only episodes of jobs under these strategies.", _choices(Job.Strategy), True
)
EPISODE_PARAMS = (EPISODE_OPEN, EPISODE_ACTION, EPISODE_STRATEGY)
EPISODE_JOB_ID = Param("job", "Only episodes of this job.")
EPISODE_JOB = OpenApiParameter(
    EPISODE_JOB_ID.name, OpenApiTypes.INT, description=EPISODE_JOB_ID.description
)


def filter_episodes(request, episodes):
    is_open = boolean(request, EPISODE_OPEN)
    if is_open is not None:
        episodes = episodes.filter(watched_s__isnull=is_open)
    actions, strategies = texts(request, EPISODE_ACTION), texts(request, EPISODE_STRATEGY)
    if actions:
        episodes = episodes.filter(action__in=actions)
    if strategies:
        episodes = episodes.filter(strategy__in=strategies)
    return episodes.order_by("-detected_at", "-id")
