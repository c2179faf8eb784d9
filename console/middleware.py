"""Request middleware: JSON errors under /api/, the real client address behind trusted proxies."""

import functools
import ipaddress
import logging

from django.conf import settings
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
