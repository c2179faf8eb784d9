"""PolicyConfig defaults, validation messages and dict round trips."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from console.policy.config import PolicyConfig, PolicyConfigError


def errors_of(config: PolicyConfig) -> dict[str, str]:
    with pytest.raises(PolicyConfigError) as info:
        config.validate()
    return info.value.errors


def test_defaults_are_valid_and_match_the_brief():
    config = PolicyConfig()
    config.validate()
    assert (config.w_type, config.w_resource, config.w_dependency) == (0.4, 0.3, 0.3)
    assert config.priority_threshold == 0.4
    assert config.resource_reserve == 0.2
    assert (config.checkpoint_min_s, config.checkpoint_max_s) == (1.0, 60.0)
    assert (config.q_samples, config.slow_task_limit) == (5, 3)
    # The Django Policy model mirrors exactly these names, so a rename must fail here.
    assert [f.name for f in fields(PolicyConfig)] == [
        "w_type", "w_resource", "w_dependency", "alpha_cpu", "beta_mem",
        "priority_threshold", "fault_risk_weight",
        "q_w_cpu", "q_w_mem", "q_w_disk", "q_w_bw", "q_decay_lambda", "q_samples",
        "resource_reserve", "hold_host_reserve", "checkpoint_min_s", "checkpoint_max_s",
        "interval_horizon_s", "checkpoint_cost_s", "recovery_cost_s",
        "cpu_const", "mem_const", "slow_task_limit", "fault_rate_prior",
        "warm_spares_per_node", "heartbeat_timeout_s", "cycle_interval_s",
        "recovery_band", "recovery_stable_window_s", "reference_window_s", "warmup_s",
        "restart_initial_delay_s", "restart_max_delay_s", "restart_max_failures",
        "restart_failure_window_s", "same_cause_failures_limit", "hung_timeout_s",
        "upgrade_validation_s",
        "prediction_window_s", "prediction_history_s", "prediction_min_samples",
        "interval_apply_gap_s", "light_input_wait_s", "kafka_lag_alert_records",
        "alert_unprotected_s", "alert_no_output_s", "alert_restarts_count",
        "alert_restarts_window_s", "alert_checkpoint_duration_s", "alert_recovery_over_s",
        "alert_reopen_throttle_s",
    ]  # fmt: skip


def test_every_problem_is_reported_at_once_with_the_field_named():
    bad = replace(PolicyConfig(), w_type=1.5, q_samples=0, warmup_s=-1.0, recovery_band=1.0)
    errors = errors_of(bad)
    assert set(errors) == {"w_type", "q_samples", "warmup_s", "recovery_band"}
    assert errors["w_type"] == "w_type: must be between 0 and 1"
    for name, message in errors.items():
        assert message.startswith(f"{name}: ")


def test_weights_must_sum_to_one():
    errors = errors_of(replace(PolicyConfig(), w_type=0.5))  # 0.5 + 0.3 + 0.3 = 1.1
    assert set(errors) == {"w_type"}
    assert "sum to 1" in errors["w_type"] and "1.1" in errors["w_type"]
    assert set(errors_of(replace(PolicyConfig(), beta_mem=0.4))) == {"alpha_cpu"}
    assert set(errors_of(replace(PolicyConfig(), q_w_bw=0.2))) == {"q_w_cpu"}


def test_sum_tolerance_accepts_decimal_rounding():
    replace(PolicyConfig(), w_type=0.4 + 5e-7).validate()


@pytest.mark.parametrize("value", [True, "0.4", None, float("nan"), float("inf")])
def test_non_numbers_and_bools_are_refused(value):
    errors = errors_of(replace(PolicyConfig(), priority_threshold=value))
    assert set(errors) == {"priority_threshold"}
    assert errors["priority_threshold"].startswith("priority_threshold: must be a finite number")


def test_integer_fields_refuse_floats_and_bools():
    errors = errors_of(replace(PolicyConfig(), q_samples=5.0, slow_task_limit=True))
    assert set(errors) == {"q_samples", "slow_task_limit"}
    assert "integer" in errors["q_samples"]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"checkpoint_min_s": 0.0}, "checkpoint_min_s"),
        ({"checkpoint_min_s": 60.0}, "checkpoint_max_s"),  # min must be < max
        ({"checkpoint_max_s": 3601.0}, "checkpoint_max_s"),
        ({"resource_reserve": 0.95}, "resource_reserve"),
        ({"cpu_const": 0.0}, "cpu_const"),
        ({"mem_const": 1.01}, "mem_const"),
        ({"fault_rate_prior": 0.0}, "fault_rate_prior"),
        ({"q_decay_lambda": -0.1}, "q_decay_lambda"),
        ({"q_samples": 1001}, "q_samples"),
        ({"slow_task_limit": 0}, "slow_task_limit"),
        ({"heartbeat_timeout_s": 0.0}, "heartbeat_timeout_s"),
        ({"recovery_band": 0.0}, "recovery_band"),
        ({"reference_window_s": 0.0}, "reference_window_s"),
        ({"same_cause_failures_limit": 0}, "same_cause_failures_limit"),
        ({"same_cause_failures_limit": 3.0}, "same_cause_failures_limit"),
        ({"light_input_wait_s": -0.5}, "light_input_wait_s"),
        ({"light_input_wait_s": 5.5}, "light_input_wait_s"),
    ],
)
def test_ranges(changes, field):
    assert set(errors_of(replace(PolicyConfig(), **changes))) == {field}


def test_boundaries_that_are_allowed():
    replace(
        PolicyConfig(),
        resource_reserve=0.9,
        checkpoint_max_s=3600.0,
        cpu_const=1.0,
        fault_rate_prior=1.0,
        q_samples=1000,
        warmup_s=0.0,
        q_decay_lambda=0.0,
        same_cause_failures_limit=1,
        light_input_wait_s=5.0,
    ).validate()
    replace(PolicyConfig(), light_input_wait_s=0.0).validate()


def test_same_cause_failures_limit_is_named_in_its_message():
    errors = errors_of(replace(PolicyConfig(), same_cause_failures_limit=0))
    assert errors == {
        "same_cause_failures_limit": "same_cause_failures_limit: must be between 1 and 1000"
    }


def test_dict_round_trip_through_json():
    config = replace(PolicyConfig(), priority_threshold=0.5, q_samples=7)
    data = json.loads(json.dumps(config.to_dict()))
    assert PolicyConfig.from_dict(data) == config


def test_from_dict_fills_defaults_and_validates():
    assert PolicyConfig.from_dict({"warmup_s": 5.0}) == replace(PolicyConfig(), warmup_s=5.0)
    with pytest.raises(PolicyConfigError) as info:
        PolicyConfig.from_dict({"w_type": 2.0})
    assert "w_type" in info.value.errors


def test_from_dict_refuses_unknown_keys_by_name():
    with pytest.raises(PolicyConfigError) as info:
        PolicyConfig.from_dict({"w_typo": 0.4, "bogus": 1})
    assert info.value.errors == {
        "bogus": "bogus: unknown policy field",
        "w_typo": "w_typo: unknown policy field",
    }
