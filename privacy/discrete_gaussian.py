"""Exact samples of the discrete Gaussian N_Z(0, σ²), fed by a client's noise source.

The discrete Gaussian with parameter σ² > 0 is the distribution on the integers with

    P[X = x] = exp(−x²/(2σ²)) / Σ_{y∈Z} exp(−y²/(2σ²)),    x ∈ Z.                       (1)

Its variance is slightly below σ² (Canonne, Kamath & Steinke, "The Discrete Gaussian for
Differential Privacy", NeurIPS 2020, hereafter CKS), and it is σ²-subgaussian (CKS §2).

**The algorithm** is CKS's:

- Algorithm 1, Bernoulli(exp(−γ)) for γ ∈ [0, 1]: K ← 1; while Bernoulli(γ/K) = 1, K ← K + 1;
  return 1 if K is odd (von Neumann). Only the law of K matters, P[K > k] = γᵏ/k!, so we
  draw K by inversion from *one* uniform V: K − 1 = #{k >= 1 : V < γᵏ/k!} (the thresholds
  decrease), and P[K odd] = Σ_k even (γᵏ/k! − γᵏ⁺¹/(k+1)!) = exp(−γ). For γ > 1,
  exp(−γ) = exp(−γ/ℓ)^ℓ for an integer ℓ >= γ: ℓ independent draws at γ/ℓ, all of which
  must be 1 (CKS §5.1).
- Algorithm 2, the discrete Laplace with P[Y = y] ∝ exp(−|y|/t), t a positive integer:
  U uniform on {0, …, t−1}; reject unless Bernoulli(exp(−U/t)); V ← the number of
  Bernoulli(exp(−1)) successes before the first failure; X ← U + t·V; a fair sign bit B;
  reject the pair (B = 1, X = 0); return (1 − 2B)·X.
- Algorithm 3, the discrete Gaussian: t ← ⌊σ⌋ + 1; draw Y from Algorithm 2 and accept it
  with probability exp(−(|Y| − σ²/t)²/(2σ²)); repeat until accepted.

**Vectorised, still exact.** Every step above runs on numpy arrays of candidates at once,
and the accepted candidates, taken in order, are independent draws of (1). The one place
where arithmetic could leak is a comparison V < a of a uniform with a rational threshold
(a = γᵏ/k! in Algorithm 1):

    Let w be a uniform integer in [0, 2⁵³) (53 random bits) and V = (w + W)·2⁻⁵³, with
    W ∈ [0, 1) uniform and not yet drawn. If a float â is known with |â − a| <= e (a
    proven bound, below), then w + 1 <= (â − e)·2⁵³ implies V < a, and w >= (â + e)·2⁵³
    implies V >= a: decided without W. Otherwise (probability about 2e + 2⁻⁵², some
    10⁻¹³ here) the whole draw is finished in ``Fraction`` arithmetic, W's bits drawn 53
    at a time until every threshold it meets is decided.

So every draw is exactly what the algorithm prescribes: the float only decides *when* W
would not matter, with a margin proved from IEEE-754's correctly rounded +, −, ×, ÷ (numpy
never fuses or reorders them, and no transcendental function is called). At γ = 1 the
thresholds ⌊2⁵³/k!⌋ are integers and no float is involved. The margins used:

- γ = U/t (Algorithm 2): ĝ = fl(U/t) has |ĝ − γ| <= u, u = 2⁻⁵³. For |ĝ − γ| <= e <= 1
  the thresholds â_k = fl(fl(â_{k−1}·ĝ)/k) satisfy |â_k − γᵏ/k!| <= (1+e)^{k−1}e/(k−1)!
  + 2.01k·2^k/k!·u <= 2e + 8.1u, and rounding (â_k ± margin) costs <= 4.1u more: the
  margin used is 2e + 16u.
- The acceptance exponent of Algorithm 3, γ = (|Y| − c)²/(2σ²) with c = σ²/t, is computed
  as d̂ = fl(j − ĉ), j = |Y| − ⌊c⌋ (an exact integer), ĉ = fl(c − ⌊c⌋) (so there is no
  cancellation), γ̂ = fl(fl(d̂²)/fl(2σ²)). Expanding the five roundings,
  |γ̂ − γ| <= u·(8γ + √(2γ)/σ) + O(u²); the code uses e_γ = u·(16γ̂ + 4√(2γ̂ + 2)/σ + 16),
  which dominates it for every σ² in [2⁻³⁰, 2⁶⁰] (the O(u²) term is below u·2⁻⁶⁰ there).
  ℓ = ⌈(γ̂ + e_γ)(1 + 4u) + 4u⌉ >= γ, and fl(γ̂/ℓ) is within e_γ/ℓ + 2u of γ/ℓ.

Candidates whose |Y| reaches 2⁵⁰ or whose γ̂ reaches 2⁵² (probability below e^{−2800} for
every allowed σ) are accepted or rejected entirely in ``Fraction`` arithmetic.

**Randomness.** The bits are the source's own: :meth:`privacy.randomness.NoiseSource.uniform`
returns k·2⁻⁵³ for a uniform 53-bit integer k in all three sources (AES-CTR words shifted
right by 11, or numpy's ``Generator.random``), so no edit of the sources is needed. The
sampler checks that every draw lies on that grid and refuses a source that does not (the
check cannot see a source that fills the grid with fewer random bits). With the default
``"csprng"`` source nothing about the noise is predictable without breaking AES; with
``"seeded"`` it is reproducible (tests only).

**Not covered.** The distribution is exact; the *running time* is not constant (rejection
sampling), so an observer timing the client learns aggregate counts of rejections over a
whole batch (timing attacks on samplers: Jin et al., IEEE S&P 2022).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from privacy.randomness import NoiseSource

__all__ = [
    "MAX_SIGMA_SQ",
    "MIN_SIGMA_SQ",
    "as_sigma_sq",
    "discrete_gaussian",
]

#: Largest σ² accepted (σ <= 2³⁰): keeps t, σ²/t and every likely |Y| far below 2⁵³.
MAX_SIGMA_SQ = Fraction(2**60)

#: Smallest σ² accepted (σ >= 2⁻¹⁵); below it N_Z(0, σ²) is 0 with probability 1 − 10⁻¹⁰⁰⁰⁰⁰.
MIN_SIGMA_SQ = Fraction(1, 2**30)

_U = 2.0**-53  # unit round-off of float64
_TWO_53 = 2**53
_TWO_53F = float(_TWO_53)
_HALF_53F = float(2**52)
_LARGE = 2**50  # |Y| from here on: the acceptance test runs in Fraction arithmetic

_Exact = Callable[[int], Fraction]


def as_sigma_sq(value: Any) -> Fraction:
    """σ² as an exact ``Fraction``, validated.

    ``int`` and ``Fraction`` are taken as they are; a ``float`` as the exact binary value
    it holds (``Fraction(0.1)`` is not 1/10: pass ``Fraction(1, 10)`` for that).

    Raises
    ------
    ValueError
        If ``value`` is not a real number (``bool`` included), is NaN or infinite, or lies
        outside [:data:`MIN_SIGMA_SQ`, :data:`MAX_SIGMA_SQ`].
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"sigma_sq must be an int, Fraction or float; found {value!r}")
    if isinstance(value, numbers.Rational):
        out = Fraction(int(value.numerator), int(value.denominator))
    else:
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ValueError(f"sigma_sq must be finite; found {value!r}")
        out = Fraction(as_float)
    if not MIN_SIGMA_SQ <= out <= MAX_SIGMA_SQ:
        raise ValueError(f"sigma_sq must lie in [2^-30, 2^60] (a positive variance); found {value!r}")
    return out


def discrete_gaussian(shape: int | tuple[int, ...], sigma_sq: int | Fraction | float,
                      source: NoiseSource) -> np.ndarray:
    """Independent exact draws of N_Z(0, σ²) (eq. 1), as an ``int64`` array of ``shape``.

    Parameters
    ----------
    shape : int or tuple of int
        The shape of the output.
    sigma_sq : int, Fraction or float
        σ², exactly (see :func:`as_sigma_sq`). It is the parameter of eq. (1), not the
        variance of the output, which is slightly smaller.
    source : NoiseSource
        Where the random bits come from (a client's ``"csprng"`` in production).

    Returns
    -------
    numpy.ndarray
        ``int64`` samples, exactly distributed as eq. (1) (module docstring).

    Raises
    ------
    ValueError
        On an invalid ``sigma_sq`` or ``shape``, or a source whose uniforms are not on
        the 2⁻⁵³ grid.
    """
    s2 = as_sigma_sq(sigma_sq)
    dims: tuple[int, ...] = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0 for n in dims):
        raise ValueError(f"shape must be non-negative integers; found {shape!r}")
    count = math.prod(int(n) for n in dims)
    out = np.empty(count, dtype=np.int64)
    t = math.isqrt(s2.numerator // s2.denominator) + 1  # ⌊σ⌋ + 1 (⌊√x⌋ = isqrt(⌊x⌋))
    rate = 0.45 if t == 1 else 0.6 if t <= 3 else 0.75  # Algorithm 3 accepts 46% (σ = 0.1) to 76% (large σ)
    filled = 0
    while filled < count:
        need = count - filled
        candidates = _discrete_laplace(t, math.ceil(1.05 * need / rate) + 16, source)
        accepted = candidates[_gaussian_acceptance(candidates, s2, t, source)]
        rate = max(0.05, accepted.size / candidates.size)
        take = accepted[:need]
        out[filled:filled + take.size] = take
        filled += take.size
    return out.reshape(tuple(int(n) for n in dims))


# ---------------------------------------------------------------------------------------
# Algorithm 3's acceptance test and Algorithm 2
# ---------------------------------------------------------------------------------------

def _gaussian_acceptance(y: np.ndarray, sigma_sq: Fraction, t: int, source: NoiseSource) -> np.ndarray:
    """Bernoulli(exp(−(|Y| − σ²/t)²/(2σ²))) for each candidate Y (CKS Algorithm 3)."""
    c = sigma_sq / t
    c_int = math.floor(c)
    c_frac = float(c - c_int)
    two_s2 = float(2 * sigma_sq)
    sigma = math.sqrt(float(sigma_sq))
    y_abs = np.abs(y)

    def exact(i: int) -> Fraction:
        return (int(y_abs[i]) - c) ** 2 / (2 * sigma_sq)

    accept = np.zeros(y.size, dtype=bool)
    near = np.flatnonzero(y_abs < _LARGE)
    diff = (y_abs[near] - c_int).astype(np.float64) - c_frac
    g_hat = diff * diff / two_s2
    small = g_hat < _TWO_53F / 2  # ℓ must fit an int64
    regular, g_hat = near[small], g_hat[small]
    g_err = _U * (16.0 * g_hat + 4.0 * np.sqrt(2.0 * g_hat + 2.0) / sigma + 16.0)
    accept[regular] = _bernoulli_exp_neg(g_hat, g_err, _at(exact, regular), source)
    rare = np.ones(y.size, dtype=bool)
    rare[regular] = False
    for i in np.flatnonzero(rare):  # |Y| >= 2⁵⁰ or γ̂ >= 2⁵² (rarer than e^{−2800}): Fraction arithmetic
        accept[i] = _bernoulli_exp_neg_exact(exact(int(i)), source)
    return accept


def _discrete_laplace(t: int, count: int, source: NoiseSource) -> np.ndarray:
    """``count`` exact draws with P[Y = y] ∝ exp(−|y|/t) (CKS Algorithm 2, s = 1).

    U and the sign B come from one uniform R on {0, …, 2t − 1}: U = R mod t, B = 1{R >= t}
    are independent and uniform.
    """
    out = np.empty(count, dtype=np.int64)
    filled = 0
    while filled < count:
        m = math.ceil((count - filled) / 0.62) + 16  # an attempt succeeds with probability >= 0.63
        r = _uniform_below(2 * t, m, source)
        negative = r >= t
        u = r - t * negative

        def exact_u(i: int, u: np.ndarray = u) -> Fraction:
            return Fraction(int(u[i]), t)

        keep = _bernoulli_exp_neg_unit(u / t, np.full(m, _U), exact_u, source)
        u, negative = u[keep], negative[keep]
        v = np.zeros(u.size, dtype=np.int64)
        running = np.arange(u.size)
        while running.size:  # V: successes of Bernoulli(exp(−1)) before the first failure
            running = running[_bernoulli_exp_minus_one(running.size, source)]
            v[running] += 1
        x = u + t * v
        valid = ~(negative & (x == 0))
        y = np.where(negative, -x, x)[valid]
        take = y[:count - filled]
        out[filled:filled + take.size] = take
        filled += take.size
    return out


# ---------------------------------------------------------------------------------------
# Bernoulli(exp(−γ)) (CKS Algorithm 1), one uniform per draw
# ---------------------------------------------------------------------------------------

def _bernoulli_exp_neg(g_hat: np.ndarray, g_err: np.ndarray, g_exact: _Exact, source: NoiseSource) -> np.ndarray:
    """Bernoulli(exp(−γ_i)) for γ_i >= 0 known as ĝ_i ± e_i (exactly as ``g_exact(i)``).

    exp(−γ) = exp(−γ/ℓ)^ℓ with ℓ an integer >= γ: the ℓ factors are drawn one round at a
    time, and a candidate stops at its first failure.
    """
    ell = np.maximum(np.ceil((g_hat + g_err) * (1.0 + 4.0 * _U) + 4.0 * _U), 1.0)
    ell_int = ell.astype(np.int64)
    alive = np.ones(g_hat.size, dtype=bool)
    pending = np.arange(g_hat.size)
    step = 0
    while pending.size:
        parts = ell[pending]
        ok = _bernoulli_exp_neg_unit(g_hat[pending] / parts, g_err[pending] / parts + 2.0 * _U,
                                     _divided(g_exact, pending, ell_int), source)
        alive[pending[~ok]] = False
        step += 1
        pending = pending[ok & (ell_int[pending] > step)]
    return alive


def _bernoulli_exp_neg_unit(g_hat: np.ndarray, g_err: np.ndarray, g_exact: _Exact,
                            source: NoiseSource) -> np.ndarray:
    """Bernoulli(exp(−γ_i)) for γ_i in [0, 1] from one uniform V_i each (CKS Algorithm 1).

    Algorithm 1 stops at K with P[K > k] = γᵏ/k!, so K − 1 = #{k >= 1 : V < γᵏ/k!} has its
    law (the thresholds decrease), and the answer is 1{K odd}. The thresholds are computed
    as â_k = fl(fl(â_{k−1}·ĝ)/k), within 2e + 16u of γᵏ/k! for |ĝ − γ| <= e <= 1 once the
    comparison's own rounding is counted (module docstring). A V too close to a threshold
    for that margin is finished in exact arithmetic (:class:`_LazyUniform`).
    """
    n = g_hat.size
    result = np.zeros(n, dtype=bool)
    index, w = np.arange(n), _words53(source, n)
    g, err, a = g_hat, 2.0 * g_err + 16.0 * _U, np.ones(n)
    k = 1
    while index.size:  # every candidate still here has k − 1 thresholds above its V
        a = a * g / k
        surely_below = w + 1.0 <= (a - err) * _TWO_53F  # V < a_k
        surely_above = w >= (a + err) * _TWO_53F  # V >= a_k: K = k
        result[index[surely_above]] = k % 2 == 1
        unsure = ~(surely_below | surely_above)
        if unsure.any():
            for i, wi in zip(index[unsure], w[unsure], strict=True):
                result[i] = _exp_neg_unit_exact(g_exact(int(i)), _LazyUniform(int(wi), source))
        index, w, g, err, a = (x[surely_below] for x in (index, w, g, err, a))
        k += 1
    return result


def _bernoulli_exp_minus_one(count: int, source: NoiseSource) -> np.ndarray:
    """``count`` draws of Bernoulli(exp(−1)): Algorithm 1 at γ = 1 with integer thresholds.

    V < 1/k! ⟺ w + W < 2⁵³/k!: true if w < ⌊2⁵³/k!⌋, false if w > ⌊2⁵³/k!⌋; only
    w = ⌊2⁵³/k!⌋ with k! ∤ 2⁵³ (probability 2⁻⁵³ each) needs W, in exact arithmetic.
    """
    w = _words53(source, count)
    # K − 1 = #{k : ⌊2⁵³/k!⌋ > w}; the ascending array holds ⌊2⁵³/k!⌋ for k = 18, …, 1, and
    # ⌊2⁵³/k!⌋ = 0 for k >= 19, so w = 0 is among the values that need W
    above = len(_INVERSE_FACTORIALS) - np.searchsorted(_INVERSE_FACTORIALS, w, side="right")
    result: np.ndarray = above % 2 == 0
    for i in np.flatnonzero(np.isin(w, _INEXACT_INVERSE_FACTORIALS)):
        result[i] = _exp_neg_unit_exact(Fraction(1), _LazyUniform(int(w[i]), source))
    return result


def _exp_neg_unit_exact(gamma: Fraction, v: _LazyUniform) -> bool:
    """1{K odd} for K − 1 = #{k >= 1 : V < γᵏ/k!}, γ in [0, 1], compared exactly."""
    below, a, k = 0, Fraction(1), 1
    while True:
        a = a * gamma / k
        if not v.below(a):
            return below % 2 == 0
        below += 1
        k += 1


def _bernoulli_exp_neg_exact(gamma: Fraction, source: NoiseSource) -> bool:
    """Bernoulli(exp(−γ)) for a rational γ >= 0, in Fraction arithmetic, Bernoulli by Bernoulli.

    CKS Algorithm 1 as written (K ← K + 1 while Bernoulli(γ/K)), ⌊γ⌋ times at γ = 1 and
    once at γ − ⌊γ⌋: an implementation independent of the vectorised one.
    """
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _bernoulli_exp_neg_unit_exact(Fraction(1), source):
            return False
    return _bernoulli_exp_neg_unit_exact(gamma - whole, source)


def _bernoulli_exp_neg_unit_exact(gamma: Fraction, source: NoiseSource) -> bool:
    k = 1
    while _bernoulli_exact(gamma / k, source):
        k += 1
    return k % 2 == 1


def _bernoulli_exact(p: Fraction, source: NoiseSource) -> bool:
    """Bernoulli(p) for a rational p: a uniform integer below p's denominator is below its numerator."""
    if p <= 0:
        return False
    if p >= 1:
        return True
    return _uniform_int_below(p.denominator, source) < p.numerator


class _LazyUniform:
    """V = (w + W)·2⁻⁵³ uniform on [0, 1), whose further bits are drawn only when needed."""

    def __init__(self, prefix: int, source: NoiseSource) -> None:
        self._value, self._bits, self._source = prefix, 53, source

    def below(self, a: Fraction) -> bool:
        """1{V < a}, exactly: refine V 53 bits at a time until a lies outside its interval."""
        while True:
            scaled = a * (1 << self._bits)  # V·2^bits lies in [value, value + 1)
            if self._value + 1 <= scaled:
                return True
            if self._value >= scaled:
                return False
            self._value = (self._value << 53) | int(_words53(self._source, 1)[0])
            self._bits += 53


# ---------------------------------------------------------------------------------------
# Random integers from the source
# ---------------------------------------------------------------------------------------

def _words53(source: NoiseSource, count: int) -> np.ndarray:
    """``count`` uniform integers in [0, 2⁵³), as float64 (exact), from ``source.uniform``."""
    scaled: np.ndarray = np.asarray(source.uniform(count), dtype=np.float64) * _TWO_53F
    if scaled.shape != (count,) or (count and not (np.array_equal(scaled, np.floor(scaled))
                                                   and scaled.min() >= 0 and scaled.max() < _TWO_53F)):
        raise ValueError(f"noise source {getattr(source, 'name', source)!r} must draw uniforms k·2^-53 "
                         "(53 random bits each), as every privet source does")
    return scaled


def _uniform_below(bound: int, count: int, source: NoiseSource) -> np.ndarray:
    """``count`` uniform integers in [0, bound) (bound <= 2⁵²), by rejection from 53-bit words."""
    limit = float((_TWO_53 // bound) * bound)
    out = np.empty(count, dtype=np.int64)
    filled = 0
    while filled < count:
        w = _words53(source, count - filled)
        w = w[w < limit]
        out[filled:filled + w.size] = w.astype(np.int64) % bound
        filled += w.size
    return out


def _uniform_int_below(bound: int, source: NoiseSource) -> int:
    """One uniform integer in [0, bound) for any bound >= 1, by rejection on fresh bits."""
    bits = (bound - 1).bit_length()
    if bits == 0:
        return 0
    chunks = -(-bits // 53)
    while True:
        value = 0
        for w in _words53(source, chunks):
            value = (value << 53) | int(w)
        value &= (1 << bits) - 1
        if value < bound:
            return value


#: ⌊2⁵³/k!⌋ for k = 18, …, 1 (ascending; 19! > 2⁵³), and those that are not exact.
_INVERSE_FACTORIALS = np.array([float(_TWO_53 // math.factorial(k)) for k in range(18, 0, -1)])
_INEXACT_INVERSE_FACTORIALS = np.array([0.0] + [float(_TWO_53 // math.factorial(k)) for k in range(18, 0, -1)
                                                 if _TWO_53 % math.factorial(k)])


# ---------------------------------------------------------------------------------------
# Closures mapping a position in a sub-array back to an exact value
# ---------------------------------------------------------------------------------------

def _at(g_exact: _Exact, index: np.ndarray) -> _Exact:
    return lambda i: g_exact(int(index[i]))


def _divided(g_exact: _Exact, index: np.ndarray, parts: np.ndarray) -> _Exact:
    return lambda i: g_exact(int(index[i])) / int(parts[index[i]])
