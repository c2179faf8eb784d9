"""The policy's tunables, validated in one place.

The Django `Policy` model is built from these fields
(console.models.policy._mirror_policy_config: same names, types and defaults, each bound's reason
as help text), so the admin, the API and this pure core agree on what a valid policy is:
`validate()` is the single source of truth for the rules.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from numbers import Real

# Tolerance for "weights sum to 1": admins type decimals such as 0.4/0.3/0.3.
SUM_TOLERANCE = 1e-6


# Each spare holds a JVM (about 0.5-1 GB): more than this per node only wastes memory.
MAX_SPARES_PER_NODE = 4


@dataclass(frozen=True)
class Bound:
    """The range a policy field must stay in to keep the controller working, and why."""

    low: float
    high: float
    why: str
    # An open end excludes the value itself (a rate of 0, a band of 1).
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def interval(self) -> str:
        """The range in interval notation, e.g. "[0.5, 60]" or "(0, 1]"."""
        low, high = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{low}{self.low:.12g}, {self.high:.12g}{high}"

    def message(self) -> str:
        if self.low_open and self.high_open:
            return f"must be between {self.low:.12g} and {self.high:.12g} (exclusive)"
        if self.low_open:
            return f"must be more than {self.low:.12g} and at most {self.high:.12g}"
        if self.high_open:
            return f"must be at least {self.low:.12g} and less than {self.high:.12g}"
        return f"must be between {self.low:.12g} and {self.high:.12g}"


_WEIGHT = Bound(0.0, 1.0, "a weight or share in [0, 1]; weights of a group also sum to 1")
_UTILISATION = Bound(
    0.0, 1.0, "a utilisation threshold (C_const, M_const) in (0, 1]", low_open=True
)

# Every numeric field's range (docs/POLICY.md, "Bounds", explains each one).
BOUNDS: dict[str, Bound] = {
    "w_type": _WEIGHT,
    "w_resource": _WEIGHT,
    "w_dependency": _WEIGHT,
    "alpha_cpu": _WEIGHT,
    "beta_mem": _WEIGHT,
    "priority_threshold": Bound(0.0, 1.0, "P_eff lies in [0, 1]; outside, every operator "
                                "would be active or none"),
    "fault_risk_weight": _WEIGHT,
    "q_w_cpu": _WEIGHT,
    "q_w_mem": _WEIGHT,
    "q_w_disk": _WEIGHT,
    "q_w_bw": _WEIGHT,
    "q_decay_lambda": Bound(0.0, 10.0, "exp(-10) is 5e-5: beyond 10 only the newest sample "
                            "counts anyway, and huge values only risk overflow"),
    "q_samples": Bound(1, 1000, "at least the newest sample; Q sums this many samples per node "
                       "every cycle"),
    "resource_reserve": Bound(0.0, 0.9, "a reserve over 90% leaves no room for any standby"),
    "hold_host_reserve": Bound(0, 1, "1 holds the reserve per host against measured use, 0 "
                               "only at placement"),
    "checkpoint_min_s": Bound(0.1, 600.0, "below 100 ms Spark would spend its time writing "
                              "checkpoints"),
    "checkpoint_max_s": Bound(1.0, 3600.0, "an hour of replay after a failure is the most a "
                              "passive operator should lose; also above checkpoint_min_s"),
    "interval_horizon_s": Bound(1.0, 86_400.0, "T in C_initial: a second to a day"),
    "checkpoint_cost_s": Bound(0.01, 600.0, "T_checkpoint: positive, at most ten minutes"),
    "recovery_cost_s": Bound(0.1, 3600.0, "T_recover: positive (it divides C_initial), at most "
                             "an hour"),
    "cpu_const": _UTILISATION,
    "mem_const": _UTILISATION,
    "slow_task_limit": Bound(1, 1000, "at least one slow task must be able to trigger"),
    "fault_rate_prior": Bound(0.0, 1.0, "fr divides C_initial: 0 would be a division by zero",
                              low_open=True),
    "warm_spares_per_node": Bound(0, MAX_SPARES_PER_NODE, "each spare holds a JVM (0.5-1 GB)"),
    "heartbeat_timeout_s": Bound(1.0, 300.0, "episodes are back-dated by it to the failure; "
                                 "stages renew their heartbeat every 0.5 s with a 3 s TTL, so "
                                 "under 1 s or over 5 min misplaces the fault"),
    "cycle_interval_s": Bound(0.5, 60.0, "the controller ticks every 0.25 s; a cycle (metrics, "
                              "policy, database writes) under 0.5 s would crowd out the ticks, "
                              "and over 60 s a starting job waits that long to be marked "
                              "running and recoveries are measured that late"),
    "recovery_band": Bound(0.0, 1.0, "a band of 0 is never met, 1 accepts no output at all",
                           low_open=True, high_open=True),
    "recovery_stable_window_s": Bound(1.0, 3600.0, "at least one progress sample; an hour at "
                                      "most, or episodes stay open for ever"),
    "reference_window_s": Bound(1.0, 3600.0, "at least one progress sample before the fault"),
    "warmup_s": Bound(0.0, 3600.0, "ignored start of a job; an hour at most"),
    "restart_initial_delay_s": Bound(0.1, 600.0, "the wait before the second restart in a row of "
                                     "a replica that never finished a batch; doubled after "
                                     "each further one"),
    "restart_max_delay_s": Bound(1.0, 3600.0, "the longest wait between restarts of a "
                                 "crash-looping replica; also at least restart_initial_delay_s"),
    "restart_max_failures": Bound(2, 1000, "this many failures of a stage's primaries within "
                                  "the window fail the job (of its standbys: the stage runs "
                                  "unprotected); 1 would give up on the first fault"),
    "hung_timeout_s": Bound(5.0, 600.0, "how long a replica without heartbeat whose process is "
                            "busy is left alone (slow) before it is restarted (hung); above the "
                            "3 s heartbeat TTL, at most ten minutes of a stuck stage"),
    "restart_failure_window_s": Bound(10.0, 86_400.0, "the window failures are counted in: ten "
                                      "seconds to a day"),
    "same_cause_failures_limit": Bound(1, 1000, "this many failures in a row of a stage's "
                                       "primaries with the same reported cause (however far "
                                       "apart) fail the job, saying the cause (of its standbys: "
                                       "the stage runs unprotected); at least one"),
    "upgrade_validation_s": Bound(5.0, 86_400.0, "an upgraded stage is watched this long before "
                                  "its old version retires: at least a few batches, a day at "
                                  "most"),
    "prediction_window_s": Bound(1.0, 3600.0, "fr is the chance of a failure within this window; "
                                 "agents sample every second, so at least one sample per "
                                 "window; an hour at most"),
    "prediction_history_s": Bound(60.0, 604_800.0, "training reads this much history every run: "
                                  "a minute to a week (metrics are purged after "
                                  "METRIC_RETENTION_HOURS anyway)"),
    "interval_apply_gap_s": Bound(10.0, 86_400.0, "each change restarts a replica's queries (a "
                                  "few seconds of its output): at most every ten seconds, at "
                                  "least once a day"),
    "light_input_wait_s": Bound(0.0, 5.0, "latency a replica with light input may add to save "
                                "batches (0: none); above 5 s Spark's idle events (every 10 s "
                                "without a batch) would tell a standby it read everything"),
    "prediction_min_samples": Bound(10, 100_000, "a regression on eight features needs at least "
                                    "ten rows; the newest 30% are held out to judge it"),
    "kafka_lag_alert_records": Bound(0, 10_000_000, "records a Kafka job's primaries may be "
                                     "behind their topic's end (summed over partitions) for two "
                                     "policy cycles in a row before an alert; 0 turns the alert "
                                     "off"),
    "alert_unprotected_s": Bound(0.0, 86_400.0, "a stage of a protected operator may run without "
                                 "its standby this long before the job-unprotected alert; 0 "
                                 "turns it off; a day at most"),
    "alert_no_output_s": Bound(0.0, 86_400.0, "a job may write no output this long while input "
                               "arrives before the output-stalled alert; 0 turns it off"),
    "alert_restarts_count": Bound(0, 1000, "this many failures of a job's replicas within "
                                  "alert_restarts_window_s raise the restarts alert; 0 turns it "
                                  "off"),
    "alert_restarts_window_s": Bound(10.0, 86_400.0, "the window restarts are counted in: ten "
                                     "seconds to a day"),
    "alert_checkpoint_duration_s": Bound(0.0, 3600.0, "a batch (it commits the stage's "
                                         "checkpoint) longer than this raises checkpoint-slow; "
                                         "0 turns it off; an hour at most"),
    "alert_recovery_over_s": Bound(0.0, 86_400.0, "a recovery longer than this raises "
                                   "recovery-slow; 0 turns it off"),
    "alert_reopen_throttle_s": Bound(0.0, 86_400.0, "an alert raised again this soon after it "
                                     "resolved stays resolved (a flapping condition pages once); "
                                     "a day at most"),
}  # fmt: skip


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
    # 1: the reserve also holds per host against its measured CPU and memory
    # (console/policy/reserve.py): a launch that would cross it is refused, standbys are
    # downgraded lowest priority first and restored when room returns, no spare is started past
    # it. 0 (the default until it has run through the live suites on a quiet machine): the
    # reserve is kept at placement only, on the nodes' figures, as before.
    hold_host_reserve: int = 0
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
    # Restart policy (Flink's exponential-delay restarts with a failure-rate limit): see
    # spark_runtime.failover.RestartPolicy.
    restart_initial_delay_s: float = 2.0
    restart_max_delay_s: float = 60.0
    restart_max_failures: int = 8
    restart_failure_window_s: float = 600.0
    # A deterministic failure (the same one-line cause every start, e.g. a Python worker that
    # cannot import pyarrow) is given up on after this many failures in a row, however far
    # apart the backoff spaces them: see spark_runtime.failover.ExponentialDelayRestartBackoff.
    same_cause_failures_limit: int = 3
    # A replica without heartbeat whose process is busy is slow, and hung after this long.
    hung_timeout_s: float = 30.0
    # A blue/green upgrade (spark_runtime/upgrade.py) watches the new version this long after
    # the switch, the old one standing by, before it is confirmed (or rolled back).
    upgrade_validation_s: float = 60.0
    # Fault prediction (console/policy/prediction.py): fr is the chance that a stage fails within
    # one prediction window; training reads prediction_history_s of recorded history and fits a
    # model only on at least prediction_min_samples rows (one row per stage and window).
    prediction_window_s: float = 60.0
    prediction_history_s: float = 21_600.0
    prediction_min_samples: int = 20
    # A running replica takes a new checkpoint interval (restarting its queries) at most this
    # often, and only at a quiet moment (see checkpoint.interval_rollout).
    interval_apply_gap_s: float = 300.0
    # A replica's Redis sources hold light input (fewer than redis_source.LIGHT_INPUT_RECORDS
    # entries waiting) up to this many seconds before a batch reads it: a micro-batch's CPU is
    # nearly all fixed, so a replica of a 20 lines/s job batching on every 0.5 s trigger spent
    # half a core (docs/POLICY.md, "Idle replicas"). It is latency the policy accepts; 0: none.
    # Off by default: results and a promotion's output gap stay as measured (about 1 s); a
    # host packed with jobs turns it on (2 s halved a 20 lines/s primary's CPU).
    light_input_wait_s: float = 0.0
    # Alert when the total lag of a Kafka job's primaries (records behind the topic's end) stays
    # above this (console.services.control.record.watch_kafka); 0: never.
    kafka_lag_alert_records: int = 0
    # The conditions ops teams page on (console/policy/alert_conditions.py, docs/ALERTING.md);
    # 0 turns a condition off.
    alert_unprotected_s: float = 120.0
    alert_no_output_s: float = 120.0
    alert_restarts_count: int = 5
    alert_restarts_window_s: float = 600.0
    alert_checkpoint_duration_s: float = 0.0
    alert_recovery_over_s: float = 0.0
    alert_reopen_throttle_s: float = 300.0

    def validate(self) -> None:
        """Raise PolicyConfigError listing every invalid field; return None when all is well."""
        errors: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int":  # the annotation, as a string (postponed annotations)
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

        for name, bound in BOUNDS.items():
            if numeric(name):
                check(name, bound.contains(getattr(self, name)), bound.message())

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

        if numeric("checkpoint_min_s", "checkpoint_max_s"):
            check(
                "checkpoint_max_s",
                self.checkpoint_min_s < self.checkpoint_max_s,
                "must be greater than checkpoint_min_s",
            )

        if numeric("restart_initial_delay_s", "restart_max_delay_s"):
            check(
                "restart_max_delay_s",
                self.restart_initial_delay_s <= self.restart_max_delay_s,
                "must be at least restart_initial_delay_s",
            )

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


# Keys a policy request may carry besides the fields: why it changes, and the read-only fields
# of a GET body (ignored, so a body read with GET can be edited and sent back with PUT).
REQUEST_EXTRA_KEYS = ("reason",)
READ_ONLY_KEYS = ("version", "created_at", "created_by")


def request_errors(data, *, full: bool) -> dict[str, str]:
    """What is wrong with a policy change request before any value is converted.

    `data` must be a JSON object; unknown keys are refused; a boolean is not a number (JSON
    `true` would otherwise become 1.0); with `full` (PUT) every field is required, because PUT
    replaces the whole policy; without it (PATCH) at least one field must be given.
    """
    if not isinstance(data, dict):
        return {"non_field_errors": f"expected a JSON object, got {type(data).__name__}"}
    known = [f.name for f in fields(PolicyConfig)]
    errors: dict[str, str] = {}
    for key in data:
        if key in REQUEST_EXTRA_KEYS or key in READ_ONLY_KEYS:
            continue
        if key not in known:
            errors[str(key)] = f"{key!s:.60}: unknown policy field"
        elif isinstance(data[key], bool):
            errors[key] = f"{key}: must be a number, not a boolean"
    given = [name for name in known if name in data]
    if full:
        for name in known:
            if name not in given:
                errors[name] = (
                    f"{name}: required (PUT replaces the whole policy; PATCH changes some fields)"
                )
    elif not given and not errors:
        errors["non_field_errors"] = "give at least one policy field to change"
    return errors
