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
    # Q = 0.795*e^0 + 0.5*e^-0.5 = 0.795 + 0.5*0.6065306597 = 0.795 + 0.3032653299 = 1.0982653299
    assert node_score([NEWEST, OLDER], PolicyConfig()) == pytest.approx(1.0982653299)


def test_q_uses_only_the_newest_n_samples():
    config = replace(PolicyConfig(), q_samples=1)
    assert node_score([NEWEST, OLDER, OLDER], config) == pytest.approx(0.795)
    assert node_score([], config) == 0.0


def test_zero_lambda_sums_without_decay():
    # 0.795 + 0.5 + 0.5 = 1.795
    config = replace(PolicyConfig(), q_decay_lambda=0.0)
    assert node_score([NEWEST, OLDER, OLDER], config) == pytest.approx(1.795)


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
    assert caps["a"].score == pytest.approx(1.0982653299)
    assert caps["a"].alive
    assert not node_capacities({"a": [NEWEST]}, PolicyConfig(), alive={})["a"].alive


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
