"""Keep errors JSON: bodies too large (413) or nested too deep (400) are refused before any view
reads them, and an unexpected exception under /api/ becomes a JSON 500, not a traceback."""

import json
import logging
import re

from django.conf import settings
from django.http import JsonResponse

logger = logging.getLogger(__name__)

# Deeper JSON than this is refused: no request of the API or the console nests beyond a few
# levels, and Python's json module recurses once per level.
DEFAULT_JSON_MAX_DEPTH = 64
STRING_LITERAL = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
BRACKETS = re.compile(rb"[\[\]{}]")
DASH_PREFIX = "/django_plotly_dash/"


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


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """True when the JSON text `body` nests arrays and objects deeper than `limit`.

    Strings are skipped (brackets inside them do not count); the text need not be valid JSON,
    the parser judges that afterwards. Linear in the body size, without recursion.
    """
    text = STRING_LITERAL.sub(b'""', body)
    depth = 0
    for bracket in BRACKETS.findall(text):
        if bracket in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth = max(0, depth - 1)
    return False


def _json_error(status: int, code: str, detail: str) -> JsonResponse:
    body = {"error": {"status": status, "code": code, "detail": detail}}
    return JsonResponse(body, status=status)


class RequestBodyLimitsMiddleware:
    """Refuse oversized and too deeply nested bodies before any view or parser reads them.

    A Content-Length over DATA_UPLOAD_MAX_MEMORY_SIZE gets a JSON 413; a JSON body (API, Dash
    callbacks) nesting deeper than JSON_MAX_DEPTH gets a JSON 400, instead of the parser's
    RecursionError. Both apply to every path, so the API and the Dash endpoints answer alike.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        refusal = self.refusal(request)
        return refusal if refusal is not None else self.get_response(request)

    @staticmethod
    def refusal(request) -> JsonResponse | None:
        raw_length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            return _json_error(400, "bad_request", "Content-Length: not a number")
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            return _json_error(
                413, "payload_too_large", f"request body: at most {limit} bytes, got {length}"
            )
        if length and "json" in (request.content_type or ""):
            depth = getattr(settings, "JSON_MAX_DEPTH", DEFAULT_JSON_MAX_DEPTH)
            # Reading the body here caches it on the request for the parser that follows.
            if json_depth_exceeds(request.body, depth):
                return _json_error(
                    400, "parse_error", f"request body: JSON nested deeper than {depth} levels"
                )
            # DRF answers malformed JSON with its own 400; the Dash endpoints would raise (500).
            if request.path.startswith(DASH_PREFIX):
                try:
                    json.loads(request.body)
                except ValueError as exc:
                    return _json_error(400, "parse_error", f"request body: not valid JSON ({exc})")
        return None
