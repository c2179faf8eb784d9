"""The policy's tunables, validated in one place.

The Django `Policy` model mirrors these fields one to one (same names, same defaults), so the
admin, the API and this pure core agree on what a valid policy is: `validate()` is the single
source of truth for the rules.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from numbers import Real

# Tolerance for "weights sum to 1": admins type decimals such as 0.4/0.3/0.3.
SUM_TOLERANCE = 1e-6


# Each spare holds a JVM (about 0.5-1 GB): more than this per node only wastes memory.
MAX_SPARES_PER_NODE = 4


class PolicyConfigError(ValueError):
    """A policy configuration is invalid; `errors` maps each bad field to a message naming it."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(self.errors.values()))


@dataclass(frozen=True)
class PolicyConfig:
    """All tunables of the fault-tolerance policy (Da-Stream terms in the comments)."""

    # Weights of P_i = w1*S_i + w2*R_i + w3*L_i.
    w_type: float = 0.4
    w_resource: float = 0.3
    w_dependency: float = 0.3
    # Resource score R_i = alpha*cpu/C + beta*mem/M.
    alpha_cpu: float = 0.5
    beta_mem: float = 0.5
    # P_eff above this -> active (hot standby).
    # 0.4 keeps stateless operators (S=0.1) passive even with the highest dependency strength:
    # P = 0.4*0.1 + 0.3*R + 0.3*1 stays below 0.4 unless R > 0.2 (a fifth of the cluster).
    priority_threshold: float = 0.4
    # P_eff = min(1, P + fault_risk_weight * fr).
    fault_risk_weight: float = 0.2
    # Node score Q weights (cpu, mem, disk, bandwidth idle rates).
    q_w_cpu: float = 0.4
    q_w_mem: float = 0.3
    q_w_disk: float = 0.15
    q_w_bw: float = 0.15
    # Exponential decay over the newest q_samples samples.
    q_decay_lambda: float = 0.5
    q_samples: int = 5
    # Fraction of cluster cpu and memory that standbys must leave free.
    resource_reserve: float = 0.2
    # Bounds of the checkpoint interval (seconds).
    checkpoint_min_s: float = 1.0
    checkpoint_max_s: float = 60.0
    # C_initial = T * T_checkpoint / (fr * T_recover).
    interval_horizon_s: float = 60.0
    checkpoint_cost_s: float = 0.5
    recovery_cost_s: float = 20.0
    # Online adjustment thresholds: C_const, M_const, M (slow tasks).
    cpu_const: float = 0.8
    mem_const: float = 0.8
    slow_task_limit: int = 3
    # fr used when no trained predictor is available.
    fault_rate_prior: float = 0.05
    # Warm spares (pre-started stage processes) each node keeps for restarts and new standbys,
    # under strategies that use them; they count against the resource reserve.
    warm_spares_per_node: int = 1
    # Supervision timing.
    heartbeat_timeout_s: float = 3.0
    cycle_interval_s: float = 5.0
    # Recovery detector.
    recovery_band: float = 0.15
    recovery_stable_window_s: float = 30.0
    reference_window_s: float = 60.0
    warmup_s: float = 20.0

    def validate(self) -> None:
        """Raise PolicyConfigError listing every invalid field; return None when all is well."""
        errors: dict[str, str] = {}
        ints = {"q_samples", "slow_task_limit", "warm_spares_per_node"}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ints:
                if isinstance(value, bool) or not isinstance(value, int):
                    errors[f.name] = f"{f.name}: must be an integer, got {value!r}"
            elif (
                isinstance(value, bool)
                or not isinstance(value, Real)
                or not math.isfinite(float(value))
            ):
                errors[f.name] = f"{f.name}: must be a finite number, got {value!r}"

        def check(name: str, ok: bool, message: str) -> None:
            # Type errors above take precedence: a non-number cannot be range-checked.
            if name not in errors and not ok:
                errors[name] = f"{name}: {message}"

        def numeric(*names: str) -> bool:
            return all(n not in errors for n in names)

        unit = (
            "w_type",
            "w_resource",
            "w_dependency",
            "alpha_cpu",
            "beta_mem",
            "priority_threshold",
            "fault_risk_weight",
            "q_w_cpu",
            "q_w_mem",
            "q_w_disk",
            "q_w_bw",
        )
        for name in unit:
            if numeric(name):
                check(name, 0.0 <= getattr(self, name) <= 1.0, "must be between 0 and 1")

        groups = {
            "w_type": ("w_type", "w_resource", "w_dependency"),
            "alpha_cpu": ("alpha_cpu", "beta_mem"),
            "q_w_cpu": ("q_w_cpu", "q_w_mem", "q_w_disk", "q_w_bw"),
        }
        for key, names in groups.items():
            if numeric(*names):
                total = sum(getattr(self, n) for n in names)
                if abs(total - 1.0) > SUM_TOLERANCE:
                    # Reported under the first field so the form shows it next to the group.
                    errors[key] = f"{key}: {' + '.join(names)} must sum to 1 (got {total:.6g})"

        if numeric("q_decay_lambda"):
            check("q_decay_lambda", self.q_decay_lambda >= 0, "must be >= 0")
        if numeric("q_samples"):
            check("q_samples", 1 <= self.q_samples <= 1000, "must be between 1 and 1000")
        if numeric("resource_reserve"):
            check(
                "resource_reserve", 0.0 <= self.resource_reserve <= 0.9, "must be between 0 and 0.9"
            )
        if numeric("checkpoint_min_s"):
            check("checkpoint_min_s", self.checkpoint_min_s > 0, "must be > 0")
        if numeric("checkpoint_max_s"):
            check("checkpoint_max_s", self.checkpoint_max_s <= 3600, "must be <= 3600")
        if numeric("checkpoint_min_s", "checkpoint_max_s"):
            check(
                "checkpoint_max_s",
                self.checkpoint_min_s < self.checkpoint_max_s,
                "must be greater than checkpoint_min_s",
            )
        for name in (
            "interval_horizon_s",
            "checkpoint_cost_s",
            "recovery_cost_s",
            "heartbeat_timeout_s",
            "cycle_interval_s",
            "recovery_stable_window_s",
            "reference_window_s",
        ):
            if numeric(name):
                check(name, getattr(self, name) > 0, "must be > 0")
        for name in ("cpu_const", "mem_const", "fault_rate_prior"):
            if numeric(name):
                check(name, 0.0 < getattr(self, name) <= 1.0, "must be > 0 and <= 1")
        if numeric("warm_spares_per_node"):
            check(
                "warm_spares_per_node",
                0 <= self.warm_spares_per_node <= MAX_SPARES_PER_NODE,
                f"must be between 0 and {MAX_SPARES_PER_NODE}",
            )
        if numeric("slow_task_limit"):
            check("slow_task_limit", self.slow_task_limit >= 1, "must be >= 1")
        if numeric("recovery_band"):
            check(
                "recovery_band",
                0.0 < self.recovery_band < 1.0,
                "must be between 0 and 1 (exclusive)",
            )
        if numeric("warmup_s"):
            check("warmup_s", self.warmup_s >= 0, "must be >= 0")

        if errors:
            raise PolicyConfigError(errors)

    def to_dict(self) -> dict:
        """All fields as a plain JSON-serialisable dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PolicyConfig:
        """Build and validate a config; missing keys take defaults, unknown keys are refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PolicyConfigError({k: f"{k}: unknown policy field" for k in unknown})
        config = cls(**data)
        config.validate()
        return config
