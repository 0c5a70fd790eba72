"""Benchmark metrics: the answer matching of :mod:`rag_gates.answers` (SQuAD EM/F1,
containment accuracy, PubMedQA decisions, "the answer is" extraction), re-exported, plus the
ranking metrics the gate evaluation reads: AUROC and ROC curve from scikit-learn, rank data
and Spearman from SciPy (``pip install "rag-gates[eval]"``).

Example:
    >>> auroc([0.9, 0.2, 0.7], [1, 0, 1])
    1.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_gates._optional import require
from rag_gates.answers import (
    accuracy,
    exact_match,
    extract_answer,
    extract_decision,
    f1,
    normalize_answer,
    score_answer,
)

__all__ = [
    "accuracy",
    "auroc",
    "exact_match",
    "extract_answer",
    "extract_decision",
    "f1",
    "normalize_answer",
    "rankdata",
    "roc_curve",
    "score_answer",
    "spearman",
]


def _as_labels(scores: Sequence[float], labels: Sequence[int]) -> tuple[Any, Any] | None:
    """(scores, 0/1 labels) as arrays, or None when one class is missing (or no data)."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    np = require("numpy", "eval")
    y = np.fromiter((bool(v) for v in labels), dtype=np.int64, count=len(labels))
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == len(y):
        return None
    x = np.asarray(scores, dtype=np.float64)
    if np.isnan(x).any():
        raise ValueError("scores contain NaN; replace them before ranking (a gate's "
                         "non-finite score retrieves: map it to +inf)")
    # Ranks instead of raw scores: the same curve and area, and +-inf is allowed.
    return require("scipy.stats", "eval").rankdata(x), y


def rankdata(values: Sequence[float]) -> list[float]:
    """1-based ranks with ties given their average rank (SciPy's ``rankdata``)."""
    stats = require("scipy.stats", "eval")
    return [float(r) for r in stats.rankdata(list(values), method="average")]


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve (scikit-learn's ``roc_auc_score``; ties count half).

    ``labels`` are truthy for the positive class. NaN when one class is missing (or there
    is no data); ValueError when the lengths differ or a score is NaN (+-inf is fine).

    Example:
        >>> auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
        0.75
    """
    data = _as_labels(scores, labels)
    if data is None:
        return float("nan")
    ranks, y = data
    return float(require("sklearn.metrics", "eval").roc_auc_score(y, ranks))


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (SciPy's ``spearmanr``: Pearson on average ranks).

    NaN when there are fewer than two points or either side is constant; ValueError when the
    lengths differ.
    """
    if len(x) != len(y):
        raise ValueError(f"{len(x)} x values but {len(y)} y values")
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")  # SciPy would warn and return NaN as well
    result = require("scipy.stats", "eval").spearmanr(list(x), list(y))
    return float(result.statistic)


def roc_curve(scores: Sequence[float], labels: Sequence[int]) -> list[tuple[float, float]]:
    """(false positive rate, true positive rate) points, from the highest threshold down.

    scikit-learn's ``roc_curve`` keeping every threshold: ``(0, 0)`` first, then one point per
    distinct score, ending at ``(1, 1)``. Empty when one class is missing; ValueError as in
    :func:`auroc`.
    """
    data = _as_labels(scores, labels)
    if data is None:
        return []
    ranks, y = data
    fpr, tpr, _ = require("sklearn.metrics", "eval").roc_curve(y, ranks,
                                                                drop_intermediate=False)
    return [(float(a), float(b)) for a, b in zip(fpr, tpr, strict=True)]
