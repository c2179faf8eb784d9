"""One JSON shape for every API error: {"error": {"status", "code", "detail"}}."""

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler

from console.models import InvalidTransition


def json_exception_handler(exc, context):
    """DRF's handler, plus Django validation errors and lifecycle conflicts, in one envelope."""
    if isinstance(exc, DjangoValidationError):
        exc = ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, InvalidTransition):
        return Response(
            {"error": {"status": 409, "code": "conflict", "detail": str(exc)}},
            status=status.HTTP_409_CONFLICT,
        )
    response = exception_handler(exc, context)
    if response is None:
        return None  # the middleware turns it into a JSON 500
    code = getattr(exc, "default_code", "error")
    detail = response.data
    if isinstance(detail, dict) and set(detail) == {"detail"}:
        detail = detail["detail"]
    response.data = {"error": {"status": response.status_code, "code": code, "detail": detail}}
    return response
