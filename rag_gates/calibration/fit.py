"""Fitting composed gates and the uncertified threshold rule, in the core.

- :func:`fit_logistic`: an L2-regularised logistic regression (Newton's method, numpy) of a
  0/1 label on standardised gate scores: the weights of a :class:`~rag_gates.gate.Weighted`.
- :func:`fit_weighted`: ``rag-gates fit-weighted``'s fit (label "closed-book answer wrong",
  threshold by best accuracy on the same rows); ``rag_gates_lab.compose`` re-exports it.
- :func:`threshold_curve` and :func:`best_accuracy_point`: accuracy and retrieval rate at
  every threshold, and ``eval-gate``'s rule ("best accuracy, fewest retrievals among ties").
  That rule carries no guarantee on new questions; :func:`rag_gates.calibration.calibrate`
  is the certified alternative.

Example:
    >>> fit = fit_logistic([[0.1, 0.9, 0.8, 0.2, 0.7, 0.3]], [0, 1, 1, 0, 1, 0])
    >>> fit.weights[0] > 0
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rag_gates.gate import UNDECIDED_SCORE

__all__ = ["LogisticFit", "ThresholdPoint", "best_accuracy_point", "cascade_band",
           "fit_logistic", "fit_weighted", "threshold_curve", "usable_score"]


def usable_score(score: float | None) -> bool:
    """A score a gate actually produced (finite, not the fail-closed marker)."""
    return score is not None and math.isfinite(score) and score < UNDECIDED_SCORE


class LogisticFit(BaseModel):
    """A fitted combination: ``sigmoid(bias + sum_i w_i (s_i - center_i) / scale_i)``."""

    model_config = ConfigDict(frozen=True)

    weights: list[float]
    bias: float
    center: list[float]
    scale: list[float]
    rows: int = Field(..., description="Rows the fit used (every score usable).")
    positives: int
    c: float = Field(1.0, description="Inverse L2 strength (scikit-learn's C).")

    def predict(self, columns: Sequence[Sequence[float]]) -> list[float]:
        """The combined probability per row (no check for unusable scores)."""
        x = (np.asarray(columns, dtype=np.float64).T - np.asarray(self.center)) \
            / np.asarray(self.scale)
        z = self.bias + x @ np.asarray(self.weights)
        return [float(v) for v in 1.0 / (1.0 + np.exp(-np.clip(z, -700.0, 700.0)))]


def fit_logistic(columns: Sequence[Sequence[float]], labels: Sequence[int], *,
                 c: float = 1.0) -> LogisticFit:
    """L2-regularised logistic regression of ``labels`` on standardised ``columns`` (one
    per gate, every value usable): minimises the log-loss plus ``||w||^2 / (2c)`` (the bias
    is not penalised), scikit-learn's ``LogisticRegression(C=c)`` objective."""
    x = np.asarray(columns, dtype=np.float64).T
    y = np.asarray(labels, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != y.size or x.shape[1] == 0:
        raise ValueError(f"one column per gate, each as long as the labels ({y.size})")
    if len(set(y.tolist())) < 2:
        raise ValueError(f"the {y.size} rows hold one class only; fit on rows where the "
                         "label is sometimes 0 and sometimes 1")
    center = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale <= 0] = 1.0
    design = np.column_stack([np.ones(len(y)), (x - center) / scale])
    penalty = np.full(design.shape[1], 1.0 / c)
    penalty[0] = 0.0
    beta = np.zeros(design.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ beta, -700.0, 700.0)))
        grad = design.T @ (p - y) + penalty * beta
        hess = design.T @ (design * (p * (1 - p))[:, None]) + np.diag(penalty + 1e-10)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if float(np.abs(step).max()) < 1e-10:
            break
    return LogisticFit(weights=[float(v) for v in beta[1:]], bias=float(beta[0]),
                       center=[float(v) for v in center], scale=[float(v) for v in scale],
                       rows=int(y.size), positives=int(y.sum()), c=c)


class ThresholdPoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    threshold: float
    retrieval_rate: float
    accuracy: float


def threshold_curve(scores: list[float], closed: list[float], retrieved: list[float]
                    ) -> list[ThresholdPoint]:
    """Accuracy and retrieval rate at every distinct threshold (plus never-retrieve)."""
    n = len(scores)
    # Above the largest score nothing is retrieved (a finite threshold keeps JSON valid).
    top = max(scores)
    thresholds = sorted(set(scores)) + ([math.nextafter(top, math.inf)]
                                        if math.isfinite(top) else [])
    points = []
    for t in thresholds:
        use = [s >= t for s in scores]
        acc = sum(r if u else c for u, r, c in zip(use, retrieved, closed, strict=True)) / n
        points.append(ThresholdPoint(threshold=t, retrieval_rate=sum(use) / n, accuracy=acc))
    return points


def best_accuracy_point(curve: list[ThresholdPoint], target_rate: float | None
                        ) -> ThresholdPoint:
    """The best-accuracy point (fewest retrievals among ties), or the point whose retrieval
    rate is the largest not above ``target_rate`` (``eval-gate``'s rule, no guarantee)."""
    if target_rate is None:
        return max(curve, key=lambda p: (p.accuracy, -p.retrieval_rate))
    allowed = [p for p in curve if p.retrieval_rate <= target_rate + 1e-12]
    return max(allowed, key=lambda p: (p.retrieval_rate, p.accuracy))


def fit_weighted(names: Sequence[str], columns: Sequence[Sequence[float]],
                 closed: Sequence[float], retrieved: Sequence[float], *,
                 target_rate: float | None = None, c: float = 1.0) -> dict[str, Any]:
    """Logistic regression of "closed-book answer wrong" (``closed == 0``) on the gates'
    standardised scores; the probability threshold is calibrated on the same rows (best
    accuracy, or the retrieval rate ``target_rate``). Rows where a gate could not decide
    are left out (counted in ``rows_dropped``). Returns the JSON that
    :meth:`Weighted.from_json` and ``weighted(FILE)`` read.
    """
    if len(columns) != len(names) or not names:
        raise ValueError(f"one score column per gate: {len(names)} names, {len(columns)} "
                         "columns")
    n = len(closed)
    if any(len(col) != n for col in columns) or len(retrieved) != n:
        raise ValueError("every column and the labels must cover the same rows")
    keep = [i for i in range(n) if all(usable_score(col[i]) for col in columns)]
    labels = [int(closed[i] == 0.0) for i in keep]
    if len(set(labels)) < 2:
        raise ValueError(f"the {len(keep)} usable rows hold one class only; fit on rows where "
                         "the closed-book answer is sometimes right and sometimes wrong")
    fit = fit_logistic([[col[i] for i in keep] for col in columns], labels, c=c)
    probs = fit.predict([[col[i] for i in keep] for col in columns])
    chosen = best_accuracy_point(threshold_curve(probs, [closed[i] for i in keep],
                                                 [retrieved[i] for i in keep]), target_rate)
    return {"gates": list(names), "weights": fit.weights, "bias": fit.bias,
            "center": fit.center, "scale": fit.scale, "threshold": chosen.threshold,
            "fitted_on": {"rows": len(keep), "rows_dropped": n - len(keep),
                          "positives": sum(labels), "C": c,
                          "calibration": "best-accuracy" if target_rate is None
                          else f"target-rate {target_rate}",
                          "expected": {"accuracy": chosen.accuracy,
                                       "retrieval_rate": chosen.retrieval_rate}}}


def cascade_band(cheap_scores: Sequence[float], threshold: float, share: float
                 ) -> tuple[float, float]:
    """The band around the cheap gate's ``threshold`` that holds the ``share`` of
    (calibration) scores nearest to it: the questions the cheap gate is least sure of."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    usable = sorted((abs(s - threshold), s) for s in cheap_scores if usable_score(s))
    if not usable:
        raise ValueError("no usable cheap-gate score to place the band")
    nearest = [s for _, s in usable[: max(1, round(share * len(usable)))]]
    return min(min(nearest), threshold), max(max(nearest), threshold)
