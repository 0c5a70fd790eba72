"""The statistical tests behind a certified threshold, written from the papers.

Two tests of the null hypothesis "the mean loss is above ``epsilon``", each valid at level
``delta`` for an i.i.d. sample (a sample drawn without replacement from a finite pool is at
least as concentrated for the binomial tail; the Monte-Carlo in
``benchmarks/calibration_mc.py`` checks both on real pools):

- :func:`binomial_max_harms`: the exact binomial tail on a count of harms (Bernoulli losses
  in {0, 1}): reject when ``P(Bin(n, epsilon) <= k) <= delta``. Conservative for the signed
  loss of skipping retrieval, because it ignores the questions where skipping *helps*.
- :func:`wsr_rejects`: the betting test of Waudby-Smith and Ramdas ("Estimating means of
  bounded random variables by betting", arXiv 2010.09686, the hedged capital process with the
  predictable plug-in bet): for values ``x_t`` in [0, 1] and a null mean ``m``, the capital
  ``K_t = prod_{i <= t} (1 + lambda_i (m - x_i))`` is a non-negative supermartingale when the
  true mean is at least ``m``, so by Ville's inequality ``P(max_t K_t >= 1/delta) <= delta``.
  The bet ``lambda_i`` uses only ``x_1 .. x_{i-1}`` (a running variance), which is what makes
  the test adapt to a loss that is mostly zero.
- :func:`exact_rejects`: an exact unconditional test on the counts of harms and helps (the
  signed loss takes three values, -1 / 0 / +1, so (harms, helps) is a sufficient statistic
  of a trinomial sample). It is the non-inferiority test for paired binary outcomes
  (closed-book vs retrieved correctness: Tango, Stat. Med. 1998; Sidik, Stat. Med. 2003 for
  the exact unconditional version): the statistic is the empirical-likelihood dual of the
  mean (Owen 2001), ``S = max_lambda sum_i log(1 + lambda (epsilon - L_i))``, and the
  p-value is its tail maximised over every null distribution
  (:func:`exact_p_values` says why the maximum is over the boundary, and bounds the
  maximum between grid points). It is the tightest of the three on the Monte-Carlo
  (docs/calibration.md): it uses the helps, and it is calibrated exactly rather than by
  Ville's inequality.

Everything is vectorised over leading axes (numpy), so the Monte-Carlo runs the same code as
:func:`rag_gates.calibration.calibrate`.

Example:
    >>> binomial_max_harms(n=200, epsilon=0.05, delta=0.1)   # at most 5 harms in 200 pass
    5
    >>> import numpy as np
    >>> x = np.full(400, 0.5); x[:10] = 0.0                  # 10 skips that helped
    >>> bool(wsr_rejects(x, m=0.51, delta=0.1))
    True
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

__all__ = ["EXACT_MAX_N", "EXACT_RANDOM_LEVELS", "WSR_TRUNCATION", "binomial_cdf",
           "binomial_max_harms", "clopper_pearson", "exact_p_values", "exact_rejects",
           "wsr_log_capital", "wsr_rejects", "wsr_upper_bound"]

EXACT_MAX_N = 600
"""The exact test tabulates every (harms, helps) pair: (n + 1)(n + 2)/2 cells times a few
thousand null distributions. Above this many certification questions use ``"wsr"``."""

_EXACT_SQRT_SLACK = 0.003
"""How far ``sqrt(p-value)`` may move between two points of the nuisance grid (sets the
grid's size): an inflation of about 4% of a p-value of 0.02, 2% of 0.1."""

WSR_TRUNCATION = 0.75
"""The bet is truncated at ``WSR_TRUNCATION / (1 - m)``: the capital loses at most three
quarters of itself on one observation. The paper suggests c = 1/2 or 3/4; 3/4 certified
more skips at epsilon 0.02 on the Monte-Carlo pools (benchmarks/calibration_mc.py), and
both are valid (any predictable bet is)."""


def _log_binomial_pmf(n: int, p: float) -> NDArray[np.float64]:
    """``log P(Bin(n, p) = i)`` for i = 0..n (0 < p < 1)."""
    i = np.arange(1, n + 1, dtype=np.float64)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log((n - i + 1) / i))])
    k = np.arange(n + 1, dtype=np.float64)
    out: NDArray[np.float64] = log_comb + k * math.log(p) + (n - k) * math.log1p(-p)
    return out


def binomial_cdf(k: int, n: int, p: float) -> float:
    """``P(Bin(n, p) <= k)``, exact up to floating point (summed in log space).

    Example:
        >>> round(binomial_cdf(1, 3, 0.5), 6)       # (1 + 3) / 8
        0.5
    """
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    logs = _log_binomial_pmf(n, p)[: k + 1]
    top = float(logs.max())
    return float(min(1.0, math.exp(top) * float(np.exp(logs - top).sum())))


def binomial_max_harms(n: int, epsilon: float, delta: float) -> int:
    """The largest harm count ``k`` out of ``n`` that rejects "harm rate > epsilon" at level
    ``delta`` (``P(Bin(n, epsilon) <= k) <= delta``); -1 when even zero harms do not."""
    if n <= 0:
        return -1
    logs = _log_binomial_pmf(n, epsilon)
    cdf = np.cumsum(np.exp(logs - logs.max())) * math.exp(float(logs.max()))
    passing = np.nonzero(cdf <= delta)[0]
    return int(passing[-1]) if passing.size else -1


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval for a proportion ``k / n`` at
    confidence ``level`` (each tail ``(1 - level) / 2``), by bisection on the binomial tail.

    Example:
        >>> lo, hi = clopper_pearson(0, 10, 0.95)
        >>> lo, round(hi, 4)
        (0.0, 0.3085)
    """
    if n <= 0:
        return 0.0, 1.0
    tail = (1.0 - level) / 2.0

    def solve(f: object, lo: float, hi: float) -> float:
        for _ in range(60):
            mid = (lo + hi) / 2.0
            if f(mid):  # type: ignore[operator]
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2.0

    # Lower end: the p where P(X >= k) = tail; upper end: the p where P(X <= k) = tail.
    lower = 0.0 if k == 0 else solve(lambda p: 1.0 - binomial_cdf(k - 1, n, p) < tail, 0.0, 1.0)
    upper = 1.0 if k == n else solve(lambda p: binomial_cdf(k, n, p) > tail, 0.0, 1.0)
    return lower, upper


def wsr_log_capital(x: NDArray[np.float64], m: float | NDArray[np.float64], delta: float
                    ) -> NDArray[np.float64]:
    """``max_t log K_t`` of the hedged capital process betting that the mean of ``x`` (values
    in [0, 1], last axis in the order observed) is below ``m``.

    The bet at step t is the predictable plug-in of Waudby-Smith and Ramdas for a fixed
    sample size n: ``sqrt(2 log(1/delta) / (n sigma_{t-1}^2))`` with the running variance
    ``sigma_t^2 = (1/4 + sum_{i<=t} (x_i - mu_i)^2) / (t + 1)`` and running mean
    ``mu_t = (1/2 + sum_{i<=t} x_i) / (t + 1)``, truncated at ``c / (1 - m)``
    (:data:`WSR_TRUNCATION`) so that the capital stays positive.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    m_arr = np.asarray(m, dtype=np.float64)[..., None]
    t = np.arange(1, n + 1, dtype=np.float64)
    mu = (0.5 + np.cumsum(x, axis=-1)) / (t + 1.0)
    sigma2 = (0.25 + np.cumsum((x - mu) ** 2, axis=-1)) / (t + 1.0)
    prev = np.concatenate([np.full((*x.shape[:-1], 1), 0.25), sigma2[..., :-1]], axis=-1)
    bet = np.sqrt(2.0 * math.log(1.0 / delta) / (n * prev))
    bet = np.minimum(bet, WSR_TRUNCATION / np.maximum(1.0 - m_arr, 1e-12))
    log_k = np.cumsum(np.log1p(bet * (m_arr - x)), axis=-1)
    out: NDArray[np.float64] = np.maximum(log_k.max(axis=-1), 0.0)
    return out


def wsr_rejects(x: NDArray[np.float64], m: float | NDArray[np.float64], delta: float
                ) -> NDArray[np.bool_]:
    """True where the betting test rejects "mean of x >= m" at level ``delta``."""
    rejected: NDArray[np.bool_] = wsr_log_capital(x, m, delta) >= math.log(1.0 / delta)
    return rejected


def wsr_upper_bound(x: NDArray[np.float64], delta: float) -> float:
    """The upper confidence bound at ``1 - delta`` for the mean of ``x`` (values in [0, 1]):
    the smallest ``m`` the betting test rejects, found by bisection (the capital grows with
    ``m``).

    Example:
        >>> import numpy as np
        >>> round(wsr_upper_bound(np.zeros(100), 0.1), 3) < 0.06
        True
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return 1.0
    lo, hi = float(x.mean()), 1.0
    if not bool(wsr_rejects(x, math.nextafter(1.0, 0.0), delta)):
        return 1.0
    for _ in range(50):
        mid = (lo + hi) / 2.0
        if bool(wsr_rejects(x, mid, delta)):
            hi = mid
        else:
            lo = mid
    return hi


def _exact_statistic(n: int, epsilon: float) -> NDArray[np.float64]:
    """``S[h, g]`` for h harms and g helps out of n (-inf where h + g > n): the largest
    log-capital ``h log(1 + l(e - 1)) + g log(1 + l(e + 1)) + z log(1 + l e)`` over a fixed
    grid of bets l in [0, 1/(1 - e)). Each term falls with h and rises with g (z = n - h - g
    gives way), so S does too: the property the supremum over the null rests on."""
    bets = np.concatenate([[0.0], np.geomspace(1e-3, 0.999, 95) / (1.0 - epsilon)])
    per = np.stack([np.log1p(bets * (epsilon - 1.0)), np.log1p(bets * (epsilon + 1.0)),
                    np.log1p(bets * epsilon)])                        # (3, bets)
    h, g = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    z = n - h - g
    counts = np.stack([h, g, z], axis=-1).astype(np.float64)          # (n+1, n+1, 3)
    stat: NDArray[np.float64] = (counts @ per).max(axis=-1)
    stat[z < 0] = -np.inf
    return stat


EXACT_RANDOM_LEVELS = 16
"""The randomised exact test rounds its uniform draw ``u`` up to a multiple of 1/16 (a
larger ``u`` only raises the p-value, so rounding up keeps it valid): one table each."""


@lru_cache(maxsize=8)
def _exact_p_tables(n: int, epsilon: float, randomised: bool) -> NDArray[np.float64]:
    """``(EXACT_RANDOM_LEVELS, n + 1, n + 1)``: the p-value tables for u = 1/16 .. 1, or
    ``(1, n + 1, n + 1)`` for u = 1 alone (the deterministic test, 3-4 times faster)."""
    stat = _exact_statistic(n, epsilon)
    h, g = np.nonzero(np.isfinite(stat))
    z = n - h - g
    s = stat[h, g]
    order = np.argsort(-s, kind="stable")
    h, g, z, s = h[order], g[order], z[order], s[order]
    # A cell's tie group (same statistic) spans first..last in this order: the tail
    # "at least as extreme" ends at last, "more extreme" just before first.
    last = np.searchsorted(-s, -s, side="right") - 1
    first = np.searchsorted(-s, -s, side="left")
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    log_mult = log_fact[n] - log_fact[h] - log_fact[g] - log_fact[z]
    counts = np.stack([h, g, z], axis=1).astype(np.float64)
    levels = np.arange(1, EXACT_RANDOM_LEVELS + 1) / EXACT_RANDOM_LEVELS if randomised \
        else np.ones(1)
    # The null boundary harm - help = epsilon, by an angle: help = a sin^2, none =
    # 2a cos^2 (a = (1 - e)/2). Along it the Fisher information of one question is at most
    # 8a = 4(1 - e), so by Cauchy-Schwarz |d sqrt(P) / d phi| <= sqrt(n (1 - e)) for
    # P = P(A) + u P(B) with A, B disjoint, u in [0, 1] (E[(1_A + u 1_B)^2] <= P): between
    # grid points sqrt(P) moves at most spacing/2 times that.
    lipschitz = math.sqrt(n * (1.0 - epsilon))
    points = max(64, math.ceil(lipschitz * (math.pi / 2) / (2 * _EXACT_SQRT_SLACK)) + 1)

    def log_probs(count: int) -> NDArray[np.float64]:
        phi = np.linspace(0.0, math.pi / 2, count)
        a = (1.0 - epsilon) / 2.0
        helps = a * np.sin(phi) ** 2
        probs = np.stack([helps + epsilon, helps, 2 * a * np.cos(phi) ** 2])
        with np.errstate(divide="ignore"):
            return np.maximum(np.log(probs), -1e30)   # 0 * log 0 = 0, k * log 0 = -huge

    def tails(rows: int, logs: NDArray[np.float64], us: NDArray[np.float64]
              ) -> NDArray[np.float64]:
        """max over the grid of P(S > s) + u P(S = s), for each u, first ``rows`` cells."""
        worst = np.zeros((us.size, rows))
        for start in range(0, logs.shape[1], 64):
            pmf = np.exp(log_mult[:rows, None] + counts[:rows] @ logs[:, start:start + 64])
            cum = np.cumsum(pmf, axis=0)
            upto = cum[last[:rows]]
            before = np.where(first[:rows, None] > 0, cum[np.maximum(first[:rows] - 1, 0)], 0.0)
            for k, u in enumerate(us):
                worst[k] = np.maximum(worst[k], (before + u * (upto - before)).max(axis=1))
        return worst

    # The tail only grows along the order, so the cells whose p-value can be small are a
    # prefix: cut it where a coarse grid already puts the tail above 1/4 (a lower bound on
    # the supremum), and report 1 for the rest (a level above 1/4 acts as 1/4: valid).
    coarse = tails(s.size, log_probs(65), np.ones(1))[0]
    rows = int(np.searchsorted(coarse > 0.25, True))
    worst = tails(rows, log_probs(points), levels)
    slack = (math.pi / 2) / (points - 1) / 2 * lipschitz
    bound = np.minimum(1.0, (np.sqrt(np.minimum(worst, 1.0)) + slack) ** 2)
    tables = np.ones((levels.size, n + 1, n + 1))
    tables[:, h[:rows], g[:rows]] = bound
    tables.setflags(write=False)
    return tables


def _level(u: float | NDArray[np.float64]) -> NDArray[np.int64]:
    """Index of the table for a uniform draw ``u`` (rounded up to a multiple of 1/16)."""
    k = np.ceil(np.asarray(u, dtype=np.float64) * EXACT_RANDOM_LEVELS).astype(np.int64)
    out: NDArray[np.int64] = np.clip(k, 1, EXACT_RANDOM_LEVELS) - 1
    return out


def exact_p_values(n: int, epsilon: float, u: float = 1.0) -> NDArray[np.float64]:
    """``P[h, g]``: a valid p-value of "mean signed loss >= epsilon" after h harms (+1) and
    g helps (-1) among n i.i.d. losses (1 where h + g > n, and where it exceeds 1/4).
    Cached per (n, epsilon); about 1 s at n = 200, 6 s at n = 400 (one core).

    ``u = 1`` (the default) is the deterministic test. ``u`` in (0, 1), drawn uniformly and
    independently of the data, gives the randomised test (Lehmann and Romano, Testing
    Statistical Hypotheses, sec. 3.2): the outcomes exactly as extreme as the observed one
    count ``u`` times, which spends the whole level on discrete data instead of part of it.

    Validity: for a trinomial with harm rate ``p_h`` and help rate ``p_g``, the null is
    ``p_h - p_g >= epsilon``. The statistic falls with harms and rises with helps, so
    moving mass from harm to "no change" can only make it larger: the tail
    ``P(S > s) + u P(S = s)`` is largest on the boundary ``p_h = p_g + epsilon``, a
    one-parameter curve. The p-value is the maximum over a grid of that curve, inflated by
    the most the tail can rise between grid points (a Lipschitz bound on its square root),
    so it bounds the supremum over the whole null: ``P(p <= delta) <= delta`` exactly, for
    any n (over the data, and over ``u`` for the randomised test).

    Example:
        >>> p = exact_p_values(200, 0.02)
        >>> bool(p[1, 0] <= 0.1), bool(p[2, 0] <= 0.1)     # one harm in 200 passes, two not
        (True, False)
        >>> bool(exact_p_values(188, 0.02)[1, 0] <= 0.1)    # not in 188 ...
        False
        >>> bool(exact_p_values(188, 0.02, u=0.5)[1, 0] <= 0.1)   # ... unless u is small
        True
    """
    _check_exact(n, epsilon)
    if not 0.0 <= u <= 1.0:
        raise ValueError(f"u must lie in [0, 1], got {u}")
    if u >= 1.0:
        return _exact_p_tables(int(n), float(epsilon), False)[0]
    table: NDArray[np.float64] = _exact_p_tables(int(n), float(epsilon), True)[int(_level(u))]
    return table


def _check_exact(n: int, epsilon: float) -> None:
    if not 0 < n <= EXACT_MAX_N:
        raise ValueError(f"the exact test tabulates up to {EXACT_MAX_N} questions, got {n}: "
                         "use the 'wsr' bound for more")
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"epsilon must lie in (0, 1), got {epsilon}")


def exact_rejects(harms: NDArray[np.int64] | int, helps: NDArray[np.int64] | int, n: int,
                  epsilon: float, delta: float, u: float | NDArray[np.float64] = 1.0
                  ) -> NDArray[np.bool_]:
    """True where the exact test rejects "mean signed loss >= epsilon" at level ``delta``
    (vectorised over the counts and ``u``; ``u`` < 1: the randomised test, see
    :func:`exact_p_values`).

    Example:
        >>> bool(exact_rejects(2, 2, 200, 0.02, 0.1))       # 2 harms, 2 helps in 200
        True
        >>> bool(exact_rejects(3, 2, 200, 0.02, 0.1))       # one more harm
        False
    """
    _check_exact(n, epsilon)  # not exact_p_values: it would build the deterministic table
    u_arr = np.asarray(u, dtype=np.float64)
    if bool(np.all(u_arr >= 1.0)):
        table = _exact_p_tables(int(n), float(epsilon), False)[0]
        fixed: NDArray[np.bool_] = table[np.asarray(harms), np.asarray(helps)] <= delta
        return fixed
    tables = _exact_p_tables(int(n), float(epsilon), True)
    out: NDArray[np.bool_] = tables[_level(u_arr), np.asarray(harms),
                                    np.asarray(helps)] <= delta
    return out
