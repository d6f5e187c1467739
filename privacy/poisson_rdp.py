"""A ledger step that carries a Rényi-DP curve: a distributed discrete Gaussian sum, Poisson-sampled.

The amplification is :mod:`privacy.subsampled_rdp` (eq. (1) there, Zhu & Wang's general bound; eq. (2), its
replace-one form through the zero-out neighbour).

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
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from privacy.accountants import ADD_REMOVE, REPLACE_ONE, CurveStep, curve_orders
from privacy.subsampled_rdp import poisson_subsampled_rdp, replace_one_subsampled_rdp

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
    from privacy.ddg_accounting import rdp_of_sum, sensitivities

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
