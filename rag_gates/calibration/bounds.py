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

import numpy as np
from numpy.typing import NDArray

__all__ = ["WSR_TRUNCATION", "binomial_cdf", "binomial_max_harms", "clopper_pearson",
           "wsr_log_capital", "wsr_rejects", "wsr_upper_bound"]

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
