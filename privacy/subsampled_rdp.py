"""Amplification by Poisson subsampling for any mechanism with a Rényi-DP curve: eqs. (1) and (2).

**The general bound** (Zhu & Wang, "Poisson Subsampled Rényi Differential Privacy", ICML 2019,
Theorem 6, the "general upper bound"; the authors' implementation is ``autodp``'s
``rdp_acct.anaRDPacct.compose_poisson_subsampled_mechanisms1``). Let M obey (α, ε(α))-RDP under
add/remove neighbours for every integer α >= 2, and let M∘Poisson_γ run M on the subset that holds each
unit independently with probability γ. For every integer α >= 2, M∘Poisson_γ obeys (α, ε'(α))-RDP with

    ε'(α) <= 1/(α−1) · log[ (1−γ)^{α−1}(αγ − γ + 1) + C(α,2) γ² (1−γ)^{α−2} e^{ε(2)}
                              + 3 Σ_{ℓ=3}^{α} C(α,ℓ) γ^ℓ (1−γ)^{α−ℓ} e^{(ℓ−1)ε(ℓ)} ].          (1)

The factor 3 pays for the direction D_α(M(X) ‖ M(X ∪ {x})), for which the binomial expansion of the
other direction (coefficients 1, exact for that direction) is not a bound; the paper's abstract states
the price, "optimal up to an additive constant of log(3)/(α−1)". (autodp's general routine uses
coefficient 1 throughout, the form of the paper's tight bound under its extra condition; we keep the
theorem's 3, which is never smaller.) (1) is also capped by ε(α) itself: Rényi divergence is jointly
quasi-convex, and (1−γ)P + γQ against P mixes pairs each within ε(α) (:func:`poisson_subsampled_rdp`).

**The ledger's relation is replace-one** (:mod:`privacy.accountants`): the neighbouring dataset has the
same clients, one client's data replaced by any other. (1) is an add/remove result, so a replace-one
step goes through the dataset in which the replaced client's data is *zeroed* (it is still sampled and
its noise share still enters the sum, KLS's and TFF's "zero-out" neighbour), with the weak triangle
inequality of Rényi divergence (Mironov 2017, Prop. 11, with p = q = 2), exactly as
:func:`privacy.accountants._replace_one_rdp_curve` treats the subsampled Gaussian of every other GDPFed
group:

    ρ_rep(α) <= min{ ρ_full(α),  (α − ½)/(α − 1) · ε'_0(2α) + ε'_0(2α − 1) },                 (2)

where ε'_0 is (1) applied to the base curve at the zero-out sensitivities and ρ_full the base curve at
the replace-one sensitivities, unsampled (subsampling never hurts, by joint quasi-convexity). Both are
per release; T releases compose by adding (2) T times. The orders (2) is evaluated at are
:data:`privacy.poisson_rdp.CURVE_ORDERS` (integer: (1) needs integer orders, and 2α, 2α − 1 are then integers too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["poisson_subsampled_rdp", "replace_one_subsampled_rdp"]


def poisson_subsampled_rdp(orders: Sequence[int], base: Callable[[np.ndarray], np.ndarray],
                           sample_rate: float) -> np.ndarray:
    """Eq. (1): add/remove RDP of a Poisson-subsampled mechanism at integer orders >= 2, capped by ε(α).

    Parameters
    ----------
    orders : sequence of int
        Integer Rényi orders α >= 2.
    base : callable
        ε(·): the base mechanism's add/remove RDP, evaluated on an array of integer orders 2 … max(orders).
    sample_rate : float
        γ in (0, 1]; at γ = 1 the result is ``base`` itself.

    Raises
    ------
    ValueError
        On an order that is not an integer >= 2, or γ outside (0, 1].
    """
    from scipy.special import gammaln

    alphas = [int(a) for a in orders]
    if any(a < 2 or a != b for a, b in zip(alphas, orders, strict=True)):
        raise ValueError("the Poisson-subsampled bound needs integer orders >= 2")
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must lie in (0, 1]; found {sample_rate!r}")
    top = max(alphas)
    eps = np.asarray(base(np.arange(2, top + 1, dtype=np.float64)), dtype=np.float64)  # ε(ℓ), ℓ = 2 … top
    if eps.shape != (top - 1,) or np.any(np.isnan(eps)) or np.any(eps < 0):
        raise ValueError("the base RDP curve must be a non-negative number at every order")
    if sample_rate == 1.0:
        return np.asarray([eps[a - 2] for a in alphas])
    q, log_q, log_1q = sample_rate, math.log(sample_rate), math.log1p(-sample_rate)
    out = np.empty(len(alphas))
    for i, a in enumerate(alphas):
        ls = np.arange(2, a + 1, dtype=np.float64)
        log_terms = gammaln(a + 1.0) - gammaln(ls + 1.0) - gammaln(a - ls + 1.0) + ls * log_q \
            + (a - ls) * log_1q + (ls - 1.0) * eps[: a - 1]
        weights = np.full(ls.size, 3.0)
        weights[0] = 1.0  # ℓ = 2
        head = (a - 1.0) * log_1q + math.log1p((a - 1.0) * q)  # log (1−γ)^{α−1}(αγ − γ + 1) <= 0
        if float(np.max(log_terms)) < 0.0:  # the sum is 1 + something small: log1p keeps its digits
            total = math.log1p(math.expm1(head) + float(np.sum(weights * np.exp(log_terms))))
        else:
            total = _log_weighted_sum(np.concatenate([[head], log_terms]), np.concatenate([[1.0], weights]))
        out[i] = min(total / (a - 1.0), float(eps[a - 2]))
    return out


def _log_weighted_sum(log_terms: np.ndarray, weights: np.ndarray) -> float:
    """Return log Σ w_i e^{x_i} for positive weights, stable (the largest term factored out)."""
    top = float(np.max(log_terms))
    if not math.isfinite(top):
        return top
    return top + math.log(float(np.sum(weights * np.exp(log_terms - top))))


def replace_one_subsampled_rdp(orders: Sequence[int], zero_out: Callable[[np.ndarray], np.ndarray],
                               replace_one: Callable[[np.ndarray], np.ndarray], sample_rate: float) -> np.ndarray:
    """Eq. (2): replace-one RDP of the Poisson-subsampled mechanism at integer orders >= 2.

    ``zero_out`` is the base curve at the zero-out (add/remove) sensitivities, ``replace_one`` the base
    curve at the replace-one sensitivities; at γ = 1 the result is ``replace_one`` itself.
    """
    a = np.asarray([int(x) for x in orders], dtype=np.float64)
    full = np.asarray(replace_one(a), dtype=np.float64)
    if sample_rate >= 1.0:
        return full
    doubled = poisson_subsampled_rdp([int(x) for x in 2 * a], zero_out, sample_rate)
    doubled_less_one = poisson_subsampled_rdp([int(x) for x in 2 * a - 1], zero_out, sample_rate)
    triangle = (a - 0.5) / (a - 1.0) * doubled + doubled_less_one
    return np.asarray(np.minimum(triangle, full), dtype=np.float64)
