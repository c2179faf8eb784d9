"""Request middleware: JSON errors under /api/, bodies too large (413) or nested too deep
(400) refused before any view reads them, the real client address behind trusted proxies,
the Content-Security-Policy header, and fresh shared page data after an API write."""

import functools
import ipaddress
import json
import logging
import re

from django.conf import settings
from django.http import JsonResponse

from console.services.audit_log import current_request
from console.services.shared_data import invalidate_all

logger = logging.getLogger(__name__)

# Deeper JSON than this is refused: no request of the API or the console nests beyond a few
# levels, and Python's json module recurses once per level.
DEFAULT_JSON_MAX_DEPTH = 64
STRING_LITERAL = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
BRACKETS = re.compile(rb"[\[\]{}]")
DASH_PREFIX = "/django_plotly_dash/"


class AuditRequestMiddleware:
    """Makes the request being served known to the audit log (audit_log.current_request), so a
    write recorded deep in a service function is stamped with the client's address."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = current_request.set(request)
        try:
            return self.get_response(request)
        finally:
            current_request.reset(token)


class SharedDataInvalidationMiddleware:
    """After a write through the API succeeds, the data shared by every viewer starts again
    (console.services.shared_data), so the next read shows the change."""

    SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            request.path.startswith("/api/")
            and request.method not in self.SAFE_METHODS
            and response.status_code < 400
        ):
            invalidate_all()
        return response


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


class TrustedProxyMiddleware:
    """Set REMOTE_ADDR to the real client address when the request came through a trusted proxy.

    X-Forwarded-For is a list each proxy appends the address it received the request from to.
    A client can send any list it likes, so only the entries appended by proxies we trust mean
    anything: starting from the direct peer, while the address at hand is a trusted proxy, step
    one entry to the left; the first address that is not a trusted proxy is the client. With the
    direct peer not trusted (no proxy, or someone bypassing it), the header is ignored.

    Everything after this middleware (login throttling, audit log lines) reads REMOTE_ADDR; the
    peer's own address is kept in META["BACKSTOP_PEER_ADDR"].
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        peer = request.META.get("REMOTE_ADDR", "")
        request.META["BACKSTOP_PEER_ADDR"] = peer
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        # Read per request (parsed once per value), so a changed setting applies at once.
        trusted = parse_networks(tuple(settings.TRUSTED_PROXIES))
        if trusted and forwarded:
            request.META["REMOTE_ADDR"] = client_address(peer, forwarded, trusted)
        return self.get_response(request)


@functools.lru_cache(maxsize=8)
def parse_networks(entries: tuple[str, ...]) -> tuple:
    """Addresses and CIDR blocks as networks (an address is a /32 or /128); raises on a bad one."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def client_address(peer: str, forwarded_for: str, trusted) -> str:
    """The rightmost address of `peer` + X-Forwarded-For that is not a trusted proxy.

    `peer` itself when it is not trusted; `peer` also when a hop that a trusted proxy reported is
    not an address at all (a broken or hostile chain is not believed). When every hop is trusted,
    the leftmost one.
    """
    if not _is_trusted(peer, trusted):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    address = peer
    for hop in reversed(hops):
        if _parse_address(hop) is None:
            return peer
        address = hop
        if not _is_trusted(hop, trusted):
            return hop
    return address


def _parse_address(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _is_trusted(address: str, trusted) -> bool:
    parsed = _parse_address(address)
    return parsed is not None and any(parsed in network for network in trusted)


class ContentSecurityPolicyMiddleware:
    """Send settings.CONTENT_SECURITY_POLICY on every response that has none of its own."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response.headers:
            response.headers["Content-Security-Policy"] = policy
        return response
