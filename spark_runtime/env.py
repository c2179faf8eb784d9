"""Read settings from the environment through one helper that fails loudly on a bad value.

Every package reads its settings through `env()`: the Django settings, the node agents, the
Kafka helpers and the data plane (which may import nothing else of the project, hence its
place here). A typo such as `CELERY_TASK_TIME_LIMIT=ten` stops the process at start-up with a
message naming the variable, instead of surfacing later as a confusing runtime error.
docs/CONFIGURATION.md lists the variables and where each is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


class ImproperlyConfiguredEnv(Exception):
    """A required environment variable is missing or has a value that does not parse."""


_MISSING = object()


def parse_bool(raw: str) -> bool:
    """Accept the usual spellings of true/false and nothing else."""
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected a boolean (true/false/1/0/yes/no), got {raw!r}")


def parse_list(raw: str) -> list[str]:
    """Comma-separated list with surrounding blanks removed and empty items dropped."""
    return [item.strip() for item in raw.split(",") if item.strip()]


def parse_url(schemes: tuple[str, ...]) -> Callable[[str], str]:
    """Build a parser that accepts a URL with one of `schemes` and returns it unchanged."""

    def _parse(raw: str) -> str:
        parsed = urlparse(raw)
        if parsed.scheme not in schemes:
            raise ValueError(f"expected a URL with scheme {'/'.join(schemes)}, got {raw!r}")
        return raw

    return _parse


def env(name: str, default: Any = _MISSING, cast: Callable[[str], Any] = str) -> Any:
    """Return the environment variable `name` parsed with `cast`.

    A missing variable returns `default` (unparsed) or, without a default, raises. A value that
    `cast` rejects always raises, naming the variable and the reason.
    """
    raw = os.environ.get(name)
    if raw is None:
        if default is _MISSING:
            raise ImproperlyConfiguredEnv(f"environment variable {name} is required but not set")
        return default
    try:
        return cast(raw)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfiguredEnv(f"environment variable {name}: {exc}") from exc


def var_dir() -> Path:
    """Where Backstop keeps its files on this machine: BACKSTOP_VAR_DIR, else `var/` of the
    project (the Django settings read the same variable)."""
    return Path(env("BACKSTOP_VAR_DIR", "") or Path(__file__).resolve().parents[1] / "var")
