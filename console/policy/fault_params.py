"""The parameters each fault kind accepts, with bounds that follow from the node it targets.

Pure Python (no Django): the fault service checks a request with `validate_params()` before
recording it, and the node agent checks the same bounds again with its own view of the node
before it acts, so a bad or forged task message cannot take a node down.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# A fault's params are a handful of numbers; anything bigger is not a fault request.
MAX_PARAMS_BYTES = 1024
# Longest pause or stress a fault may ask for when settings do not say (FAULT_MAX_DURATION_S).
DEFAULT_MAX_DURATION_S = 600.0
DEFAULT_DURATION_S = 10.0
DEFAULT_STRESS_WORKERS = 1
# How much longer each batch of a slowed primary takes (slow-driver), and at most that: a
# batch held longer is a hang, which pause-node injects.
DEFAULT_BATCH_DELAY_S = 2.0
MAX_BATCH_DELAY_S = 30.0

KILL_DRIVER = "kill-driver"
KILL_STANDBY = "kill-standby"
KILL_NODE = "kill-node"
PAUSE_NODE = "pause-node"
OPERATOR_EXCEPTION = "operator-exception"
STRESS_NODE = "stress-node"
KILL_EXECUTOR = "kill-executor"
KILL_WORKER = "kill-worker"
SLOW_DRIVER = "slow-driver"
KAFKA_BROKER = "kafka-broker"


class FaultParamsError(ValueError):
    """Params a fault kind does not accept; `field` names the offending one ("params.<key>")."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Limits:
    """What bounds a fault's params: the longest duration allowed and the target node's cores."""

    max_duration_s: float = DEFAULT_MAX_DURATION_S
    # Cores of the target node (None: the fault has no target node, or no worker count).
    cores: float | None = None

    @property
    def max_workers(self) -> int:
        """More CPU hogs than cores only queue behind each other: at most one per core (>= 1)."""
        return max(1, math.floor(self.cores or 1))


# Parameter names each kind accepts; every other key is refused.
PARAMS_BY_KIND: dict[str, tuple[str, ...]] = {
    KILL_DRIVER: (),
    KILL_STANDBY: (),
    KILL_NODE: (),
    OPERATOR_EXCEPTION: (),
    KILL_EXECUTOR: (),
    KILL_WORKER: (),
    PAUSE_NODE: ("duration_s",),
    STRESS_NODE: ("duration_s", "workers"),
    SLOW_DRIVER: ("duration_s", "delay_s"),
    # hard: SIGKILL (a crash, the default) or SIGTERM (a clean shutdown) before the outage
    KAFKA_BROKER: ("duration_s", "hard"),
}


def _seconds(field: str, value, top: float) -> float:
    """`value` as a number of seconds in (0, top], else FaultParamsError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FaultParamsError(field, f"must be a number of seconds, got {value!r:.40}")
    if not 0 < value <= top:
        raise FaultParamsError(
            field, f"must be more than 0 and at most {top:g} seconds, got {value:g}"
        )
    return float(value)


def _workers(value, limits: Limits) -> int:
    top = limits.max_workers
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultParamsError("params.workers", f"must be a whole number, got {value!r:.40}")
    if not 1 <= value <= top:
        raise FaultParamsError(
            "params.workers",
            f"must be between 1 and {top} (the target node's cores), got {value}",
        )
    return value


def validate_params(kind: str, params, limits: Limits) -> dict:
    """The params of a `kind` fault, checked and with defaults filled in.

    Raises FaultParamsError naming the field for a kind without a schema, params that are not a
    JSON object or serialise to more than MAX_PARAMS_BYTES, unknown keys, wrong types (a bool is
    not a number) and values out of bounds.
    """
    if kind not in PARAMS_BY_KIND:
        raise FaultParamsError("kind", f"unknown fault kind {kind!r:.60}")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise FaultParamsError("params", f"must be a JSON object, got {type(params).__name__}")
    try:
        size = len(json.dumps(params).encode())
    except (TypeError, ValueError) as exc:
        raise FaultParamsError("params", f"must be plain JSON: {exc}") from exc
    if size > MAX_PARAMS_BYTES:
        raise FaultParamsError("params", f"must be at most {MAX_PARAMS_BYTES} bytes of JSON")
    allowed = PARAMS_BY_KIND[kind]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        accepted = ", ".join(allowed) if allowed else "none"
        raise FaultParamsError(
            f"params.{unknown[0]:.40}", f"not a parameter of {kind} (accepted: {accepted})"
        )
    checked: dict = {}
    if "duration_s" in allowed:
        checked["duration_s"] = _seconds(
            "params.duration_s", params.get("duration_s", DEFAULT_DURATION_S), limits.max_duration_s
        )
    if "workers" in allowed:
        checked["workers"] = _workers(params.get("workers", DEFAULT_STRESS_WORKERS), limits)
    if "delay_s" in allowed:
        checked["delay_s"] = _seconds(
            "params.delay_s", params.get("delay_s", DEFAULT_BATCH_DELAY_S), MAX_BATCH_DELAY_S
        )
    if "hard" in allowed:
        hard = params.get("hard", True)
        if not isinstance(hard, bool):
            raise FaultParamsError("params.hard", f"must be true or false, got {hard!r:.40}")
        checked["hard"] = hard
    return checked
