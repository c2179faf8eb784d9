"""The API's hot reads, shared by every reader (console.services.shared_data).

Dashboards, scripts and the console poll the job list, a job, its recoveries, the nodes and the
fleet totals every few seconds; what they read does not depend on who reads it (the viewer role,
checked before the view runs, is all it takes). `SharedList` and `SharedRetrieve` answer them
from data computed at most once per SHARED_FRESH_S for every reader with the same path and
query, and say how old it is in the standard `Age` header. An API write starts the shared data again
(console.middleware.SharedDataInvalidationMiddleware).
"""

from __future__ import annotations

import json
import math
import time

from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from console.services.shared_data import entry_key, shared

# The console's refresh interval: what a reader polling faster would see anyway.
SHARED_FRESH_S = 2.0


def shared_read(request, respond, fresh_s: float = SHARED_FRESH_S) -> Response:
    """`respond()`'s answer for this path and query, shared by every reader; only complete (200)
    answers are shared, anything else goes to this request only."""

    def compute():
        response = respond()
        # Plain JSON values: a serializer's ReturnDict holds the serializer itself.
        plain = json.loads(json.dumps(response.data, cls=JSONEncoder))
        return response.status_code, plain

    answer = shared(
        entry_key("api", [request.path, sorted(request.GET.lists())]),
        fresh_s,
        compute,
        keep=lambda value: value[0] == 200,
    )
    status_code, data = answer.value
    response = Response(data, status=status_code)
    response["Age"] = str(max(0, math.floor(time.time() - answer.computed_at)))
    return response


class SharedList:
    """Mixin for a viewset with ListModelMixin: `list` is a shared read."""

    def list(self, request, *args, **kwargs):
        return shared_read(request, lambda: super(SharedList, self).list(request, *args, **kwargs))


class SharedRetrieve:
    """Mixin for a viewset with RetrieveModelMixin: `retrieve` is a shared read."""

    def retrieve(self, request, *args, **kwargs):
        return shared_read(
            request, lambda: super(SharedRetrieve, self).retrieve(request, *args, **kwargs)
        )
