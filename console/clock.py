"""Times as the console stores and shows them: timezone-aware UTC datetimes, made from the
epoch seconds that the data plane, the agents and the controller write (one conversion for
every service and page)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(epoch_s: float | str) -> datetime:
    """The aware UTC datetime of `epoch_s` (a number, or its text as Redis returns it)."""
    return datetime.fromtimestamp(float(epoch_s), tz=UTC)
