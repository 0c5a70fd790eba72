"""The two tests behind a certified threshold, against hand-computed cases and against
Monte-Carlo coverage on synthetic data (the error rate at the null's boundary is at most
delta; well below it, the tests reject)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rag_gates.calibration.bounds import (
    WSR_TRUNCATION,
    binomial_cdf,
    binomial_max_harms,
    clopper_pearson,
    exact_p_values,
    exact_rejects,
    wsr_log_capital,
    wsr_rejects,
    wsr_upper_bound,
)


def test_binomial_cdf_by_hand() -> None:
    assert binomial_cdf(1, 3, 0.5) == pytest.approx(4 / 8)
    assert binomial_cdf(0, 10, 0.1) == pytest.approx(0.9 ** 10)
    assert binomial_cdf(2, 5, 0.2) == pytest.approx(
        sum(math.comb(5, k) * 0.2 ** k * 0.8 ** (5 - k) for k in range(3)))
    assert binomial_cdf(-1, 5, 0.2) == 0.0 and binomial_cdf(5, 5, 0.2) == 1.0


def test_binomial_max_harms_by_hand() -> None:
    # P(Bin(100, .05) <= 1) = .0371, P(<= 2) = .1183: one harm in 100 passes at delta .1.
    assert binomial_max_harms(100, 0.05, 0.1) == 1
    # A clean sample certifies only when (1 - eps)^n <= delta: .95^45 = .0994, .95^44 = .1047.
    assert binomial_max_harms(45, 0.05, 0.1) == 0
    assert binomial_max_harms(44, 0.05, 0.1) == -1


def test_clopper_pearson_by_hand() -> None:
    lo, hi = clopper_pearson(0, 10, 0.95)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-9)
    lo, hi = clopper_pearson(10, 10, 0.95)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10), abs=1e-9)
    lo, hi = clopper_pearson(5, 10, 0.9)
    assert binomial_cdf(5, 10, hi) == pytest.approx(0.05, abs=1e-9)
    assert 1 - binomial_cdf(4, 10, lo) == pytest.approx(0.05, abs=1e-9)


def test_wsr_capital_by_hand() -> None:
    """Three zeros against m = 1/2: every bet hits the truncation c / (1 - m), so each step
    multiplies the capital by 1 + c/(1-m) * (m - 0)."""
    assert WSR_TRUNCATION == 0.75
    bet = WSR_TRUNCATION / 0.5
    # The plug-in bet sqrt(2 log(10) / (3 sigma^2)) is above the cap at each step
    # (sigma^2 = .25, .15625, .1134), so the cap decides.
    assert math.sqrt(2 * math.log(10) / (3 * 0.25)) > bet
    got = float(wsr_log_capital(np.zeros(3), 0.5, 0.1))
    assert got == pytest.approx(3 * math.log(1 + bet * 0.5))
    assert not bool(wsr_rejects(np.zeros(3), 0.5, 0.1))      # 1.68 < log 10
    assert bool(wsr_rejects(np.zeros(5), 0.5, 0.1))          # 2.80 >= log 10
    # A value above m loses: one 1 first, then zeros.
    x = np.array([1.0, 0.0, 0.0])
    first = math.log(1 + bet * (0.5 - 1.0))
    assert float(wsr_log_capital(x, 0.5, 0.1)) >= first


def test_wsr_is_vectorised_over_leading_axes() -> None:
    rng = np.random.default_rng(1)
    x = rng.random((3, 4, 50))
    batch = wsr_log_capital(x, 0.6, 0.1)
    assert batch.shape == (3, 4)
    assert batch[2, 1] == pytest.approx(float(wsr_log_capital(x[2, 1], 0.6, 0.1)))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5])
def test_wsr_coverage_on_bernoulli(p: float) -> None:
    """At the null's boundary (true mean = m) the test rejects in at most delta of 4,000
    samples (plus Monte-Carlo slack); well below m it rejects most of the time."""
    rng = np.random.default_rng(7)
    x = (rng.random((4000, 100)) < p).astype(float)
    assert wsr_rejects(x, p, 0.1).mean() <= 0.1 + 0.015
    assert wsr_rejects(x, min(1.0, p + 0.25), 0.1).mean() > 0.8


def test_wsr_coverage_on_the_signed_loss() -> None:
    """Skip losses in {-1, 0, 1} (harm 7%, help 2%: mean 0.05) rescaled to [0, 1]: testing
    "mean > 0.05" at the boundary errs in at most delta of the draws."""
    rng = np.random.default_rng(3)
    u = rng.random((4000, 200))
    loss = np.where(u < 0.07, 1.0, np.where(u < 0.09, -1.0, 0.0))
    x = (1 + loss) / 2
    assert wsr_rejects(x, (1 + 0.05) / 2, 0.1).mean() <= 0.1 + 0.015
    # Harm 1%, help 2%: a mean of -0.01 is told apart from 0.05.
    loss = np.where(u < 0.01, 1.0, np.where(u < 0.03, -1.0, 0.0))
    assert wsr_rejects((1 + loss) / 2, (1 + 0.05) / 2, 0.1).mean() > 0.8


def test_binomial_coverage_on_harms() -> None:
    rng = np.random.default_rng(5)
    harms = (rng.random((20000, 150)) < 0.05).sum(axis=1)
    kmax = binomial_max_harms(150, 0.05, 0.1)
    assert (harms <= kmax).mean() <= 0.1
    assert (harms <= kmax).mean() > 0.05        # exact: close to delta, not far below


def test_wsr_upper_bound_covers_the_mean() -> None:
    rng = np.random.default_rng(11)
    covered = [wsr_upper_bound((rng.random(80) < 0.2).astype(float), 0.1) >= 0.2
               for _ in range(400)]
    assert np.mean(covered) >= 0.9 - 0.03
    assert wsr_upper_bound(np.zeros(200), 0.1) < 0.05


@pytest.mark.parametrize(("eps", "wsr_n", "binomial_n", "one_harm_n"),
                         [(0.01, 318, 230, 388), (0.02, 158, 114, 194), (0.05, 62, 45, 77)])
def test_smallest_sample_that_certifies_anything(eps: float, wsr_n: int, binomial_n: int,
                                                 one_harm_n: int) -> None:
    """The figures docs/calibration.md quotes: with no harm at all (every loss 0), the
    betting test needs wsr_n questions before even the first threshold passes, the binomial
    binomial_n; the binomial tolerates one harm from one_harm_n on (delta 0.1)."""
    m = (1 + eps) / 2
    assert bool(wsr_rejects(np.full(wsr_n, 0.5), m, 0.1))
    assert not bool(wsr_rejects(np.full(wsr_n - 1, 0.5), m, 0.1))
    assert binomial_max_harms(binomial_n, eps, 0.1) == 0
    assert binomial_max_harms(binomial_n - 1, eps, 0.1) == -1
    assert binomial_max_harms(one_harm_n, eps, 0.1) == 1
    assert binomial_max_harms(one_harm_n - 1, eps, 0.1) == 0


def _trinomial_counts(rng: np.random.Generator, n: int, harm: float, help_: float,
                      size: int) -> tuple[np.ndarray, np.ndarray]:
    counts = rng.multinomial(n, [harm, help_, 1.0 - harm - help_], size=size)
    return counts[:, 0], counts[:, 1]


@pytest.mark.parametrize(("harm", "help_"), [(0.05, 0.0), (0.08, 0.03), (0.2, 0.15),
                                             (0.475, 0.425)])
def test_exact_coverage_on_three_valued_losses(harm: float, help_: float) -> None:
    """At the null's boundary (mean loss = harm - help = epsilon exactly; Bernoulli harms
    when help is 0) the exact test rejects in at most delta of 2,000 samples of 100, plus a
    Monte-Carlo tolerance of 0.02 (three standard errors of a rate of 0.1 over 2,000)."""
    rng = np.random.default_rng(13)
    h, g = _trinomial_counts(rng, 100, harm, help_, 2000)
    assert exact_rejects(h, g, 100, 0.05, 0.1).mean() <= 0.1 + 0.02
    # Inside the null (mean above epsilon) it rejects even less.
    h, g = _trinomial_counts(rng, 100, harm + 0.02, help_, 2000)
    assert exact_rejects(h, g, 100, 0.05, 0.1).mean() <= 0.1 + 0.02


def test_exact_p_value_bounds_the_supremum_over_the_nuisance() -> None:
    """The p-value is an upper bound on P(statistic at least as extreme) at *every* null
    distribution on the boundary, not only at the grid points it was computed on: checked
    against a 20,001-point grid of the help rate, by direct summation."""
    n, eps = 40, 0.05
    p = exact_p_values(n, eps)
    from rag_gates.calibration.bounds import _exact_statistic
    stat = _exact_statistic(n, eps)
    h, g = np.nonzero(np.isfinite(stat))
    z = n - h - g
    log_mult = (np.array([math.lgamma(n + 1)]) - np.vectorize(math.lgamma)(h + 1)
                - np.vectorize(math.lgamma)(g + 1) - np.vectorize(math.lgamma)(z + 1))
    helps = np.linspace(0.0, (1 - eps) / 2, 20001)
    worst = np.zeros(h.size)
    for start in range(0, helps.size, 500):
        q = helps[start:start + 500]
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = (log_mult[:, None] + h[:, None] * np.log(q + eps)[None, :]
                    + np.where(g[:, None] > 0, g[:, None] * np.log(q)[None, :], 0.0)
                    + np.where(z[:, None] > 0, z[:, None] * np.log1p(-eps - 2 * q)[None, :],
                               0.0))
        pmf = np.exp(logs)
        s = stat[h, g]
        extreme = s[None, :] >= s[:, None] - 0.0          # (cell, cells at least as extreme)
        worst = np.maximum(worst, (extreme.astype(float) @ pmf).max(axis=1))
    assert np.all(p[h, g] >= worst - 1e-12)
    tabulated = p[h, g] < 1.0                                # p-values above 1/4 read 1
    assert np.all(p[h, g][tabulated] <= worst[tabulated] * 1.2 + 1e-3)   # not wildly loose
    assert np.all(worst[~tabulated] > 0.25 * 0.95)


def test_exact_is_tighter_than_the_binomial_and_wsr() -> None:
    """Harm 1%, help 2% (mean -1%) against epsilon 0.05 with 100 questions: the exact test
    on the (harm, help) counts rejects more often than the binomial on the harm count (which
    ignores the helps) and than the betting test; with no help at all it accepts the
    binomial's largest harm count at these sizes (the worst null then has no help either,
    so the two agree up to the grid slack)."""
    rng = np.random.default_rng(17)
    u = rng.random((2000, 100))
    loss = np.where(u < 0.01, 1.0, np.where(u < 0.03, -1.0, 0.0))
    h, g = (loss > 0).sum(axis=1), (loss < 0).sum(axis=1)
    exact = exact_rejects(h, g, 100, 0.05, 0.1).mean()
    binomial = (h <= binomial_max_harms(100, 0.05, 0.1)).mean()
    wsr = wsr_rejects((1 + loss) / 2, (1 + 0.05) / 2, 0.1).mean()
    assert exact > binomial + 0.05 and exact > wsr + 0.05
    for n, eps in ((100, 0.05), (200, 0.02), (400, 0.01)):
        kmax = binomial_max_harms(n, eps, 0.1)
        assert bool(exact_rejects(np.array(kmax), np.array(0), n, eps, 0.1))


@pytest.mark.parametrize(("eps", "clean_n", "one_harm_n"),
                         [(0.01, 232, 390), (0.02, 115, 195), (0.05, 46, 77)])
def test_smallest_sample_the_exact_test_certifies(eps: float, clean_n: int,
                                                  one_harm_n: int) -> None:
    """The figures docs/calibration.md quotes for the exact test without any help: a clean
    sample certifies from clean_n questions, one harm from one_harm_n: one or two questions
    more than the binomial (230 / 114 / 45 and 388 / 194 / 77), the price of bounding the
    supremum between grid points."""
    assert exact_p_values(clean_n, eps)[0, 0] <= 0.1 < exact_p_values(clean_n - 1, eps)[0, 0]
    assert exact_p_values(one_harm_n, eps)[1, 0] <= 0.1 \
        < exact_p_values(one_harm_n - 1, eps)[1, 0]


@pytest.mark.parametrize(("harm", "help_"), [(0.02, 0.0), (0.05, 0.03), (0.3, 0.28)])
def test_randomised_exact_coverage(harm: float, help_: float) -> None:
    """The randomised test (u uniform, independent of the counts) at the null's boundary:
    rejects in at most delta of 4,000 samples of 188 plus 0.015 (three standard errors),
    including the Bernoulli case where the deterministic test is conservative; and it
    rejects at least as often as the deterministic one (a larger u only raises p)."""
    rng = np.random.default_rng(19)
    eps = harm - help_
    h, g = _trinomial_counts(rng, 188, harm, help_, 4000)
    u = rng.random(4000)
    randomised = exact_rejects(h, g, 188, eps, 0.1, u)
    assert randomised.mean() <= 0.1 + 0.015
    assert np.all(randomised >= exact_rejects(h, g, 188, eps, 0.1))


def test_randomised_exact_spends_the_level_the_deterministic_one_cannot() -> None:
    """188 questions, epsilon 0.02, one harm and no help: P(Bin(188, .02) <= 1) = .109, so
    the deterministic test never rejects; the randomised one rejects for small enough u,
    and at the boundary (harm rate .02, no help) its error stays below delta while the
    deterministic test's is .023 (it rejects only zero harms)."""
    assert not bool(exact_rejects(1, 0, 188, 0.02, 0.1))
    assert bool(exact_rejects(1, 0, 188, 0.02, 0.1, 0.5))
    assert not bool(exact_rejects(1, 0, 188, 0.02, 0.1, 1.0))
    rng = np.random.default_rng(23)
    h = rng.binomial(188, 0.02, size=40000)
    g = np.zeros_like(h)
    deterministic = exact_rejects(h, g, 188, 0.02, 0.1).mean()
    randomised = exact_rejects(h, g, 188, 0.02, 0.1, rng.random(40000)).mean()
    assert deterministic == pytest.approx(0.98 ** 188, abs=0.004)
    assert deterministic + 0.03 < randomised <= 0.1 + 0.005
