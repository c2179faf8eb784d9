"""P_i = w1*S_i + w2*R_i + w3*L_i, hand-computed, plus monotonicity properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.policy.config import PolicyConfig
from console.policy.priority import (
    dependency_scores,
    measured_demands,
    operator_priorities,
    priority_score,
    resource_score,
    type_score,
)
from spark_runtime.topology import TRAFFIC_JOB, WORDCOUNT_JOB, OperatorSpec, Topology


def by_name(results):
    return {r.name: r for r in results}


def test_type_scores():
    assert [type_score(k) for k in ("source", "map", "filter", "flatmap", "sink")] == [0.1] * 5
    assert type_score("aggregate") == 0.5
    assert [type_score(k) for k in ("join", "window_aggregate", "topn")] == [0.8] * 3


def test_dependency_scores_wordcount_and_traffic():
    # wordcount is a chain: degrees source 1, split 2, count 2, sink 1; max 2.
    assert dependency_scores(WORDCOUNT_JOB) == {
        "source": 0.5,
        "split": 1.0,
        "count": 1.0,
        "sink": 0.5,
    }
    # traffic: join reads 2 sources and feeds 1 -> degree 3 (the max); sources 1; the
    # aggregate 2 (join in, sink out); sink 1.
    scores = dependency_scores(TRAFFIC_JOB)
    assert scores["join"] == 1.0
    assert scores["speed_source"] == pytest.approx(1 / 3)
    assert scores["location_aggregate"] == pytest.approx(2 / 3)
    assert scores["sink"] == pytest.approx(1 / 3)


def test_single_operator_has_no_dependency():
    lone = Topology("lone", (OperatorSpec("only", "source"),))
    assert dependency_scores(lone) == {"only": 0.0}


def test_wordcount_priorities_by_hand():
    # Cluster 4 cores, 4096 MiB; defaults w=(0.4, 0.3, 0.3), alpha=beta=0.5, fr=0.05, weight 0.2.
    # source: R = 0.5*0.1/4 + 0.5*128/4096 = 0.0125 + 0.015625 = 0.028125
    #         P = 0.4*0.1 + 0.3*0.028125 + 0.3*0.5 = 0.04 + 0.0084375 + 0.15 = 0.1984375
    #         P_eff = 0.1984375 + 0.2*0.05 = 0.2084375 <= 0.4 -> passive
    # split:  R = 0.5*0.3/4 + 0.5*256/4096 = 0.0375 + 0.03125 = 0.06875
    #         P = 0.04 + 0.020625 + 0.3 = 0.360625; P_eff = 0.370625 <= 0.4 -> passive
    # count:  R = 0.5*0.5/4 + 0.5*512/4096 = 0.0625 + 0.0625 = 0.125
    #         P = 0.2 + 0.0375 + 0.3 = 0.5375; P_eff = 0.5475 -> active
    results = by_name(operator_priorities(WORDCOUNT_JOB, 4.0, 4096.0, PolicyConfig()))
    source, split, count = results["source"], results["split"], results["count"]
    assert (source.R, source.P, source.P_eff) == pytest.approx((0.028125, 0.1984375, 0.2084375))
    assert source.mode == "passive"
    assert (split.R, split.P, split.P_eff) == pytest.approx((0.06875, 0.360625, 0.370625))
    assert split.mode == "passive"
    assert (count.S, count.L) == (0.5, 1.0)
    assert (count.R, count.P, count.P_eff) == pytest.approx((0.125, 0.5375, 0.5475))
    assert count.mode == "active"
    assert list(results) == ["source", "split", "count", "sink"]


def test_explain_names_each_term_with_numbers():
    count = by_name(operator_priorities(WORDCOUNT_JOB, 4.0, 4096.0, PolicyConfig()))["count"]
    assert "S=0.500" in count.explain
    assert "R=0.5*0.5/4 + 0.5*512/4096 = 0.125" in count.explain
    assert "L=1.000 (in 1 + out 1)" in count.explain
    assert "P=0.4*0.500 + 0.3*0.125 + 0.3*1.000 = 0.537" in count.explain
    assert "-> active" in count.explain


def test_fault_risk_can_make_an_operator_active():
    # sink: P = 0.1984375 as for source; fr = 0.9 -> P_eff = 0.1984375 + 0.2*0.9 = 0.3784375,
    # above a threshold of 0.35; source keeps the prior fr and 0.2084375.
    config = PolicyConfig(priority_threshold=0.35)
    results = by_name(
        operator_priorities(WORDCOUNT_JOB, 4.0, 4096.0, config, fault_rates={"sink": 0.9})
    )
    assert results["sink"].P_eff == pytest.approx(0.3784375)
    assert results["sink"].mode == "active"
    assert results["source"].mode == "passive"


def test_demand_overrides_and_clamps():
    # count with cpu 100 on a 4-core cluster: R = 0.5*25 + 0.5*0.125 > 1 -> clamped to 1.
    # P = 0.4*0.5 + 0.3*1 + 0.3*1 = 0.8. fr = 1 with weight 0.3: 0.8 + 0.3 = 1.1 -> P_eff 1.
    config = replace(PolicyConfig(), fault_risk_weight=0.3)
    results = by_name(
        operator_priorities(
            WORDCOUNT_JOB,
            4.0,
            4096.0,
            config,
            demands={"count": {"cpu": 100}},
            fault_rates={"count": 1.0},
        )
    )
    count = results["count"]
    assert count.mem == 512.0  # not overridden: the topology's default
    assert (count.R, count.P, count.P_eff) == pytest.approx((1.0, 0.8, 1.0))


def test_threshold_is_strict():
    # P_eff exactly at the threshold stays passive ("above it -> active").
    config = replace(PolicyConfig(), priority_threshold=0.5475)
    count = by_name(operator_priorities(WORDCOUNT_JOB, 4.0, 4096.0, config))["count"]
    assert count.P_eff == pytest.approx(0.5475)
    assert count.mode == "passive"


def test_unknown_operator_names_are_refused():
    with pytest.raises(KeyError, match="cuont"):
        operator_priorities(
            WORDCOUNT_JOB, 4.0, 4096.0, PolicyConfig(), demands={"cuont": {"cpu": 1}}
        )
    with pytest.raises(KeyError, match="snik"):
        operator_priorities(WORDCOUNT_JOB, 4.0, 4096.0, PolicyConfig(), fault_rates={"snik": 0.1})


def test_resource_score_needs_a_cluster():
    with pytest.raises(ValueError, match="cluster totals"):
        resource_score(1.0, 1.0, 0.0, 100.0, PolicyConfig())


unit = st.floats(min_value=0.0, max_value=1.0)


@st.composite
def weights(draw):
    """Three non-negative weights summing to 1, as a valid PolicyConfig."""
    raw = [draw(st.floats(min_value=0.0, max_value=1.0)) for _ in range(3)]
    total = sum(raw)
    if total == 0:
        raw, total = [1.0, 0.0, 0.0], 1.0
    w1, w2 = raw[0] / total, raw[1] / total
    # max(): 1 - w1 - w2 can round to -5e-17 when the third raw weight is 0.
    config = replace(PolicyConfig(), w_type=w1, w_resource=w2, w_dependency=max(0.0, 1 - w1 - w2))
    config.validate()
    return config


@given(weights(), unit, unit, unit, st.floats(min_value=1e-6, max_value=1.0), st.integers(0, 2))
def test_priority_grows_with_each_term(config, s, r, lval, step, which):
    terms = [s, r, lval]
    raised = list(terms)
    raised[which] = min(1.0, terms[which] + step)
    weight = (config.w_type, config.w_resource, config.w_dependency)[which]
    before = priority_score(*terms, config)
    after = priority_score(*raised, config)
    assert after >= before
    if weight >= 1e-3 and raised[which] - terms[which] >= 1e-6:
        assert after > before


def test_measured_demands_split_what_a_stage_uses_beyond_an_idle_process():
    """wordcount's chained stage `count` runs split (estimate 0.3 cores, 256 MiB) and count
    (0.5, 512): it uses 1.22 cores and 1368 MiB, of which an idle stage process is 0.02 and 600;
    the remaining 1.2 cores and 768 MiB are split 3:5 and 1:2."""
    demands = measured_demands(
        WORDCOUNT_JOB, {"count": ("split", "count")}, {"count": (1.22, 1368.0)}
    )
    assert demands == {
        "split": {"cpu": pytest.approx(0.45), "mem": pytest.approx(256.0)},
        "count": {"cpu": pytest.approx(0.75), "mem": pytest.approx(512.0)},
    }
    # Below the idle footprint nothing is the operators'; a stage not measured is left out.
    assert measured_demands(
        WORDCOUNT_JOB, {"count": ("split", "count"), "other": ()}, {"count": (0.01, 500.0)}
    ) == {"split": {"cpu": 0.0, "mem": 0.0}, "count": {"cpu": 0.0, "mem": 0.0}}


def test_a_measured_demand_is_scored_and_explained_as_measured():
    results = by_name(
        operator_priorities(
            WORDCOUNT_JOB, 4.0, 4096.0, PolicyConfig(), demands={"count": {"cpu": 2, "mem": 0}}
        )
    )
    assert results["count"].R == 0.25  # 0.5 * 2 / 4 + 0.5 * 0 / 4096
    assert "(measured demand)" in results["count"].explain
    assert "(estimated demand)" in results["split"].explain
