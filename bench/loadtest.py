"""A small, bounded HTTP load test against a Backstop console on this machine.

`run_load` starts `clients` threads; each keeps one HTTP connection to the server and sends the
requests of `targets` one after another, round-robin, until `duration_s` has passed. Each
response's latency and status are recorded; `summarize` turns them into p50/p99/errors per target
and overall. The base URL must be a loopback address: this tool never points load at another
machine. No Django imports, so it can be tested and reused on its own; what the clients send to
a console is `console_targets` of the command (bench/management/commands/loadtest.py).
"""

from __future__ import annotations

import http.client
import http.cookiejar
import ipaddress
import json
import math
import re
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil

LOOPBACK_NAMES = {"localhost"}


@dataclass(frozen=True)
class Target:
    """One request the clients send: a name for the report, method, path, headers, body."""

    name: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None


@dataclass
class Sample:
    target: str
    latency_ms: float
    ok: bool
    # What went wrong, for the report: the status code, or the exception's class name.
    error: str = ""


def require_loopback(base_url: str) -> tuple[str, int]:
    """(host, port) of `base_url`, or ValueError when it is not http:// on a loopback address."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected http://<loopback address>:<port>, got {base_url!r}")
    host = parts.hostname
    if host not in LOOPBACK_NAMES:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"load tests run against this machine only, not {host!r}")
    return host, parts.port or 80


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(samples: list[Sample], duration_s: float) -> dict:
    """Per target and overall: requests, errors, requests/s, p50 and p99 latency (ms)."""

    def stats(group: list[Sample]) -> dict:
        latencies = sorted(sample.latency_ms for sample in group)
        kinds: dict[str, int] = {}
        for sample in group:
            if not sample.ok:
                kinds[sample.error] = kinds.get(sample.error, 0) + 1
        return {
            "requests": len(group),
            "errors": sum(1 for sample in group if not sample.ok),
            "error_kinds": kinds,
            "rps": round(len(group) / duration_s, 1) if duration_s > 0 else None,
            "p50_ms": _round(percentile(latencies, 50)),
            "p99_ms": _round(percentile(latencies, 99)),
        }

    names = sorted({sample.target for sample in samples})
    return {
        "targets": {name: stats([s for s in samples if s.target == name]) for name in names},
        "overall": stats(samples),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _client_loop(host, port, targets, deadline, samples, lock, offset, pace_s, phase_s) -> None:
    """One client: a keep-alive connection, requests round-robin from `offset` until `deadline`.

    With `pace_s` > 0 the client behaves like a browser with the page open: every `pace_s`
    seconds (starting `phase_s` in) it sends one round of every target, then waits for the next
    tick; with 0 it sends the next request as soon as the last one is answered (closed loop).
    """
    connection = http.client.HTTPConnection(host, port, timeout=30)
    index = offset
    own: list[Sample] = []
    next_round = time.monotonic() + phase_s
    try:
        while time.monotonic() < deadline:
            if pace_s > 0:
                time.sleep(max(0.0, next_round - time.monotonic()))
                next_round += pace_s
                if time.monotonic() >= deadline:
                    break
            for _ in range(len(targets) if pace_s > 0 else 1):
                target = targets[index % len(targets)]
                index += 1
                sample, connection = _send(connection, host, port, target)
                own.append(sample)
    finally:
        connection.close()
        with lock:
            samples.extend(own)


def _send(connection, host, port, target) -> tuple[Sample, http.client.HTTPConnection]:
    """One request on the client's connection; a refused or dropped connection is an error of
    this request, and the client reconnects for the next."""
    started = time.perf_counter()
    try:
        connection.request(target.method, target.path, body=target.body, headers=target.headers)
        response = connection.getresponse()
        response.read()
        ok = 200 <= response.status < 300
        error = "" if ok else str(response.status)
    except (OSError, http.client.HTTPException) as exc:
        ok, error = False, type(exc).__name__
        connection.close()
        connection = http.client.HTTPConnection(host, port, timeout=30)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    return Sample(target.name, elapsed_ms, ok, error), connection


def run_load(
    base_url: str,
    targets: list[Target],
    *,
    clients: int,
    duration_s: float,
    pace_s: float = 0.0,
) -> dict:
    """Run `clients` concurrent clients for `duration_s` seconds; return `summarize`'s report.

    `pace_s` > 0: each client sends a round of every target every `pace_s` seconds, the clients'
    rounds spread evenly over the interval (viewers who opened the page at different times);
    0: closed loop, as fast as the server answers.
    """
    if not targets:
        raise ValueError("no targets to load")
    if clients < 1 or duration_s <= 0 or pace_s < 0:
        raise ValueError("clients must be >= 1, duration_s > 0 and pace_s >= 0")
    host, port = require_loopback(base_url)
    samples: list[Sample] = []
    lock = threading.Lock()
    started = time.monotonic()
    deadline = started + duration_s
    threads = [
        threading.Thread(
            target=_client_loop,
            args=(
                host, port, targets, deadline, samples, lock, number,
                pace_s, pace_s * number / clients,
            ),
            name=f"load-{number}",
            daemon=True,
        )
        for number in range(clients)
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        # A request in flight at the deadline may take up to its 30 s timeout.
        thread.join(timeout=duration_s + 60)
    elapsed = time.monotonic() - started
    report = summarize(samples, elapsed)
    report.update(clients=clients, duration_s=round(elapsed, 1), pace_s=pace_s)
    return report


def server_processes(port: int) -> list[psutil.Process]:
    """The processes of the server listening on `port` on this machine: the listening process,
    its master when that is a gunicorn (whose workers share the socket), and all their children."""
    listening = {
        conn.pid
        for conn in psutil.net_connections("tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
    }
    listening.discard(None)
    if not listening:
        raise ValueError(f"no process listens on port {port} here")
    roots = set()
    for pid in listening:
        process = psutil.Process(pid)
        parent = process.parent()
        is_worker = parent is not None and "gunicorn" in " ".join(parent.cmdline())
        roots.add(parent if is_worker else process)
    found = {p.pid: p for root in roots for p in [root, *root.children(recursive=True)]}
    return list(found.values())


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User plus system CPU time of `processes` (those that have exited count as nothing)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def log_in(base_url: str, username: str, password: str) -> dict[str, str]:
    """Log in once, as a browser and as an API client would; return what the clients send.

    `token` (for `Authorization: Token ...`), `cookie` (the session and CSRF cookies, one
    `Cookie` header) and `csrf` (for `X-CSRFToken` on Dash callback POSTs).
    """
    require_loopback(base_url)
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{base_url}/accounts/login/", timeout=30).read().decode()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    if match is None:
        raise ValueError("the login page has no CSRF token")
    fields = {"username": username, "password": password, "csrfmiddlewaretoken": match[1]}
    request = urllib.request.Request(
        f"{base_url}/accounts/login/",
        data=urllib.parse.urlencode(fields).encode(),
        headers={"Referer": f"{base_url}/accounts/login/"},
    )
    opener.open(request, timeout=30).read()
    cookies = {cookie.name: cookie.value for cookie in jar}
    if "sessionid" not in cookies:
        raise ValueError(f"login as {username!r} failed (wrong password or locked out)")
    # The login rotates the CSRF token: read it from the page the clients will load.
    opener.open(f"{base_url}/console/", timeout=30).read()
    cookies = {cookie.name: cookie.value for cookie in jar}
    token_request = urllib.request.Request(
        f"{base_url}/api/auth/token/",
        data=json.dumps({"username": username, "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    token = json.loads(urllib.request.urlopen(token_request, timeout=30).read())["token"]
    csrf = next(value for name, value in cookies.items() if "csrf" in name.lower())
    return {
        "token": token,
        "cookie": "; ".join(f"{name}={value}" for name, value in cookies.items()),
        "csrf": csrf,
    }
