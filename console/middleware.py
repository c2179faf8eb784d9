"""Keep API errors JSON: an unexpected exception under /api/ becomes a JSON 500, not a traceback."""

import logging

from django.http import JsonResponse

logger = logging.getLogger(__name__)


class ApiJsonErrorsMiddleware:
    """Turn unhandled exceptions on API paths into `{"error": {...}}` with status 500."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not request.path.startswith("/api/"):
            return None
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return JsonResponse(
            {"error": {"status": 500, "code": "server_error", "detail": "internal server error"}},
            status=500,
        )
