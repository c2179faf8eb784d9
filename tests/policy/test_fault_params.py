"""The fault params schema on its own (no Django): kinds, types, bounds, size."""

import pytest

from console.policy.fault_params import (
    MAX_PARAMS_BYTES,
    FaultParamsError,
    Limits,
    validate_params,
)

LIMITS = Limits(max_duration_s=600, cores=4.0)


def test_defaults_are_filled_in():
    assert validate_params("pause-node", None, LIMITS) == {"duration_s": 10.0}
    assert validate_params("stress-node", {}, LIMITS) == {"duration_s": 10.0, "workers": 1}
    assert validate_params("kill-driver", {}, LIMITS) == {}
    assert validate_params("slow-driver", {}, LIMITS) == {"duration_s": 10.0, "delay_s": 2.0}
    assert validate_params("slow-driver", {"delay_s": 30, "duration_s": 60}, LIMITS) == {
        "duration_s": 60.0,
        "delay_s": 30.0,
    }


@pytest.mark.parametrize(
    "kind, params, field",
    [
        ("stress-node", {"workers": 5}, "params.workers"),
        ("stress-node", {"workers": 0}, "params.workers"),
        ("stress-node", {"workers": False}, "params.workers"),
        ("stress-node", {"workers": "2"}, "params.workers"),
        ("pause-node", {"duration_s": float("inf")}, "params.duration_s"),
        ("pause-node", {"duration_s": -1}, "params.duration_s"),
        ("pause-node", {"duration_s": None}, "params.duration_s"),
        ("pause-node", {"extra": 1}, "params.extra"),
        ("pause-node", "abc", "params"),
        ("pause-node", 7, "params"),
        ("pause-node", {"duration_s": 1, "pad": "x" * MAX_PARAMS_BYTES}, "params"),
        ("no-such-kind", {}, "kind"),
        ("slow-driver", {"delay_s": 0}, "params.delay_s"),
        ("slow-driver", {"delay_s": 30.5}, "params.delay_s"),
        ("slow-driver", {"delay_s": float("nan")}, "params.delay_s"),
        ("slow-driver", {"delay_s": True}, "params.delay_s"),
        ("slow-driver", {"workers": 1}, "params.workers"),
        ("kill-driver", {"delay_s": 1}, "params.delay_s"),
    ],
)
def test_bad_params_name_their_field(kind, params, field):
    with pytest.raises(FaultParamsError) as raised:
        validate_params(kind, params, LIMITS)
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_workers_follow_the_cores_and_a_fractional_node_gets_at_least_one():
    assert Limits(cores=2.5).max_workers == 2
    assert Limits(cores=0.5).max_workers == 1
    assert validate_params("stress-node", {"workers": 2.0}, Limits(cores=2)) == {
        "duration_s": 10.0,
        "workers": 2,
    }
