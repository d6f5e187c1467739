"""The exact privacy profile of a pair of Gaussians: δ(ε) and the smallest ε at δ.

**Gaussian privacy profile** (Balle & Wang 2018, Thm. 8). The Gaussian mechanism whose
sensitivity is μ noise standard deviations, N(0, 1) against N(μ, 1), is (ε, δ)-DP exactly for

    δ(ε; μ) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ).                                          (1)

:func:`gaussian_delta`, :func:`gaussian_epsilon` (ε for δ) and :func:`gaussian_mu`.
:func:`two_gaussians_epsilon` generalises (1) to two Gaussians of unequal variance (the
privacy loss is then quadratic in the outcome): δ(ε) = max over the two orders of
P[L > ε] − e^ε Q[L > ε], L = log dP/dQ.

Pure statistics, independent of :mod:`privacy.accountants` (the tests check one against the other);
the audits (:mod:`privacy.auditing`) turn fitted Gaussians into ε with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# scipy is imported inside the functions that use it (privacy.auditing is imported by fast CLI paths).

__all__ = [
    "EPS_MAX",
    "EPS_TOL",
    "check_delta",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu",
    "two_gaussians_delta",
    "two_gaussians_epsilon",
]

#: ε searches stop at this width; every ε returned as a bound has been verified.
EPS_TOL = 1e-4
#: ε searches give up (∞) beyond this.
EPS_MAX = 1e3


def check_delta(delta: float, *, allow_zero: bool = True) -> float:
    """δ as a float, ValueError unless it is in [0, 1) (or (0, 1) without ``allow_zero``)."""
    if not (0.0 <= delta < 1.0) or (delta == 0.0 and not allow_zero):
        raise ValueError(f"delta must be in {'[' if allow_zero else '('}0, 1); found {delta!r}")
    return float(delta)


def _log_sub(log_a: float, log_b: float) -> float:
    """log(e^a − e^b), −inf where b >= a."""
    if log_b >= log_a:
        return -math.inf
    return log_a + math.log1p(-math.exp(log_b - log_a))


def _log_gaussian_delta(epsilon: float, mu: float) -> float:
    from scipy import stats

    if mu <= 0.0:
        return -math.inf
    if math.isinf(mu):
        return 0.0
    first = float(stats.norm.logcdf(mu / 2 - epsilon / mu))
    second = epsilon + float(stats.norm.logcdf(-mu / 2 - epsilon / mu))
    return _log_sub(first, second)


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of the Gaussian mechanism N(0, 1) vs N(μ, 1), eq. (1) (Balle & Wang 2018, Thm. 8).

    Parameters
    ----------
    epsilon : float
        ε >= 0.
    mu : float
        Sensitivity over noise standard deviation, >= 0 (∞: no noise, δ = 1).

    Returns
    -------
    float
        The smallest δ for which the mechanism is (ε, δ)-DP (both orders coincide by symmetry).
    """
    if epsilon < 0 or mu < 0:
        raise ValueError(f"epsilon and mu must be >= 0; found epsilon={epsilon!r}, mu={mu!r}")
    return math.exp(_log_gaussian_delta(float(epsilon), float(mu)))


def _smallest_epsilon(log_delta_at: Callable[[float], float], delta: float) -> float:
    """Smallest ε >= 0 with log δ(ε) <= log δ, for a non-increasing δ(ε); a verified upper end."""
    from scipy.optimize import brentq

    target = math.log(delta)

    def excess(eps: float) -> float:
        return float(log_delta_at(eps)) - target

    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:
        high *= 2.0
        if high > EPS_MAX:
            return math.inf
    root = float(brentq(excess, 0.0, high, xtol=1e-12, rtol=1e-12))
    step = 1e-12 * max(1.0, root)
    while excess(root) > 0:  # brentq may land a hair below the root
        root += step
        step *= 2.0
    return root


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of the Gaussian mechanism with sensitivity μ noise standard deviations at δ, from eq. (1).

    Returns the smallest ε >= 0 with δ(ε; μ) <= δ (0 where δ(0) <= δ already, ∞ for μ = ∞).
    """
    delta = check_delta(delta, allow_zero=False)
    if mu < 0:
        raise ValueError(f"mu must be >= 0; found {mu!r}")
    if math.isinf(mu):
        return math.inf
    return _smallest_epsilon(lambda eps: _log_gaussian_delta(eps, float(mu)), delta)


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The μ whose Gaussian mechanism is exactly (ε, δ)-DP: the root of δ(ε; μ) = δ in μ (eq. (1) increases in μ)."""
    from scipy.optimize import brentq

    delta = check_delta(delta, allow_zero=False)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0; found {epsilon!r}")
    target = math.log(delta)
    high = 1.0
    while _log_gaussian_delta(epsilon, high) < target:
        high *= 2.0
    return float(brentq(lambda m: _log_gaussian_delta(epsilon, m) - target, 1e-12, high, xtol=1e-13, rtol=1e-13))


def _log_mass(lower: float, upper: float, mean: float, std: float) -> float:
    """Log P[lower < Y < upper] for Y ~ N(mean, std²), accurate in both tails."""
    from scipy import stats

    if upper <= lower:
        return -math.inf
    a, b = (lower - mean) / std, (upper - mean) / std
    if a > 0:  # both in the upper tail: survival functions
        return _log_sub(float(stats.norm.logsf(a)), float(stats.norm.logsf(b)))
    return _log_sub(float(stats.norm.logcdf(b)), float(stats.norm.logcdf(a)))


def _log_hockey_stick(epsilon: float, p_mean: float, p_std: float, q_mean: float, q_std: float) -> float:
    """Log of P[L > ε] − e^ε Q[L > ε], L = log dP/dQ, for P = N(p_mean, p_std²), Q = N(q_mean, q_std²).

    L(y) = A y² + B y + C with A = 1/(2 q_std²) − 1/(2 p_std²), B = p_mean/p_std² − q_mean/q_std²,
    C = q_mean²/(2 q_std²) − p_mean²/(2 p_std²) + log(q_std/p_std); {L > ε} is a half-line
    (A = 0), the outside of the roots (A > 0) or the inside (A < 0).
    """
    from scipy.special import logsumexp

    a = 0.5 / q_std**2 - 0.5 / p_std**2
    b = p_mean / p_std**2 - q_mean / q_std**2
    c = q_mean**2 / (2 * q_std**2) - p_mean**2 / (2 * p_std**2) + math.log(q_std / p_std) - epsilon
    regions: list[tuple[float, float]]
    if a == 0.0:
        if b == 0.0:
            regions = [(-math.inf, math.inf)] if c > 0 else []
        elif b > 0:
            regions = [(-c / b, math.inf)]
        else:
            regions = [(-math.inf, -c / b)]
    else:
        disc = b * b - 4 * a * c
        if disc <= 0:
            regions = [(-math.inf, math.inf)] if a > 0 else []
        else:
            root = math.sqrt(disc)
            half = -0.5 * (b + math.copysign(root, b))  # stable roots: half/a and c/half
            r1, r2 = sorted((half / a, c / half))
            regions = [(-math.inf, r1), (r2, math.inf)] if a > 0 else [(r1, r2)]
    if not regions:
        return -math.inf
    log_p = float(logsumexp([_log_mass(lo, hi, p_mean, p_std) for lo, hi in regions]))
    log_q = float(logsumexp([_log_mass(lo, hi, q_mean, q_std) for lo, hi in regions]))
    return _log_sub(log_p, epsilon + log_q)


def two_gaussians_delta(epsilon: float, mean0: float, std0: float, mean1: float, std1: float) -> float:
    """δ(ε) of the pair N(mean0, std0²), N(mean1, std1²): the larger hockey-stick divergence of the two orders.

    With equal standard deviations this is eq. (1) at μ = |mean1 − mean0| / std.
    """
    if std0 <= 0 or std1 <= 0:
        raise ValueError(f"standard deviations must be > 0; found {std0!r}, {std1!r}")
    return math.exp(max(_log_hockey_stick(epsilon, mean1, std1, mean0, std0),
                        _log_hockey_stick(epsilon, mean0, std0, mean1, std1)))


def two_gaussians_epsilon(mean0: float, std0: float, mean1: float, std1: float, delta: float) -> float:
    """The smallest ε >= 0 at which N(mean0, std0²) and N(mean1, std1²) are (ε, δ)-indistinguishable.

    A zero standard deviation with distinct means is ∞ (a point mass the other hardly reaches);
    with equal means and both zero, 0.
    """
    delta = check_delta(delta, allow_zero=False)
    if std0 <= 0 or std1 <= 0:
        return 0.0 if (mean0 == mean1 and std0 == std1) else math.inf

    def log_delta(eps: float) -> float:
        return max(_log_hockey_stick(eps, mean1, std1, mean0, std0), _log_hockey_stick(eps, mean0, std0, mean1, std1))

    return _smallest_epsilon(log_delta, delta)
