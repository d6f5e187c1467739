"""Rényi DP of the Poisson-subsampled Gaussian mechanism (add/remove), Opacus' series in numpy.

For sampling rate q, noise multiplier σ and order α > 1 the mechanism is (α, ρ(α))-RDP with
ρ(α) = log A_α / (α − 1) (Mironov, Talwar & Zhang 2019, arXiv 1908.10530, Sec. 3.3), where

* for integer α:  A_α = Σ_{i=0..α} C(α, i) q^i (1−q)^{α−i} exp((i² − i) / (2σ²));         (1)
* for fractional α:  A_α = A₀ + A₁ with the alternating series
  A₀ = Σ_i C(α, i) q^i (1−q)^{α−i} exp((i² − i)/(2σ²)) · ½ erfc((i − z₀)/(√2σ)),
  A₁ = Σ_i C(α, i) q^{α−i} (1−q)^i exp(((α−i)² − (α−i))/(2σ²)) · ½ erfc((z₀ − (α−i))/(√2σ)),
  z₀ = σ² log(1/q − 1) + ½, summed until the first i whose two terms are both below e^−30.   (2)

These are exactly the terms of Opacus' ``_compute_log_a_for_int_alpha`` and
``_compute_log_a_for_frac_alpha`` (the same binomials, including where ``scipy.special.binom``
overflows to ∞ at large integer orders, so those orders come out ∞, or NaN where two terms
are ∞, as in Opacus, whose conversion then ignores them), summed with a
vectorised log-sum-exp instead of one ``log1p`` per term: the results agree with Opacus to
float round-off (tests/privacy/test_sampled_gaussian_rdp.py) at a small fraction of its cost,
which is what a calibration's search pays for once per probe (#38).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

__all__ = ["log_a", "rdp_curve"]

#: A term of the fractional series (2) below e^-30 ends it (Opacus' stopping rule).
_SERIES_END = -30.0


def rdp_curve(q: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
    """ρ(α) of one q-subsampled Gaussian step with multiplier σ at each order (Opacus' ``_compute_rdp``).

    0 for q = 0, ∞ for σ = 0, α/(2σ²) for q = 1, else log A_α / (α − 1).
    """
    if q == 0:
        return np.zeros(len(orders))
    if sigma == 0:
        return np.full(len(orders), np.inf)
    if q == 1.0:
        return np.asarray([a / (2 * sigma**2) for a in orders], dtype=np.float64)
    return np.asarray([np.inf if math.isinf(a) else log_a(q, sigma, a) / (a - 1) for a in orders],
                      dtype=np.float64)


def log_a(q: float, sigma: float, alpha: float) -> float:
    """The logarithm of A_α: (1) for integer α, (2) for fractional α; 0 < q < 1, σ > 0."""
    if float(alpha).is_integer():
        return _log_a_int(q, sigma, int(alpha))
    return _log_a_frac(q, sigma, float(alpha))


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    i = np.arange(alpha + 1, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore"):
        log_coef = np.log(special.binom(alpha, i)) + i * math.log(q) + (alpha - i) * math.log(1 - q)
    return _log_sum(log_coef + (i * i - i) / (2 * sigma**2))


def _log_a_frac(q: float, sigma: float, alpha: float) -> float:
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    count = 64
    while True:  # enough terms to reach the first one below e^-30, doubling the count until then
        i = np.arange(count, dtype=np.float64)
        coef = special.binom(alpha, i)
        log_coef = np.log(np.abs(coef))
        j = alpha - i
        log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
        log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2 * (sigma**2)) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2 * (sigma**2)) + log_e1
        ended = np.maximum(log_s0, log_s1) < _SERIES_END
        if ended.any():
            last = int(np.argmax(ended)) + 1
            break
        count *= 2
    positive = coef[:last] > 0
    log_a0 = _log_signed_sum(log_s0[:last], positive)
    log_a1 = _log_signed_sum(log_s1[:last], positive)
    return float(np.logaddexp(log_a0, log_a1))


def _log_erfc(x: np.ndarray) -> np.ndarray:
    """The logarithm of erfc(x), accurate for large x (Opacus' ``_log_erfc``)."""
    return np.asarray(math.log(2) + special.log_ndtr(-x * 2**0.5))


def _log_sum(log_terms: np.ndarray) -> float:
    """The logarithm of Σ exp(log_terms), as Opacus' term-by-term ``_log_add`` has it.

    −∞ for no terms, ∞ for one infinite term, NaN for two (∞ − ∞); otherwise the largest term
    plus log1p of the others' sum.
    """
    infinite = int(np.count_nonzero(log_terms == np.inf))
    if infinite:
        return math.inf if infinite == 1 else math.nan
    if not log_terms.size:
        return -math.inf
    top = int(np.argmax(log_terms))
    if log_terms[top] == -math.inf:
        return -math.inf
    others = np.delete(log_terms, top) - log_terms[top]
    return float(log_terms[top]) + math.log1p(float(np.sum(np.exp(others))))


def _log_signed_sum(log_terms: np.ndarray, positive: np.ndarray) -> float:
    """log(Σ_{positive} e^t − Σ_{negative} e^t), −∞ where the negative part is not smaller."""
    plus, minus = _log_sum(log_terms[positive]), _log_sum(log_terms[~positive])
    if minus == -math.inf:
        return plus
    if minus >= plus:
        return -math.inf
    return plus + math.log(-math.expm1(minus - plus))
