"""Amplification by Poisson subsampling for any mechanism with a Rényi-DP curve, and a ledger step that carries one.

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
:data:`CURVE_ORDERS` (integer: (1) needs integer orders, and 2α, 2α − 1 are then integers too).

**Modelling assumption, shared with GDPFed's continuous groups.** Pairing the zero-out dataset with
(1)'s add/remove structure treats the sum's noise as the aggregate's, present whoever is sampled, as
:mod:`privacy.mechanisms.group_share` does for σ_m: a GDPFed group sum always holds exactly r_m
shares (the sample has a fixed size and the sum is released only with all r_m), but which clients
hold them is what the sampling hides. GDPFed samples r_m of |G_m| without replacement and charges
Poisson sampling at q_m = r_m/|G_m|, the paper's accounting; this module keeps that convention.

**The step** (:class:`DDGPoissonStep`): a distributed discrete Gaussian sum (Kairouz, Liu & Steinke,
ICML 2021; :mod:`privacy.distributed_discrete_gaussian`, eq. (1) there) at the sum's parameters (σ² per
share, B², d', the share counts), sampled at rate q, released ``count`` times. KLS's bound falls as
n·σ² grows (every term of their eq. (1) has n·σ² in a denominator) and rises with τ, which grows with
n: it is evaluated at the fewest shares a released sum can hold, n_min (the sum's floor, the smallest
sum the client accepts), with τ at the most, n_max, which bounds every count in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from privacy.accountants import ADD_REMOVE, REPLACE_ONE, CurveStep, curve_orders

__all__ = [
    "CURVE_ORDERS",
    "DDG_POISSON_KIND",
    "DDGPoissonStep",
    "curve_step_from_dict",
    "poisson_subsampled_rdp",
    "replace_one_subsampled_rdp",
]

#: The orders a ledger holding a curve step converts at: the integer orders >= 2 of the RDP accountant's
#: grid, up to 256 ((2) evaluates (1) at 2α, so the base curve is needed up to 512).
CURVE_ORDERS: tuple[int, ...] = curve_orders()

#: The ``kind`` of a :class:`DDGPoissonStep` in a ledger file.
DDG_POISSON_KIND = "ddg-poisson"


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


@dataclass(frozen=True)
class DDGPoissonStep(CurveStep):
    """``count`` releases of a distributed discrete Gaussian sum whose members are Poisson-sampled at rate q.

    Attributes
    ----------
    local_sigma_sq : float
        σ² of each share's N_Z(0, σ²) per coordinate, in the sum's integer units (an integer, or a
        multiple of 2⁻²⁰ below 1: exact in a float).
    norm_bound_sq : int
        B²: every rounded input has ‖x̃‖₂² <= B², enforced exactly.
    padded_dim : int
        d', the noised coordinates.
    min_shares, max_shares : int
        The fewest shares a released sum holds (the sum's floor: KLS's bound is evaluated there) and the
        most (τ is evaluated there).
    sample_rate : float
        q in (0, 1], each member's sampling probability per release.
    count : int
        Releases charged.
    """

    local_sigma_sq: float
    norm_bound_sq: int
    padded_dim: int
    min_shares: int
    max_shares: int
    sample_rate: float
    count: int

    def __post_init__(self) -> None:
        if not (isinstance(self.local_sigma_sq, (int, float)) and 0.25 <= self.local_sigma_sq < math.inf):
            raise ValueError(f"local_sigma_sq must be a finite number >= 1/4; found {self.local_sigma_sq!r}")
        for name, low in (("norm_bound_sq", 1), ("padded_dim", 1), ("min_shares", 1), ("count", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; found {value!r}")
        if isinstance(self.max_shares, bool) or not isinstance(self.max_shares, int) \
                or self.max_shares < self.min_shares:
            raise ValueError(f"max_shares must be an integer >= min_shares = {self.min_shares}; "
                             f"found {self.max_shares!r}")
        if self.padded_dim & (self.padded_dim - 1):
            raise ValueError(f"padded_dim must be a power of 2; found {self.padded_dim}")
        if not (isinstance(self.sample_rate, (int, float)) and 0.0 < self.sample_rate <= 1.0):
            raise ValueError(f"sample_rate must lie in (0, 1]; found {self.sample_rate!r}")

    @property
    def key(self) -> tuple[Any, ...]:
        """Everything but the count: two steps with the same key merge (their counts add)."""
        return (DDG_POISSON_KIND, float(self.local_sigma_sq), self.norm_bound_sq, self.padded_dim, self.min_shares,
                self.max_shares, float(self.sample_rate))

    def with_count(self, count: int) -> DDGPoissonStep:
        """The same mechanism released ``count`` times."""
        return DDGPoissonStep(self.local_sigma_sq, self.norm_bound_sq, self.padded_dim, self.min_shares,
                              self.max_shares, self.sample_rate, count)

    def rdp(self, orders: tuple[int, ...]) -> np.ndarray:
        """Eq. (2) of one release at ``orders`` (integer orders >= 2)."""
        return np.asarray(_ddg_poisson_rdp(self.key, orders))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (what a ledger file holds)."""
        return {"kind": DDG_POISSON_KIND, "local_sigma_sq": float(self.local_sigma_sq),
                "norm_bound_sq": self.norm_bound_sq, "padded_dim": self.padded_dim, "min_shares": self.min_shares,
                "max_shares": self.max_shares, "sample_rate": float(self.sample_rate), "count": self.count}

    def describe(self) -> str:
        """One line for messages."""
        return (f"discrete Gaussian sum (sigma^2={self.local_sigma_sq:g}, B^2={self.norm_bound_sq}, "
                f"d'={self.padded_dim}, "
                f"n in [{self.min_shares}, {self.max_shares}]) Poisson-sampled at q={self.sample_rate:g}, "
                f"{self.count} releases")


@lru_cache(maxsize=256)
def _ddg_poisson_rdp(key: tuple[Any, ...], orders: tuple[int, ...]) -> tuple[float, ...]:
    from privacy.distributed_discrete_gaussian import rdp_of_sum, sensitivities

    _, sigma_sq, norm_bound_sq, padded_dim, n_min, n_max, rate = key

    def curve(relation: str) -> Callable[[np.ndarray], np.ndarray]:
        l2, l1 = sensitivities(norm_bound_sq, padded_dim, relation)

        def at(alpha: np.ndarray) -> np.ndarray:
            return rdp_of_sum(alpha, l2_sensitivity=l2, l1_sensitivity=l1, local_sigma_sq=sigma_sq, dim=padded_dim,
                              min_shares=n_min, max_shares=n_max)
        return at

    rdp = replace_one_subsampled_rdp(orders, curve(ADD_REMOVE), curve(REPLACE_ONE), rate)
    return tuple(float(x) for x in rdp)


def curve_step_from_dict(state: Any, name: str) -> CurveStep:
    """Read :meth:`DDGPoissonStep.to_dict`; ValueError naming the entry if it is malformed."""
    fields = ("kind", "local_sigma_sq", "norm_bound_sq", "padded_dim", "min_shares", "max_shares", "sample_rate",
              "count")
    if not isinstance(state, dict) or set(state) != set(fields) or state.get("kind") != DDG_POISSON_KIND:
        raise ValueError(f"ledger '{name}' must be a (sigma, q, steps) triple or a {DDG_POISSON_KIND!r} step with "
                         f"{list(fields)}; found {state!r}")
    try:
        return DDGPoissonStep(state["local_sigma_sq"], state["norm_bound_sq"], state["padded_dim"], state["min_shares"],
                              state["max_shares"], state["sample_rate"], state["count"])
    except ValueError as exc:
        raise ValueError(f"ledger '{name}': {exc}") from None
