"""Rebuilding dataclasses from JSON snapshots that another version of the code wrote.

The supervision state of a job outlives the controller that wrote it: in Redis it is read by
the controller that takes the job over, which may run an older version (a deploy rolled back
after a field was added) or a newer one. A field this version does not know is left out, and
said once per class and field, rather than failing the rebuild with a TypeError: a controller
that cannot read one job's state must not stop supervising it, nor its other jobs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import fields

log = logging.getLogger(__name__)

_reported: set[tuple[str, str]] = set()  # (class, field) already logged
_reported_lock = threading.Lock()


def known_fields(cls, raw: dict) -> dict:
    """The entries of `raw` that are fields of the dataclass `cls`; the others are logged (once
    per class and field) and left out."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(key for key in raw if key not in names)
    if unknown:
        with _reported_lock:
            new = [key for key in unknown if (cls.__name__, key) not in _reported]
            _reported.update((cls.__name__, key) for key in new)
        if new:
            log.warning(
                "%s snapshot has fields this version does not know, ignored: %s",
                cls.__name__,
                ", ".join(new),
            )
    return {key: value for key, value in raw.items() if key in names}


def rebuild(cls, raw: dict, **overrides):
    """`cls(**raw, **overrides)` with the fields of `raw` this version does not know left out."""
    return cls(**{**known_fields(cls, raw), **overrides})
