"""Benchmark metrics: the answer matching of :mod:`rag_gates.answers` (SQuAD EM/F1,
containment accuracy, PubMedQA decisions, "the answer is" extraction), re-exported, plus the
ranking metrics the gate evaluation reads (AUROC, ROC curve, rank data, Spearman).

Example:
    >>> exact_match("The Eiffel Tower!", ["eiffel tower"])
    1.0
    >>> round(f1("in Paris, France", ["Paris"]), 3)
    0.5
    >>> extract_answer("Both were born in 1950. So the answer is: Paris.")
    'Paris'
"""

from __future__ import annotations

from collections.abc import Sequence

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


def rankdata(values: Sequence[float]) -> list[float]:
    """1-based ranks with ties given their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve (ties count half); NaN when one class is missing."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    # Rank-sum (Mann-Whitney U) with average ranks for ties.
    rank_sum = sum(r for r, y in zip(rankdata(scores), labels, strict=True) if y)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson on average ranks); NaN if either is constant."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} x values but {len(y)} y values")
    rx, ry = rankdata(x), rankdata(y)
    n = len(rx)
    if n < 2:
        return float("nan")
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return float("nan")
    return float(cov / (vx * vy) ** 0.5)


def roc_curve(scores: Sequence[float], labels: Sequence[int]) -> list[tuple[float, float]]:
    """(false positive rate, true positive rate) points, from the highest threshold down."""
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if not n_pos or not n_neg:
        return []
    points = [(0.0, 0.0)]
    tp = fp = 0
    pairs = sorted(zip(scores, labels, strict=True), key=lambda p: -p[0])
    for i, (score, label) in enumerate(pairs):
        tp += bool(label)
        fp += not label
        if i + 1 == len(pairs) or pairs[i + 1][0] != score:
            points.append((fp / n_neg, tp / n_pos))
    return points
