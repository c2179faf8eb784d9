"""Real HTTP receivers on loopback, for the alerting tests and the alert latency benchmark
(bench/alert_latency.py): an http.server in a thread, on a free port, that records every
request; it can go down and come back on the same port (an outage) or hang without answering."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict
    body: bytes
    at: float = field(default_factory=time.time)  # when it arrived (epoch seconds)

    def json(self):
        return json.loads(self.body)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Receiver:
    """`with Receiver() as receiver:` answers every POST with `status` and keeps it in
    `receiver.requests`; `stop()` and `start()` take it down and up again on the same port;
    `hang=True` reads requests but never answers them."""

    def __init__(self, status: int = 200, hang: bool = False, port: int | None = None):
        self.status = status
        self.hang = hang
        self.port = port or free_port()
        self.requests: list[Received] = []
        self.arrived = threading.Condition()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                with receiver.arrived:
                    receiver.requests.append(Received(self.path, dict(self.headers), body))
                    receiver.arrived.notify_all()
                if receiver.hang:
                    receiver._release.wait(30)
                    return
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        """The requests once there are `count` of them (raises after `timeout_s`)."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.requests) >= count, timeout_s):
                raise AssertionError(f"{len(self.requests)} requests, waited for {count}")
            return list(self.requests)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
