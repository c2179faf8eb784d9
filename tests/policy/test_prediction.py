"""FaultPredictor: prior until trained, a hand-checked regression, JSON round trip."""

from __future__ import annotations

import json

import pytest

from console.policy.prediction import FEATURE_NAMES, FaultFeatures, FaultPredictor


def row(recent_faults: float) -> FaultFeatures:
    # Only recent_faults varies; constant columns get zero weight (they carry no information).
    return FaultFeatures(
        recent_faults=recent_faults,
        cpu=0.5,
        mem=0.5,
        input_rate=1000,
        state_rows=10,
        node_fault_rate=0.1,
    )


def training_set():
    # x = 0, 1, 2, 3 (ten times each), y = 1 when x >= 2.
    rows = [row(x) for x in (0, 1, 2, 3) for _ in range(10)]
    targets = [1 if r.recent_faults >= 2 else 0 for r in rows]
    return rows, targets


def test_prior_until_enough_rows():
    predictor = FaultPredictor(prior=0.05, min_rows=20)
    assert not predictor.trained
    assert predictor.predict(row(3)) == 0.05
    rows, targets = training_set()
    assert predictor.fit(rows[:19], targets[:19]) is False
    assert not predictor.trained
    assert predictor.status == "untrained: 19 rows < minimum 20; using prior"
    assert predictor.predict(row(3)) == 0.05


def test_prior_with_a_single_class():
    predictor = FaultPredictor(prior=0.05, min_rows=5)
    assert predictor.fit([row(x) for x in range(10)], [0] * 10) is False
    assert predictor.status == "untrained: every target is 0; using prior"
    assert predictor.predict(row(9)) == 0.05


def test_linear_fit_by_hand():
    # Least squares on x in {0,1,2,3} (equal counts), y = [0,0,1,1]:
    # mean x = 1.5, mean y = 0.5; cov = (0.75 + 0.25 + 0.25 + 0.75)/4 = 0.5;
    # var = (2.25 + 0.25 + 0.25 + 2.25)/4 = 1.25; slope = 0.4; intercept = 0.5 - 0.4*1.5 = -0.1.
    # Predictions: x=0 -> -0.1 (clipped to 0.001), 1 -> 0.3, 2 -> 0.7, 3 -> 1.1 (clipped 0.999).
    predictor = FaultPredictor(prior=0.05)
    assert predictor.fit(*training_set()) is True
    assert predictor.trained
    assert predictor.status == "trained on 40 rows (20 failures)"
    assert predictor.predict(row(0)) == 0.001
    assert predictor.predict(row(1)) == pytest.approx(0.3)
    assert predictor.predict(row(2)) == pytest.approx(0.7)
    assert predictor.predict(row(3)) == 0.999
    assert predictor.coefficients == pytest.approx([0.4, 0, 0, 0, 0, 0], abs=1e-9)
    assert predictor.intercept == pytest.approx(-0.1)


def test_round_trip_through_json_predicts_the_same():
    predictor = FaultPredictor(prior=0.05)
    predictor.fit(*training_set())
    stored = json.loads(json.dumps(predictor.to_dict()))
    assert set(stored["coefficients"]) == set(FEATURE_NAMES)
    loaded = FaultPredictor.from_dict(stored)
    assert loaded.trained
    assert loaded.status == predictor.status
    for x in (0, 1, 1.5, 2, 3):
        assert loaded.predict(row(x)) == predictor.predict(row(x))


def test_untrained_round_trip_and_refused_feature_sets():
    loaded = FaultPredictor.from_dict(json.loads(json.dumps(FaultPredictor(0.2).to_dict())))
    assert not loaded.trained and loaded.predict(row(1)) == 0.2
    stored = FaultPredictor(0.05)
    stored.fit(*training_set())
    data = stored.to_dict()
    data["coefficients"].pop("state_rows")
    with pytest.raises(ValueError, match="differ"):
        FaultPredictor.from_dict(data)


def test_bad_input_is_refused():
    predictor = FaultPredictor(prior=0.05)
    with pytest.raises(ValueError, match="targets"):
        predictor.fit([row(0)], [0, 1])
    with pytest.raises(ValueError, match="0 or 1"):
        predictor.fit([row(0)], [2])
    with pytest.raises(ValueError):
        FaultPredictor(prior=0.0)
    # A prior of 1 (allowed by PolicyConfig) is clipped like any prediction.
    assert FaultPredictor(prior=1.0).predict(row(0)) == 0.999
