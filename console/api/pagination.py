"""Limit/offset pagination with bounds: a bad `limit` or `offset` is a 400 naming it, never a 500.

DRF's LimitOffsetPagination quietly replaces a value it cannot parse with the default and, without
`max_limit`, passes any integer to the database, where one above 2**63 fails. Here both are
integers in a range the schema states, and anything else is refused.
"""

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

from console.services.queries import fleet_totals
from console.services.teams import jobs_visible_to

MAX_LIMIT = 1000
# Far beyond any table this console keeps (metrics are purged after METRIC_RETENTION_HOURS), and
# far below the 64-bit limit of SQL OFFSET.
MAX_OFFSET = 10**9


def bounded_int(raw: str, field: str, minimum: int, maximum: int) -> int:
    """`raw` as an integer in [minimum, maximum], or a ValidationError naming `field`."""
    text = raw.strip()
    # int() accepts "1_000" and surrounding spaces; a query parameter should be plain digits.
    if not text.lstrip("-").isdigit() or len(text) > 20:
        raise ValidationError({field: [f"must be an integer, got {raw[:40]!r}"]})
    value = int(text)
    if not minimum <= value <= maximum:
        raise ValidationError({field: [f"must be between {minimum} and {maximum}, got {value}"]})
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """`?limit=` 1..MAX_LIMIT (default PAGE_SIZE) and `?offset=` 0..MAX_OFFSET, else 400."""

    max_limit = MAX_LIMIT

    def get_limit(self, request):
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        return bounded_int(raw, self.limit_query_param, 1, self.max_limit)

    def get_offset(self, request):
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        return bounded_int(raw, self.offset_query_param, 0, MAX_OFFSET)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters


class JobListPagination(BoundedLimitOffsetPagination):
    """The job list's pages, each with the fleet's `totals` beside them (whatever the filter),
    so a client shows "12 of 214 jobs; 3 failed; 48/50 nodes up" from one request."""

    def get_paginated_response(self, data):
        response = super().get_paginated_response(data)
        response.data["totals"] = fleet_totals(jobs_visible_to(self.request.user))
        return response

    def get_paginated_response_schema(self, schema):
        paginated = super().get_paginated_response_schema(schema)
        paginated["properties"]["totals"] = {"$ref": "#/components/schemas/FleetTotals"}
        paginated["required"] = [*paginated.get("required", []), "totals"]
        return paginated
