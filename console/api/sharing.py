"""The API's hot reads, shared by every reader (console.services.shared_data).

Dashboards, scripts and the console poll the job list, a job, its recoveries, the nodes and the
fleet totals every few seconds; what they read depends on who reads it only through the teams
whose jobs they see (console.services.teams.scope_key, part of the key: admins share one entry,
members of the same teams another). `SharedList` and `SharedRetrieve` answer them
from data computed at most once per SHARED_FRESH_S for every reader with the same path and
query, and say how old it is in the standard `Age` header. An API write starts the shared data again
(console.middleware.SharedDataInvalidationMiddleware).

The key is the path and the query parameters the view knows (its filters and ordering, `limit`
and `offset`), normalised: a list parameter's values are split at commas, deduplicated and
sorted, so `?status=failed,running` and `?status=running&status=failed` share one entry. Any
other parameter is ignored for the key, as the view ignores it for the answer: `?junk=1` reads
the entry of the same request without it, so made-up parameters cannot fill the shared Redis.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable

from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from console.api.filters import Param
from console.services.shared_data import entry_key, shared
from console.services.teams import scope_key

# The console's refresh interval: what a reader polling faster would see anyway.
SHARED_FRESH_S = 2.0


def query_key(request, params: Iterable[Param]) -> list:
    """The query parameters of `request` that are among `params`, normalised (see above); the
    others are left out."""
    known = []
    for param in sorted(params, key=lambda p: p.name):
        values = [value.strip() for value in request.GET.getlist(param.name)]
        if param.many:
            values = sorted({part.strip() for value in values for part in value.split(",")} - {""})
        if values:
            known.append([param.name, values])
    return known


def shared_read(request, respond, params: Iterable[Param] = (), fresh_s: float = SHARED_FRESH_S):
    """`respond()`'s answer for this path and the recognised query parameters `params`, shared
    by every reader; only complete (200) answers are shared, anything else goes to this request
    only."""

    def compute():
        response = respond()
        # Plain JSON values: a serializer's ReturnDict holds the serializer itself.
        plain = json.loads(json.dumps(response.data, cls=JSONEncoder))
        return response.status_code, plain

    answer = shared(
        entry_key("api", [request.path, query_key(request, params), scope_key(request.user)]),
        fresh_s,
        compute,
        keep=lambda value: value[0] == 200,
    )
    status_code, data = answer.value
    response = Response(data, status=status_code)
    response["Age"] = str(max(0, math.floor(time.time() - answer.computed_at)))
    return response


def page_params(paginator) -> tuple[Param, ...]:
    """The query parameters of a list's pagination (none without one)."""
    if paginator is None:
        return ()
    names = (paginator.limit_query_param, paginator.offset_query_param)
    return tuple(Param(name, "pagination") for name in names)


class SharedList:
    """Mixin for a viewset with ListModelMixin: `list` is a shared read, keyed by the view's
    `shared_params` (its filters and ordering) and its pagination's parameters."""

    shared_params: tuple[Param, ...] = ()

    def list(self, request, *args, **kwargs):
        params = (*self.shared_params, *page_params(self.paginator))
        return shared_read(
            request, lambda: super(SharedList, self).list(request, *args, **kwargs), params
        )


class SharedRetrieve:
    """Mixin for a viewset with RetrieveModelMixin: `retrieve` is a shared read (of the path
    alone: a detail takes no query parameter)."""

    def retrieve(self, request, *args, **kwargs):
        return shared_read(
            request, lambda: super(SharedRetrieve, self).retrieve(request, *args, **kwargs)
        )
