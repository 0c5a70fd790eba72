"""Fixed-sequence testing over thresholds: the cut it chooses by hand, ties, unscored rows,
and the guarantee itself on a synthetic population (violations at most delta)."""

from __future__ import annotations

import numpy as np
import pytest

from rag_gates.calibration.certify import certified_cut, cut_table


def _one(scores: list[float], loss: list[float], **kw: object) -> int:
    pos, ok, _ = cut_table(np.array([scores], dtype=float))
    return int(certified_cut(pos, np.array([loss], dtype=float), ok, **kw)[0])  # type: ignore[arg-type]


def test_binomial_cut_by_hand() -> None:
    """100 rows, the top 10 scores are harms; at epsilon .05, delta .1 one harm in 100 is
    allowed (P(Bin(100, .05) <= 1) = .037), two are not: skip the 91 lowest."""
    scores = list(range(100))
    loss = [0.0] * 90 + [1.0] * 10
    assert _one(scores, loss, epsilon=0.05, delta=0.1, bound="binomial") == 91
    # The same rows in another order give the same cut (the binomial reads counts).
    perm = np.random.default_rng(0).permutation(100)
    assert _one([scores[i] for i in perm], [loss[i] for i in perm], epsilon=0.05, delta=0.1,
                bound="binomial") == 91


def test_the_sequence_stops_at_the_first_failure() -> None:
    """Ten harms among the lowest scores stop the sequence there, even though skipping
    everything would gain accuracy (60 helps above them): the order is fixed in advance."""
    scores = list(range(100))
    loss = [1.0] * 10 + [-1.0] * 60 + [0.0] * 30
    assert _one(scores, loss, epsilon=0.05, delta=0.1, bound="binomial") == 1
    assert _one(scores, loss, epsilon=0.05, delta=0.1, bound="wsr") < 10
    assert _one(scores, loss, epsilon=0.05, delta=0.1, bound="exact") < 10


def test_exact_counts_the_helps_the_binomial_ignores() -> None:
    """200 rows at epsilon .02: the lowest 100 scores hold 3 harms and 4 helps (net -1).
    The binomial allows one harm in 200 (P(Bin(200, .02) <= 1) = .089) and stops before the
    second; the exact test sees the helps and skips all 100 (then 10 harms stop it)."""
    scores = list(range(200))
    low = [0.0] * 100
    for i in (10, 30, 50):
        low[i] = 1.0
    for i in (5, 20, 25, 40):
        low[i] = -1.0
    loss = low + [1.0] * 10 + [0.0] * 90
    assert _one(scores, loss, epsilon=0.02, delta=0.1, bound="binomial") == 30
    assert _one(scores, loss, epsilon=0.02, delta=0.1, bound="exact") == 100


def test_a_cut_never_splits_tied_scores() -> None:
    scores = [0.1] * 50 + [0.2] * 50            # two tied groups
    loss = [0.0] * 60 + [1.0] * 40              # harms start inside the second group
    cut = _one(scores, loss, epsilon=0.05, delta=0.1, bound="binomial")
    assert cut == 50


def test_unscored_rows_are_never_skipped() -> None:
    """NaN = the gate could not score: such a row is retrieved (fail closed), even when
    every loss is zero and everything else is skipped."""
    scores = [float(i) for i in range(80)] + [float("nan")] * 20
    loss = [0.0] * 100
    for bound in ("binomial", "wsr", "exact"):
        assert _one(scores, loss, epsilon=0.05, delta=0.1, bound=bound) == 80


def test_too_few_rows_certify_nothing() -> None:
    """With 30 clean rows, (1 - .05)^30 = .21 > .1: not even 'retrieve always' upward passes."""
    assert _one(list(range(30)), [0.0] * 30, epsilon=0.05, delta=0.1, bound="binomial") == 0
    assert _one(list(range(30)), [0.0] * 30, epsilon=0.05, delta=0.1, bound="wsr") == 0
    # The exact test: .95^30 = .21 too (with no help, the worst null has no help either).
    assert _one(list(range(30)), [0.0] * 30, epsilon=0.05, delta=0.1, bound="exact") == 0


def test_batch_equals_one_at_a_time() -> None:
    rng = np.random.default_rng(2)
    scores = rng.random((20, 150))
    loss = np.where(rng.random((20, 150)) < scores * 0.3, 1.0,
                    np.where(rng.random((20, 150)) < 0.05, -1.0, 0.0))
    pos, ok, _ = cut_table(scores)
    u = rng.random(20)
    for bound in ("wsr", "binomial", "exact", "exact-random"):
        batch = certified_cut(pos, loss, ok, epsilon=0.05, delta=0.1, bound=bound, u=u)
        single = [_one(list(scores[d]), list(loss[d]), epsilon=0.05, delta=0.1, bound=bound,
                       u=u[d:d + 1]) for d in range(20)]
        assert batch.tolist() == single


@pytest.mark.parametrize("bound", ["wsr", "binomial", "exact", "exact-random"])
def test_the_guarantee_holds_on_a_synthetic_population(bound: str) -> None:
    """A population whose skip risk grows with the score (harm probability rises, a few
    helps): over 600 calibration draws of 200, the chosen threshold's true risk exceeds
    epsilon in at most delta of the draws (plus Monte-Carlo slack), and something is
    skipped in most draws (the test is not vacuous)."""
    rng = np.random.default_rng(4)
    size, n, eps, delta = 20000, 200, 0.05, 0.1
    pop_scores = rng.random(size)
    u = rng.random(size)
    pop_loss = np.where(u < 0.6 * pop_scores ** 2, 1.0, np.where(u > 0.97, -1.0, 0.0))
    order = np.argsort(pop_scores)
    cum = np.concatenate([[0.0], np.cumsum(pop_loss[order])]) / size
    draws = np.stack([rng.choice(size, n, replace=False) for _ in range(600)])
    pos, ok, ranked = cut_table(pop_scores[draws])
    cut = certified_cut(pos, pop_loss[draws], ok, epsilon=eps, delta=delta,
                        bound=bound, u=rng.random(600))  # type: ignore[arg-type]
    t = np.where(cut == 0, -np.inf, np.take_along_axis(ranked, np.minimum(cut, n - 1)[:, None],
                                                        axis=1)[:, 0])
    t = np.where(cut >= n, np.inf, t)
    true_risk = cum[np.searchsorted(pop_scores[order], t, side="left")]
    assert (true_risk > eps).mean() <= delta + 0.03
    assert (cut > 0).mean() > 0.5
