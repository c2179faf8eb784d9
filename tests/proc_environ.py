"""The environment of a process the tests started, read from /proc once its exec set it up."""

import time


def environ_of(pid: int, timeout_s: float = 5.0) -> dict[str, str]:
    """The environment of process `pid`. Popen returns once the exec has closed the child's
    close-on-exec pipe, which Linux does before it writes the new program's environment: until
    then /proc/PID/environ reads empty (a read right after the start found nothing once in a
    loaded CI run), so an empty read is tried again for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
        if raw or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return dict(entry.decode().split("=", 1) for entry in raw.split(b"\0") if entry)
