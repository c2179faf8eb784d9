"""Fault-rate prediction by linear regression on history (as in Da-Stream).

Each training row describes one stage of a job over one window (the operators a stage chains
fail together, so they share its row); the target is 1 if the stage failed in the next window,
else 0. Linear regression on a 0/1 target estimates the
probability of failure (a linear probability model, which is what the paper uses), with every
coefficient non-negative (each feature can only raise the rate); predictions are clipped to
[0.001, 0.999] so downstream formulas (C_initial divides by fr) stay finite.

The node is represented by its recent fault rate rather than a one-hot column: the set of nodes
changes as nodes come and go, and a rate generalises to a node the model has not seen.

A fitted model is a handful of coefficients, so `to_dict()` stores them as plain floats and
`predict` computes the same dot product LinearRegression.predict does; no pickles in the DB.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field, fields

import numpy as np

from infra.child import run_in_child

FR_MIN = 0.001
FR_MAX = 0.999
DEFAULT_MIN_ROWS = 20


@dataclass(frozen=True)
class FaultFeatures:
    """One feature row (Da-Stream's features) describing a stage over one window.

    recent_faults: the stage's failures in the last RECENT_WINDOWS windows; node_fault_rate:
    failures of any replica on the stage's primary node per window over the same span; cpu, mem,
    disk, net: that node's utilisation fractions (0-1) averaged over the window; throughput_eps:
    the stage's processed rate; latency_ms: the job's p99 event-time latency.
    """

    recent_faults: float
    node_fault_rate: float
    cpu: float
    mem: float
    disk: float
    net: float
    throughput_eps: float
    latency_ms: float

    def as_list(self) -> list[float]:
        """Values in FEATURE_NAMES order."""
        return [float(v) for v in astuple(self)]


FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in fields(FaultFeatures))


# A fit of a few thousand rows takes a fraction of a second; the child's start (a new
# interpreter importing scikit-learn) a few seconds on a busy machine.
FIT_TIMEOUT_S = 120.0


def fit_in_child(x: np.ndarray, y: np.ndarray) -> tuple[list[float], float]:
    """(coefficients, intercept) of the least-squares line through (x, y) with every coefficient
    non-negative. Run in a child process by `FaultPredictor.fit`: importing scikit-learn adds
    about 160 MB to a process's RSS and a second of CPU, and the controller that trains the
    model every few minutes kept both for its whole life (the soak's controller grew from 234 to
    357 MB at its first training, docs/RESULTS.md)."""
    # Every feature is a fault indicator (load, latency, recent failures), so none may lower
    # the rate. Unconstrained, a short history can fit a negative slope (a drill that kills a
    # node every other window gave "more recent faults, fewer faults") and extrapolate it to a
    # near-zero rate for a node that keeps failing; constrained, a spurious slope is 0.
    # Imported here, in the child only: every controller and node agent imports this module.
    from sklearn.linear_model import LinearRegression

    model = LinearRegression(positive=True).fit(x, y)
    return [float(c) for c in model.coef_], float(model.intercept_)


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
        # In a process of its own, which exits with what it imported (see `fit_in_child`), at
        # nice 10: training can wait for a recovery. Past FIT_TIMEOUT_S: ChildTimedOut.
        self.coefficients, self.intercept = run_in_child(fit_in_child, (x, y), FIT_TIMEOUT_S)
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


# --- From recorded history to rows -------------------------------------------------------------

# recent_faults and node_fault_rate look back this many windows.
RECENT_WINDOWS = 10
# The newest part of the history held out to judge a model against the prior.
HOLDOUT_FRACTION = 0.3
NODE_METRICS = {"cpu": "cpu_util", "mem": "mem_util", "disk": "disk_util", "net": "net_util"}
STAGE_THROUGHPUT = "throughput_eps"
JOB_LATENCY = "latency_p99_ms"


class Series:
    """Samples of one metric, (epoch seconds, value), kept sorted by time."""

    def __init__(self, points: Iterable[tuple[float, float]] = ()):
        ordered = sorted(points)
        self.times = [t for t, _ in ordered]
        self.values = [v for _, v in ordered]

    def mean(self, start: float, end: float) -> float | None:
        """Mean of the samples in [start, end); None when there are none."""
        lo, hi = bisect_left(self.times, start), bisect_left(self.times, end)
        return sum(self.values[lo:hi]) / (hi - lo) if hi > lo else None


@dataclass(frozen=True)
class Failure:
    """A replica of `stage` (job `job`) on `node` failed at `at` (epoch seconds)."""

    at: float
    job: int
    stage: str
    node: str


@dataclass(frozen=True)
class Tenure:
    """A primary replica of `stage` ran on `node` from `start` until `end` (None: still runs)."""

    job: int
    stage: str
    node: str
    start: float
    end: float | None


@dataclass
class RecordedHistory:
    """What Backstop recorded over a span, in plain values: node and stage metrics, failures and
    which node ran each stage's primary. Training rows and live predictions are both computed
    from it, so a model sees at serving time exactly the features it was trained on."""

    node_metrics: Mapping[tuple[str, str], Series] = field(default_factory=dict)
    stage_metrics: Mapping[tuple[int, str, str], Series] = field(default_factory=dict)
    failures: Sequence[Failure] = ()
    tenures: Sequence[Tenure] = ()

    def primary_node(self, job: int, stage: str, t: float) -> str | None:
        """The node that ran the stage's primary at `t`. A promoted standby keeps its start time,
        so where two tenures overlap the earlier-started one is the primary of that moment."""
        running = [
            tenure
            for tenure in self.tenures
            if tenure.job == job
            and tenure.stage == stage
            and tenure.start <= t
            and (tenure.end is None or tenure.end > t)
        ]
        return min(running, key=lambda tenure: tenure.start).node if running else None

    def newest_node_sample(self, node: str) -> float | None:
        """Time of the node's newest CPU sample, None if it has none."""
        series = self.node_metrics.get((node, NODE_METRICS["cpu"]))
        return series.times[-1] if series is not None and series.times else None

    def live_features(self, job: int, stage: str, now: float, window_s: float):
        """features() for the window that ends with the newest stored sample of the stage's node
        (samples are stored in batches, so the last `window_s` before `now` may hold none yet);
        None if that sample is more than two windows old."""
        node = self.primary_node(job, stage, now)
        newest = self.newest_node_sample(node) if node else None
        if newest is None or now - newest > 2 * window_s:
            return None
        return self.features(job, stage, min(now, newest + 1e-3), window_s)

    def failures_between(self, start: float, end: float, *, job=None, stage=None, node=None):
        """Failures in [start, end), optionally of one job's stage or on one node."""
        return [
            f
            for f in self.failures
            if start <= f.at < end
            and (job is None or f.job == job)
            and (stage is None or f.stage == stage)
            and (node is None or f.node == node)
        ]

    def features(self, job: int, stage: str, t: float, window_s: float):
        """(node, FaultFeatures) describing the stage over [t - window_s, t), or None when no
        primary ran it at t or its node has no CPU sample in the window."""
        node = self.primary_node(job, stage, t)
        if node is None:
            return None
        start = t - window_s
        usage = {
            name: self.node_metrics.get((node, metric), Series()).mean(start, t)
            for name, metric in NODE_METRICS.items()
        }
        if usage["cpu"] is None:
            return None
        recent_start = t - RECENT_WINDOWS * window_s
        throughput = self.stage_metrics.get((job, stage, STAGE_THROUGHPUT), Series()).mean(start, t)
        latency = self.stage_metrics.get((job, "", JOB_LATENCY), Series()).mean(start, t)
        return node, FaultFeatures(
            recent_faults=len(self.failures_between(recent_start, t, job=job, stage=stage)),
            node_fault_rate=len(self.failures_between(recent_start, t, node=node)) / RECENT_WINDOWS,
            cpu=usage["cpu"],
            mem=usage["mem"] or 0.0,
            disk=usage["disk"] or 0.0,
            net=usage["net"] or 0.0,
            throughput_eps=throughput or 0.0,
            latency_ms=latency or 0.0,
        )


@dataclass(frozen=True)
class TrainingRow:
    """One stage over one window: the features, and whether it failed in the next window."""

    at: float
    job: int
    stage: str
    node: str
    features: FaultFeatures
    failed: int


def training_rows(
    history: RecordedHistory,
    stages: Mapping[int, tuple[Sequence[str], float, float]],
    window_s: float,
) -> list[TrainingRow]:
    """Rows for every stage of every job, window by window, oldest first.

    `stages` maps a job to (its stage names, start, end of the span to use, epoch seconds). A row
    at t has the features of [t - window_s, t) and the target "failed in [t, t + window_s)", so
    a row needs a whole window after it.
    """
    rows = []
    for job, (names, start, end) in stages.items():
        t = start + window_s
        while t + window_s <= end:
            for stage in names:
                found = history.features(job, stage, t, window_s)
                if found is None:
                    continue
                failed = bool(history.failures_between(t, t + window_s, job=job, stage=stage))
                rows.append(TrainingRow(t, job, stage, found[0], found[1], int(failed)))
            t += window_s
    return sorted(rows, key=lambda row: (row.at, row.job, row.stage))


@dataclass
class TrainingOutcome:
    """A training run judged on held-out data: used only if it beats the prior there."""

    predictor: FaultPredictor
    samples: int
    failures: int
    holdout_samples: int
    used: bool
    reason: str
    r2: float | None = None
    mae: float | None = None
    prior_mae: float | None = None
    mse: float | None = None
    prior_mse: float | None = None


def train_and_judge(
    rows: Sequence[TrainingRow], prior: float, min_rows: int = DEFAULT_MIN_ROWS
) -> TrainingOutcome:
    """Fit on the older rows, compare with the prior on the newest HOLDOUT_FRACTION.

    The yardstick is the mean squared error (the Brier score of a probability): a model is used
    only if its held-out error is below the constant prior's. R^2 and MAE are reported too.
    """
    predictor = FaultPredictor(prior=prior, min_rows=min_rows)
    failures = sum(row.failed for row in rows)

    def outcome(reason: str, holdout: int = 0, used: bool = False, **scores) -> TrainingOutcome:
        return TrainingOutcome(predictor, len(rows), failures, holdout, used, reason, **scores)

    if len(rows) < min_rows:
        return outcome(f"not used: {len(rows)} samples < minimum {min_rows}")
    split = int(round(len(rows) * (1 - HOLDOUT_FRACTION)))
    train, held_out = rows[:split], rows[split:]
    if not held_out:
        return outcome("not used: no held-out samples")
    if not predictor.fit([r.features for r in train], [r.failed for r in train]):
        return outcome(f"not used: {predictor.status}", len(held_out))
    y = np.array([r.failed for r in held_out], dtype=float)
    predicted = np.array([predictor.predict(r.features) for r in held_out])
    scores = {
        "mse": float(np.mean((predicted - y) ** 2)),
        "prior_mse": float(np.mean((predictor.prior - y) ** 2)),
        "mae": float(np.mean(np.abs(predicted - y))),
        "prior_mae": float(np.mean(np.abs(predictor.prior - y))),
        # R^2 is undefined when every held-out target is the same.
        "r2": (
            float(1 - np.sum((predicted - y) ** 2) / np.sum((y - y.mean()) ** 2))
            if y.min() != y.max()
            else None
        ),
    }
    used = scores["mse"] < scores["prior_mse"]
    verdict = "used" if used else "not used: predicts worse than the prior on held-out data"
    reason = (
        f"{verdict} (held-out MSE {scores['mse']:.4f} vs prior {scores['prior_mse']:.4f} "
        f"on {len(held_out)} samples)"
    )
    return outcome(reason, len(held_out), used, **scores)
