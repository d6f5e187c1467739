"""The exact discrete Gaussian sampler draws N_Z(0, σ²), checked against its pmf.

The reference pmf P[X = x] = exp(−x²/(2σ²))/θ₃(0, e^{−1/(2σ²)}) is computed independently in
mpmath at 30 digits (θ₃ = Σ_{y∈Z} q^{y²}, Jacobi's theta function, as the normaliser).
Every statistical test uses a fixed seed through the ``seeded`` source, so it is
deterministic; its significance level α = 10⁻³ is the probability that a *correct* sampler
fails it on a random seed (tests of the same file together: below 2·10⁻²).
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from privacy import discrete_gaussian as dg
from privacy.discrete_gaussian import discrete_gaussian
from privacy.randomness import noise_source

ALPHA = 1e-3
N = 200_000

mpmath.mp.dps = 30


def _normaliser(sigma_sq: Fraction) -> mpmath.mpf:
    """Σ_{y∈Z} exp(−y²/(2σ²)) = θ₃(0, e^{−1/(2σ²)}) = √(2πσ²)·θ₃(0, e^{−2π²σ²}) (Jacobi's identity).

    The first form for σ <= 3, the second (Poisson summation) above, where the first's
    q is too close to 1 for mpmath.
    """
    s2 = mpmath.mpf(sigma_sq.numerator) / sigma_sq.denominator
    if s2 <= 9:
        return mpmath.jtheta(3, 0, mpmath.exp(-1 / (2 * s2)))
    return mpmath.sqrt(2 * mpmath.pi * s2) * mpmath.jtheta(3, 0, mpmath.exp(-2 * mpmath.pi**2 * s2))


def _pmf(sigma_sq: Fraction, xs: range) -> list[mpmath.mpf]:
    s2 = mpmath.mpf(sigma_sq.numerator) / sigma_sq.denominator
    norm = _normaliser(sigma_sq)
    return [mpmath.exp(-mpmath.mpf(x) ** 2 / (2 * s2)) / norm for x in xs]


def _exact_moments(sigma_sq: Fraction) -> tuple[mpmath.mpf, mpmath.mpf]:
    """(Var X, E X⁴) of N_Z(0, σ²), summing the pmf over |x| <= 40σ + 40 (the rest is below 10⁻³⁰⁰)."""
    reach = int(40 * math.sqrt(sigma_sq) + 40)
    xs = range(-reach, reach + 1)
    p = _pmf(sigma_sq, xs)
    second = mpmath.fsum(pi * x**2 for pi, x in zip(p, xs, strict=True))
    fourth = mpmath.fsum(pi * x**4 for pi, x in zip(p, xs, strict=True))
    return second, fourth


def test_the_two_normalisers_agree():
    """The reference pmf's two forms (direct theta and Poisson summation) at σ = 2 and 3."""
    for sigma_sq in (Fraction(4), Fraction(9)):
        s2 = mpmath.mpf(sigma_sq.numerator)
        direct = mpmath.jtheta(3, 0, mpmath.exp(-1 / (2 * s2)))
        dual = mpmath.sqrt(2 * mpmath.pi * s2) * mpmath.jtheta(3, 0, mpmath.exp(-2 * mpmath.pi**2 * s2))
        assert abs(direct - dual) < mpmath.mpf(10) ** -25 * direct


def _chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """p-value of Pearson's χ² after merging neighbouring cells until each expects >= 5."""
    obs, exp = [], []
    o_acc = e_acc = 0.0
    for o, e in zip(observed, expected, strict=True):
        o_acc, e_acc = o_acc + o, e_acc + e
        if e_acc >= 5:
            obs.append(o_acc)
            exp.append(e_acc)
            o_acc = e_acc = 0.0
    obs[-1] += o_acc
    exp[-1] += e_acc
    return float(stats.chisquare(obs, exp).pvalue)


def test_sigma_one_tenth_is_zero_but_for_one_in_10_to_the_21():
    """P[X ≠ 0] = 7.7·10⁻²² at σ = 0.1: 200,000 draws are all 0 (a χ² would have no cell but 0)."""
    p_nonzero = 1 - _pmf(Fraction(1, 100), range(0, 1))[0]
    assert 0 < p_nonzero < mpmath.mpf(10) ** -21
    assert not discrete_gaussian(N, Fraction(1, 100), noise_source("seeded", 2024)).any()


@pytest.mark.parametrize("sigma_sq", [Fraction(9, 100), Fraction(1, 4), Fraction(4), Fraction(100)],
                         ids=["sigma=0.3", "sigma=0.5", "sigma=2", "sigma=10"])
def test_counts_fit_the_exact_pmf(sigma_sq):
    x = discrete_gaussian(N, sigma_sq, noise_source("seeded", 2024))
    reach = int(12 * math.sqrt(sigma_sq)) + 2
    xs = range(-reach, reach + 1)
    assert np.all(np.abs(x) <= reach), "a draw beyond 12σ: probability below 1e-30"
    observed = np.bincount(x + reach, minlength=len(xs))
    expected = np.array([float(p) for p in _pmf(sigma_sq, xs)]) * N
    assert _chi_square_p(observed, expected) > ALPHA


@pytest.mark.parametrize("sigma", [1_000, 10_000])
def test_large_sigma_fits_the_exact_pmf_in_bins(sigma):
    sigma_sq = Fraction(sigma * sigma)
    x = discrete_gaussian(N, sigma_sq, noise_source("seeded", 7))
    width = sigma // 8
    edges = list(range(-5 * sigma, 5 * sigma + 1, width))  # 80 bins of σ/8 on [−5σ, 5σ), two tails
    p = _pmf(sigma_sq, range(edges[0], edges[-1]))
    bins = [float(mpmath.fsum(p[a - edges[0]:b - edges[0]])) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    tail = (1.0 - sum(bins)) / 2.0
    expected = np.array([tail, *bins, tail]) * N
    observed = np.bincount(np.digitize(x, edges), minlength=len(edges) + 1)
    assert _chi_square_p(observed, expected) > ALPHA


def test_the_law_is_symmetric():
    x = discrete_gaussian(N, Fraction(9, 2), noise_source("seeded", 11))
    positive = np.bincount(x[x > 0])[1:]
    negative = np.bincount(-x[x < 0], minlength=positive.size + 1)[1:positive.size + 1]
    keep = positive + negative >= 10
    # conditional on n₊ + n₋, n₊ is Binomial(n₊ + n₋, 1/2) under symmetry: a χ² with one degree per value
    statistic = float(np.sum((positive[keep] - negative[keep]) ** 2 / (positive[keep] + negative[keep])))
    assert stats.chi2.sf(statistic, int(keep.sum())) > ALPHA
    assert abs(x.mean()) < 3.3 * x.std() / math.sqrt(N)


@pytest.mark.parametrize("sigma_sq", [Fraction(1, 4), Fraction(1), Fraction(4)])
def test_variance_is_the_discrete_gaussians_not_sigma_squared(sigma_sq):
    exact_variance, exact_fourth = _exact_moments(sigma_sq)
    # CKS: the variance is below σ², by ~4π²σ⁴e^{−2π²σ²}: visible at 30 digits up to σ = 1
    assert exact_variance < mpmath.mpf(sigma_sq.numerator) / sigma_sq.denominator or sigma_sq > 1
    variance, fourth = float(exact_variance), float(exact_fourth)
    x = discrete_gaussian(N, sigma_sq, noise_source("seeded", 5)).astype(np.float64)
    se = math.sqrt((fourth - variance**2) / N)  # standard error of the sample second moment
    sample = float(np.mean(x * x))
    assert abs(sample - variance) < 3.3 * se
    if sigma_sq == Fraction(1, 4):  # here the gap to σ² (≈ 0.036) is some 30 standard errors
        assert abs(sample - float(sigma_sq)) > 10 * se


@pytest.mark.parametrize("bad", [0, -1, Fraction(-1, 2), float("nan"), float("inf"), True, "1", None,
                                 Fraction(2**61), Fraction(1, 2**31), 1e-12])
def test_invalid_sigma_squared_is_refused(bad):
    with pytest.raises(ValueError, match="sigma_sq"):
        discrete_gaussian(10, bad, noise_source("seeded", 0))


def test_shapes_and_types():
    source = noise_source("seeded", 1)
    assert discrete_gaussian((3, 4), 2, source).shape == (3, 4)
    assert discrete_gaussian(5, 0.5, source).dtype == np.int64
    assert discrete_gaussian(0, 2, source).size == 0
    with pytest.raises(ValueError, match="shape"):
        discrete_gaussian((-1,), 2, source)


def test_a_float_is_taken_at_its_exact_binary_value():
    assert dg.as_sigma_sq(0.1) == Fraction(0.1) != Fraction(1, 10)
    assert dg.as_sigma_sq(np.int64(3)) == 3


def test_the_same_seed_gives_the_same_draws_and_csprng_runs():
    a = discrete_gaussian(1000, 30, noise_source("seeded", 9))
    b = discrete_gaussian(1000, 30, noise_source("seeded", 9))
    assert np.array_equal(a, b)
    c = discrete_gaussian(1000, 30, noise_source("csprng"))
    assert c.dtype == np.int64 and c.std() > 3


class _OffGrid:
    """A source whose uniforms are not multiples of 2⁻⁵³ (not 53 random bits)."""

    name = "off-grid"

    def uniform(self, size: int) -> np.ndarray:
        return np.full(size, 1.0 / 3.0)

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        raise NotImplementedError


def test_a_source_without_53_bit_uniforms_is_refused():
    with pytest.raises(ValueError, match="2\\^-53"):
        discrete_gaussian(10, 2, _OffGrid())


# ---------------------------------------------------------------------------------------
# The Bernoulli(exp(−γ)) building blocks, including the paths that exact arithmetic finishes
# ---------------------------------------------------------------------------------------

def _binomial_p(successes: int, trials: int, p: float) -> float:
    return float(stats.binomtest(successes, trials, p).pvalue)


@pytest.mark.parametrize("inflate", [0.0, 0.05], ids=["float-filter", "forced-exact-fallback"])
def test_vectorised_bernoulli_exp_minus_gamma(inflate, monkeypatch):
    """exp(−γ) for γ below and above 1; with the error bound inflated to 0.05, about a third
    of the draws are finished in Fraction arithmetic, and the law must not change."""
    calls = {"exact": 0}
    exact = dg._exp_neg_unit_exact

    def counting(gamma, v):
        calls["exact"] += 1
        return exact(gamma, v)

    monkeypatch.setattr(dg, "_exp_neg_unit_exact", counting)
    source = noise_source("seeded", 3)
    gammas = [Fraction(0), Fraction(3, 10), Fraction(1), Fraction(5, 2), Fraction(7)]
    per = 40_000
    g = np.repeat([float(x) for x in gammas], per)
    err = np.full(g.size, inflate)
    out = dg._bernoulli_exp_neg(g, err, lambda i: gammas[i // per], source)
    for j, gamma in enumerate(gammas):
        hits = int(out[j * per:(j + 1) * per].sum())
        assert _binomial_p(hits, per, math.exp(-float(gamma))) > ALPHA / len(gammas)
    assert (calls["exact"] > 20_000) == (inflate > 0)


def test_bernoulli_exp_minus_one_from_integer_thresholds():
    hits = int(dg._bernoulli_exp_minus_one(200_000, noise_source("seeded", 4)).sum())
    assert _binomial_p(hits, 200_000, math.exp(-1)) > ALPHA


def test_the_exact_finish_with_a_zero_prefix_has_the_right_conditional_law():
    """Given w = 0 (V < 2⁻⁵³), K − 1 >= k with probability min(1, 2⁵³/k!): only W decides beyond k = 18."""
    at_least = [min(Fraction(1), Fraction(2**53, math.factorial(k))) for k in range(40)]
    odd_k = sum(at_least[k] - at_least[k + 1] for k in range(0, 38, 2))  # K − 1 even ⟺ K odd
    source = noise_source("seeded", 6)
    trials = 4000
    hits = sum(dg._exp_neg_unit_exact(Fraction(1), dg._LazyUniform(0, source)) for _ in range(trials))
    assert _binomial_p(hits, trials, float(odd_k)) > ALPHA


def test_scalar_algorithm_1_bernoulli_by_bernoulli():
    source = noise_source("seeded", 8)
    trials = 4000
    hits = sum(dg._bernoulli_exp_neg_exact(Fraction(3, 2), source) for _ in range(trials))
    assert _binomial_p(hits, trials, math.exp(-1.5)) > ALPHA


def test_the_all_fraction_acceptance_path_draws_the_same_law(monkeypatch):
    """With every candidate routed to the exact (Fraction) acceptance test, the pmf still fits."""
    monkeypatch.setattr(dg, "_LARGE", 0)
    sigma_sq = Fraction(5, 2)
    n = 6000
    x = discrete_gaussian(n, sigma_sq, noise_source("seeded", 12))
    xs = range(-12, 13)
    observed = np.bincount(x + 12, minlength=len(xs))
    expected = np.array([float(p) for p in _pmf(sigma_sq, xs)]) * n
    assert _chi_square_p(observed, expected) > ALPHA
