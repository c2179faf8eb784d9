"""One line saying why a Spark query or a PySpark process failed, from its error text: what a
replica entry, a decision's reason or an upgrade's refusal shows an operator."""

from __future__ import annotations

import re

_RAISED = re.compile(r"^[\w.]+(Error|Exception|Fault)\b.*:")
_PY4J_WRAPPER = "py4j.protocol.Py4JJavaError:"


def failure_cause(error: str, limit: int = 300) -> str:
    """The cause in `error`: Spark wraps a Python exception in a Java one whose message holds
    the Python traceback; its last `Name: message` line is the cause (the first line of `error`
    otherwise). py4j's own wrapper, `Py4JJavaError: An error occurred while calling o73.load.`,
    says nothing: the Java exception on the line after it (`: java.io.IOException: ...`) is
    the cause then."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    raised = [i for i, line in enumerate(lines) if _RAISED.match(line)]
    if not raised:
        return (lines[0] if lines else "unknown error")[:limit]
    last = raised[-1]
    cause = lines[last]
    following = lines[last + 1] if last + 1 < len(lines) else ""
    if cause.startswith(_PY4J_WRAPPER) and following.startswith(": "):
        cause = following[2:]
    return cause[:limit]
