"""Fault-rate prediction by linear regression on history (as in Da-Stream).

Each training row describes one operator replica over one window; the target is 1 if a failure
was observed in the next window, else 0. Linear regression on a 0/1 target estimates the
probability of failure (a linear probability model, which is what the paper uses); predictions
are clipped to [0.001, 0.999] so downstream formulas (C_initial divides by fr) stay finite.

The node is represented by its recent fault rate rather than a one-hot column: the set of nodes
changes as nodes come and go, and a rate generalises to a node the model has not seen.

A fitted model is a handful of coefficients, so `to_dict()` stores them as plain floats and
`predict` computes the same dot product LinearRegression.predict does; no pickles in the DB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

import numpy as np
from sklearn.linear_model import LinearRegression

FR_MIN = 0.001
FR_MAX = 0.999
DEFAULT_MIN_ROWS = 20


@dataclass(frozen=True)
class FaultFeatures:
    """One feature row; cpu and mem are utilisation fractions, the rest raw counts or rates."""

    recent_faults: float
    cpu: float
    mem: float
    input_rate: float
    state_rows: float
    node_fault_rate: float

    def as_list(self) -> list[float]:
        """Values in FEATURE_NAMES order."""
        return [float(v) for v in astuple(self)]


FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in fields(FaultFeatures))


class FaultPredictor:
    """Predicts fr for an operator from FaultFeatures; falls back to a prior until trained."""

    def __init__(self, prior: float, min_rows: int = DEFAULT_MIN_ROWS):
        if not 0.0 < prior <= 1.0:
            raise ValueError(f"prior must be in (0, 1], got {prior}")
        # Clipped like predictions, so every fr this class returns lies in [FR_MIN, FR_MAX].
        self.prior = min(FR_MAX, max(FR_MIN, float(prior)))
        self.min_rows = int(min_rows)
        self.coefficients: list[float] | None = None
        self.intercept: float | None = None
        self.status = "untrained: no data yet"

    @property
    def trained(self) -> bool:
        """True once fit() had enough rows of both classes."""
        return self.coefficients is not None

    def fit(self, rows: Sequence[FaultFeatures], targets: Sequence[int]) -> bool:
        """Fit on history; returns `trained`. Too few rows or a single class keeps the prior."""
        if len(rows) != len(targets):
            raise ValueError(f"{len(rows)} rows but {len(targets)} targets")
        bad = sorted({t for t in targets if t not in (0, 1)})
        if bad:
            raise ValueError(f"targets must be 0 or 1, got {bad}")
        self.coefficients = None
        self.intercept = None
        if len(rows) < self.min_rows:
            self.status = f"untrained: {len(rows)} rows < minimum {self.min_rows}; using prior"
            return False
        if len(set(targets)) < 2:
            self.status = f"untrained: every target is {targets[0]}; using prior"
            return False
        x = np.array([r.as_list() for r in rows], dtype=float)
        y = np.array(targets, dtype=float)
        model = LinearRegression().fit(x, y)
        self.coefficients = [float(c) for c in model.coef_]
        self.intercept = float(model.intercept_)
        self.status = f"trained on {len(rows)} rows ({int(y.sum())} failures)"
        return True

    def predict(self, features: FaultFeatures) -> float:
        """fr for one row, clipped to [0.001, 0.999]; the prior while untrained."""
        if self.coefficients is None or self.intercept is None:
            return self.prior
        raw = self.intercept + float(np.dot(self.coefficients, features.as_list()))
        return float(min(FR_MAX, max(FR_MIN, raw)))

    def to_dict(self) -> dict:
        """JSON-serialisable state (coefficients keyed by feature name)."""
        return {
            "prior": self.prior,
            "min_rows": self.min_rows,
            "status": self.status,
            "intercept": self.intercept,
            "coefficients": (
                None
                if self.coefficients is None
                else dict(zip(FEATURE_NAMES, self.coefficients, strict=True))
            ),
        }

    @classmethod
    def from_dict(cls, data: dict) -> FaultPredictor:
        """Rebuild a predictor saved with to_dict(); refuses a different feature set."""
        predictor = cls(prior=data["prior"], min_rows=data.get("min_rows", DEFAULT_MIN_ROWS))
        predictor.status = data.get("status", predictor.status)
        coefficients = data.get("coefficients")
        if coefficients is not None:
            if set(coefficients) != set(FEATURE_NAMES):
                raise ValueError(
                    f"stored features {sorted(coefficients)} differ from {list(FEATURE_NAMES)}"
                )
            predictor.coefficients = [float(coefficients[n]) for n in FEATURE_NAMES]
            predictor.intercept = float(data["intercept"])
        return predictor
