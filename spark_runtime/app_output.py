"""The tail of an app's output: what its script prints (stdout) and writes to stderr (its
logging, its tracebacks), kept in Redis for the job page and the API.

The stage process running an app (spark_runtime/app_stage.py) puts an `OutputTail` in front of
`sys.stdout` and `sys.stderr`: every write still reaches the process's own log (the node
agent's file), and each complete line is also queued; a thread pushes the queued lines to the
job's output list (`keys.app_output`) every FLUSH_S, capped at `keys.APP_OUTPUT_LINES`, so a
chatty app costs one Redis round trip per FLUSH_S, never one per line, and never more memory
than the cap. The JVM's own output (Spark's log4j lines) goes to the file only.

No Django imports.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque

from redis.exceptions import RedisError

from spark_runtime import keys

FLUSH_S = 0.5
LINE_CHARS = 1000  # a longer line is cut (a line is one entry of a capped list)

log = logging.getLogger(__name__)


class _Stream:
    """A text stream that writes to `original` and hands complete lines to `tail`."""

    def __init__(self, original, name: str, tail: OutputTail):
        self.original, self.name, self.tail = original, name, tail
        self.partial = ""

    def write(self, text: str) -> int:
        written = self.original.write(text)
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self.tail.add(self.name, line)
        self.partial = self.partial[-LINE_CHARS:]
        return written

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, attribute):
        return getattr(self.original, attribute)


class OutputTail:
    """Lines of the app's output queued for the job's output list (see the module doc)."""

    def __init__(self, client, job: str, replica: str):
        self.client, self.job, self.replica = client, job, replica
        self.pending: deque[str] = deque(maxlen=keys.APP_OUTPUT_LINES)
        self.lock = threading.Lock()
        self.pushing = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._flush_loop, name="app-output", daemon=True)
        self.streams = (sys.stdout, sys.stderr)  # the originals, put back by stop()

    def add(self, stream: str, line: str) -> None:
        """Queue one line of `stream` (stdout or stderr)."""
        entry = {"at": time.time(), "replica": self.replica, "stream": stream}
        entry["line"] = line[:LINE_CHARS]
        with self.lock:
            self.pending.append(json.dumps(entry))

    def add_text(self, stream: str, text: str) -> None:
        """Queue every line of `text` (a traceback the stage logged for the app)."""
        for line in text.splitlines():
            self.add(stream, line)

    def start(self) -> None:
        """Tee sys.stdout and sys.stderr into the tail and start pushing it."""
        self.streams = (sys.stdout, sys.stderr)
        sys.stdout = _Stream(sys.stdout, "stdout", self)
        sys.stderr = _Stream(sys.stderr, "stderr", self)
        self.thread.start()

    def flush(self) -> None:
        """Push the queued lines now (newest first in the list, capped)."""
        with self.pushing:  # one push at a time, so the list keeps the lines' order
            self._push()

    def _push(self) -> None:
        with self.lock:
            lines = list(self.pending)
            self.pending.clear()
        if not lines:
            return
        key = keys.app_output(self.job)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.lpush(key, *lines)
            pipe.ltrim(key, 0, keys.APP_OUTPUT_LINES - 1)
            pipe.execute()
        except RedisError as exc:
            # The process's own log has every line; the tail is a view of it.
            log.warning("app output not pushed (%d lines): %s", len(lines), exc)

    def stop(self) -> None:
        """Push what is left, stop the thread and give sys.stdout and sys.stderr back."""
        self.stopped.set()
        self.flush()
        if isinstance(sys.stdout, _Stream) and sys.stdout.tail is self:
            sys.stdout = self.streams[0]
        if isinstance(sys.stderr, _Stream) and sys.stderr.tail is self:
            sys.stderr = self.streams[1]

    def _flush_loop(self) -> None:
        while not self.stopped.wait(FLUSH_S):
            self.flush()


def read_output(client, job: str, lines: int = keys.APP_OUTPUT_LINES) -> list[dict]:
    """The job's newest `lines` output lines, oldest first: {at, replica, stream, line}."""
    raw = client.lrange(keys.app_output(job), 0, max(0, lines - 1))
    entries = []
    for item in reversed(raw):
        try:
            entries.append(json.loads(item))
        except ValueError:
            continue
    return entries
