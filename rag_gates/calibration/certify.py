"""Learn-then-Test fixed-sequence testing over thresholds (Angelopoulos et al., "Learn then
Test", arXiv 2110.01052), vectorised over many calibration draws at once.

A gate skips retrieval when its score is below the threshold. Sort the calibration rows by
score; a *cut* k skips the k lowest-scoring rows (a cut never splits tied scores, and never
reaches a row the gate could not score: such a row is always retrieved, the fail-closed
rule). The loss of skipping row i is ``retrieved_correct - closed_book_correct`` in
{-1, 0, 1}; the risk of a cut is the mean over *all* rows of the loss of the skipped ones:
the accuracy drop against always retrieving.

The cuts are tested in order k = 1, 2, ... (from "retrieve always" upward), each at level
delta, stopping at the first that is not rejected; the chosen cut is the last rejected one.
Because the order is fixed before the data are seen (thresholds ascending on the whole
float line; the data only decide where the answer falls), the family-wise error is at most
delta with no multiplicity correction: the procedure passes a threshold whose true risk
exceeds epsilon only if the first such threshold's test wrongly rejects.

Example:
    >>> import numpy as np
    >>> loss = np.zeros((1, 100)); loss[0, 90:] = 1            # the top 10 scores are harms
    >>> pos = np.arange(100)[None, :]                          # rows already in score order
    >>> ok = np.ones((1, 101), dtype=bool)
    >>> int(certified_cut(pos, loss, ok, epsilon=0.05, delta=0.1, bound="binomial")[0])
    91
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from rag_gates.calibration.bounds import (
    EXACT_MAX_N,
    binomial_max_harms,
    exact_rejects,
    wsr_log_capital,
)

__all__ = ["BOUNDS", "Bound", "certified_cut", "cut_table", "empirical_cut"]

Bound = Literal["exact", "exact-random", "wsr", "binomial"]
BOUNDS: tuple[Bound, ...] = ("exact", "exact-random", "wsr", "binomial")


def cut_table(scores: NDArray[np.float64]) -> tuple[NDArray[np.int64], NDArray[np.bool_],
                                                     NDArray[np.float64]]:
    """For score rows ``(..., n)`` (NaN = could not score): each row's position in score
    order, which cuts are allowed (``(..., n + 1)``: not inside a tie, not past the scored
    rows), and the scores in ascending order (NaN last)."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(np.where(np.isnan(scores), np.inf, scores), axis=-1, kind="stable")
    ranked = np.take_along_axis(scores, order, axis=-1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(scores.shape[-1]), order.shape),
                      axis=-1)
    finite = ~np.isnan(ranked)
    # Cut k (skip the first k) is allowed when rows k-1 and k differ and row k-1 was scored.
    inner = finite[..., :-1] & ((ranked[..., :-1] < ranked[..., 1:]) | ~finite[..., 1:])
    ok = np.concatenate([np.ones((*scores.shape[:-1], 1), dtype=bool), inner,
                         finite[..., -1:]], axis=-1)
    return pos, ok, ranked


def certified_cut(pos: NDArray[np.int64], loss: NDArray[np.float64], ok: NDArray[np.bool_],
                  *, epsilon: float, delta: float, bound: Bound, block: int = 32,
                  u: NDArray[np.float64] | None = None) -> NDArray[np.int64]:
    """The certified cut (number of lowest-scoring rows skipped) of each draw.

    Args:
        pos: ``(D, n)`` each row's position in score order (rows in the order observed:
            the betting test reads them in this order, so it must be random).
        loss: ``(D, n)`` the signed loss of skipping each row, in {-1, 0, 1}.
        ok: ``(D, n + 1)`` which cuts are allowed (:func:`cut_table`).
        epsilon, delta: the risk bound and the error probability.
        bound: ``"exact"`` (exact unconditional test on the harm and help counts),
            ``"exact-random"`` (its randomised version: needs ``u``), ``"binomial"`` (exact
            tail on the harm count) or ``"wsr"`` (betting test on the signed loss).
        u: ``(D,)`` for ``"exact-random"``: one uniform draw per calibration draw,
            independent of the data, shared by every threshold of that draw (each test in
            the sequence is then valid on its own, which is all fixed-sequence testing
            needs).
    """
    pos = np.asarray(pos)
    loss = np.asarray(loss, dtype=np.float64)
    draws, n = loss.shape
    if bound == "binomial":
        kmax = binomial_max_harms(n, epsilon, delta)
        harms = _cumulative(pos, loss > 0)
        # Cut 0 (skip nothing) is tested too: with kmax < 0 not even a clean sample
        # certifies anything, and the sequence stops before it starts.
        fails = ok & (harms > kmax)
        return _last_allowed_before(ok, fails)
    if bound in ("exact", "exact-random"):
        if n > EXACT_MAX_N:
            raise ValueError(f"the exact bound tabulates up to {EXACT_MAX_N} certification "
                             f"questions, got {n}: use bound='wsr'")
        if bound == "exact-random" and (u is None or np.shape(u) != (draws,)):
            raise ValueError(f"bound 'exact-random' needs u: one uniform draw per row of "
                             f"loss ({draws}), independent of the data")
        harm_counts: NDArray[np.int64] = _cumulative(pos, loss > 0).astype(np.int64)
        help_counts: NDArray[np.int64] = _cumulative(pos, loss < 0).astype(np.int64)
        rejected = exact_rejects(harm_counts, help_counts, n, epsilon, delta,
                                 1.0 if u is None or bound == "exact" else
                                 np.asarray(u, dtype=np.float64)[:, None])
        return _last_allowed_before(ok, ok & ~rejected)
    if bound != "wsr":
        raise ValueError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
    m = (1.0 + epsilon) / 2.0
    threshold = math.log(1.0 / delta)
    fails = np.zeros((draws, n + 1), dtype=bool)
    # Bounded memory: at most about 2M values per (draws, cuts, n) block.
    chunk = max(1, 2_000_000 // max(1, block * n))
    for first in range(0, draws, chunk):
        open_ = np.arange(first, min(first + chunk, draws))
        for start in range(0, n + 1, block):
            cuts = np.arange(start, min(start + block, n + 1))
            # (draws, cuts, n): the rescaled loss, 1/2 for the rows a cut retrieves.
            skipped = pos[open_, None, :] < cuts[None, :, None]
            x = 0.5 + 0.5 * loss[open_, None, :] * skipped
            failed = (wsr_log_capital(x, m, delta) < threshold) & ok[open_][:, cuts]
            fails[open_[:, None], cuts[None, :]] = failed
            open_ = open_[~failed.any(axis=1)]
            if open_.size == 0:
                break
    return _last_allowed_before(ok, fails)


def empirical_cut(pos: NDArray[np.int64], loss: NDArray[np.float64], ok: NDArray[np.bool_],
                  epsilon: float) -> NDArray[np.int64]:
    """Per draw, the largest allowed cut whose observed drop (mean loss over all rows) is
    at most ``epsilon``: no guarantee (what a tolerance on an accuracy curve does); used to
    *choose* a composite on rows that are not certified on."""
    n = loss.shape[1]
    drop = _cumulative(pos, loss) / n
    out: NDArray[np.int64] = np.where(ok & (drop <= epsilon + 1e-12), np.arange(n + 1),
                                      0).max(axis=1)
    return out


def _cumulative(pos: NDArray[np.int64], values: NDArray[np.generic]) -> NDArray[np.float64]:
    """``(D, n + 1)``: per draw, the sum of ``values`` over the rows cut k skips (the k
    lowest-scoring), for k = 0 .. n."""
    ordered = np.zeros(values.shape)
    np.put_along_axis(ordered, np.asarray(pos), np.asarray(values, dtype=np.float64), axis=-1)
    out: NDArray[np.float64] = np.concatenate(
        [np.zeros((values.shape[0], 1)), np.cumsum(ordered, axis=-1)], axis=-1)
    return out


def _last_allowed_before(ok: NDArray[np.bool_], fails: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Per draw, the largest allowed cut before the first failing one."""
    width = ok.shape[1]
    first_fail = np.where(fails.any(axis=1), fails.argmax(axis=1), width)
    index = np.arange(width)[None, :]
    candidates = np.where(ok & (index < first_fail[:, None]), index, 0)
    out: NDArray[np.int64] = candidates.max(axis=1)
    return out
