"""Idle rates, the decayed node score Q and cluster utilisation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.policy.config import PolicyConfig
from console.policy.resources import (
    IdleRates,
    cluster_rates,
    idle_rates,
    instant_score,
    node_capacities,
    node_score,
    q_after,
    q_scale,
)
from tests.policy.helpers import make_sample

# Newest: cpu 1/4 used -> 0.75 idle; mem 2048/8192 -> 0.75; disk 20/200 -> 0.9; bw 100/1000 -> 0.9
NEWEST = make_sample("a", 4, 1, 8192, 2048, 20, 200, 100, 1000)
# Older: everything half used -> 0.5 idle each.
OLDER = make_sample("a", 4, 2, 8192, 4096, 100, 200, 500, 1000)


def test_idle_rates_by_hand():
    assert idle_rates(NEWEST) == IdleRates(cpu=0.75, mem=0.75, disk=0.9, bw=0.9)


def test_instant_score_by_hand():
    # 0.4*0.75 + 0.3*0.75 + 0.15*0.9 + 0.15*0.9 = 0.3 + 0.225 + 0.135 + 0.135 = 0.795
    assert instant_score(idle_rates(NEWEST), PolicyConfig()) == pytest.approx(0.795)


def test_q_decays_older_samples():
    # Five samples (q_samples): newest 0.795, then four at 0.5.
    # Q = 0.795 + 0.5*(e^-0.5 + e^-1 + e^-1.5 + e^-2)
    #   = 0.795 + 0.5*(0.6065306597 + 0.3678794412 + 0.2231301601 + 0.1353352832)
    #   = 0.795 + 0.5*1.3328755442 = 1.4614377721
    history = [NEWEST, OLDER, OLDER, OLDER, OLDER]
    assert node_score(history, PolicyConfig()) == pytest.approx(1.4614377721)


def test_q_of_a_short_history_is_scaled_to_the_full_window():
    # Two samples of five: decayed sum 0.795 + 0.5*0.6065306597 = 1.0982653299 over weights
    # 1 + 0.6065306597 = 1.6065306597, times q_scale 2.3328755442 (weights of five samples):
    # 1.0982653299 / 1.6065306597 * 2.3328755442 = 1.5948132168.
    assert q_scale(PolicyConfig()) == pytest.approx(2.3328755442)
    assert node_score([NEWEST, OLDER], PolicyConfig()) == pytest.approx(1.5948132168)
    # So an idle node that has sent one sample ties with one idle for five (both q_scale).
    idle = make_sample("i", 4, 0, 8192, 0, 0, 200, 0, 1000)
    assert node_score([idle], PolicyConfig()) == pytest.approx(
        node_score([idle] * 5, PolicyConfig())
    )


def test_q_uses_only_the_newest_n_samples():
    config = replace(PolicyConfig(), q_samples=1)
    assert node_score([NEWEST, OLDER, OLDER], config) == pytest.approx(0.795)
    assert node_score([], config) == 0.0


def test_zero_lambda_sums_without_decay():
    # Five samples: 0.795 + 0.5 + 0.5 + 0.5 + 0.5 = 2.795; three of five: (0.795 + 0.5 + 0.5)
    # scaled by 5/3 = 1.795*5/3 = 2.9916666667.
    config = replace(PolicyConfig(), q_decay_lambda=0.0)
    assert node_score([NEWEST, OLDER, OLDER, OLDER, OLDER], config) == pytest.approx(2.795)
    assert node_score([NEWEST, OLDER, OLDER], config) == pytest.approx(2.9916666667)


def test_zero_totals_and_overuse_do_not_break():
    empty = make_sample("z", 0, 0, 0, 0, 0, 0, 0, 0)
    assert idle_rates(empty) == IdleRates(0.0, 0.0, 0.0, 0.0)
    over = make_sample("o", 2, 3, 100, 150, 300, 200, 2000, 1000)
    assert idle_rates(over) == IdleRates(0.0, 0.0, 0.0, 0.0)
    assert over.cpu_free == 0.0 and over.mem_free == 0.0
    assert cluster_rates([empty]).cpu == 0.0


def test_cluster_rates_by_hand():
    # cpu (1 + 1.5) / (4 + 2) = 2.5/6 = 0.41666...; mem (2048 + 3072) / (8192 + 4096) = 5120/12288
    rates = cluster_rates(
        [make_sample("a", 4, 1, 8192, 2048), make_sample("b", 2, 1.5, 4096, 3072)]
    )
    assert rates.cpu == pytest.approx(0.4166666667)
    assert rates.mem == pytest.approx(0.4166666667)


def test_node_capacities_take_free_from_the_newest_sample():
    caps = node_capacities({"a": [NEWEST, OLDER], "b": []}, PolicyConfig(), alive={"a": True})
    assert set(caps) == {"a"}
    assert (caps["a"].cpu_free, caps["a"].mem_free) == (3.0, 6144.0)
    assert caps["a"].score == pytest.approx(1.5948132168)  # as in the short-history test
    assert caps["a"].alive
    assert not node_capacities({"a": [NEWEST]}, PolicyConfig(), alive={})["a"].alive


def test_q_after_lowers_q_by_the_idle_share_the_demand_takes():
    # a: 4 cores, 8192 MiB, Q 1.5948132168. One more core and 2048 MiB lower every sample's
    # cpu_idle by 1/4 and mem_idle by 2048/8192 = 1/4: Q falls by
    # q_scale*(0.4*0.25 + 0.3*0.25) = 2.3328755442*0.175 = 0.4082532202 -> 1.1865599966.
    (cap,) = node_capacities({"a": [NEWEST, OLDER]}, PolicyConfig()).values()
    assert q_after(cap, 1, 2048, PolicyConfig()) == pytest.approx(1.1865599966)
    assert q_after(cap, -1, -2048, PolicyConfig()) == pytest.approx(1.5948132168 + 0.4082532202)


unit = st.floats(min_value=0.0, max_value=1.0)


@st.composite
def q_weights(draw):
    raw = [draw(st.floats(min_value=0.0, max_value=1.0)) for _ in range(4)]
    total = sum(raw)
    w = [x / total for x in raw] if total else [1.0, 0.0, 0.0, 0.0]
    # max(): the remainder can round to a tiny negative number.
    config = replace(
        PolicyConfig(),
        q_w_cpu=w[0],
        q_w_mem=w[1],
        q_w_disk=w[2],
        q_w_bw=max(0.0, 1 - w[0] - w[1] - w[2]),
    )
    config.validate()
    return config


@given(q_weights(), unit, unit, unit, unit, unit, st.integers(0, 3))
def test_q_is_monotone_in_each_idle_rate(config, cpu, mem, disk, bw, bump, which):
    rates = [cpu, mem, disk, bw]
    higher = list(rates)
    higher[which] = max(rates[which], bump)
    assert instant_score(IdleRates(*higher), config) >= instant_score(IdleRates(*rates), config)


@given(
    st.floats(min_value=0.0, max_value=4.0),
    st.floats(min_value=0.0, max_value=4.0),
    st.integers(0, 4),
    st.floats(min_value=0.0, max_value=3.0),
)
def test_q_never_drops_when_a_sample_gets_more_idle(used, less, k, lam):
    # Lowering cpu use in any one of the last five samples cannot lower Q.
    config = replace(PolicyConfig(), q_decay_lambda=lam)
    samples = [make_sample("n", 4, used) for _ in range(5)]
    freer = list(samples)
    freer[k] = make_sample("n", 4, max(0.0, used - less))
    assert node_score(freer, config) >= node_score(samples, config)
    assert math.isfinite(node_score(freer, config))
