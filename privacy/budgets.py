"""Per-client privacy budgets ε_i, drawn from named distributions.

A budget is evaluated deterministically per (seed, client id): the draw for client i uses
its own generator, ``np.random.default_rng(np.random.SeedSequence([|seed|, seed < 0, i,
BUDGET_STREAM]))``, so every process (server, any client, a later run) computes the same
ε_i without coordination, and client i's budget does not depend on how many other
clients were drawn before it. ``BUDGET_STREAM`` separates this stream from any other
stream seeded by the same (seed, client id).

The distributions are PFA's Table 1 (Liu et al., PVLDB 15(4) 2022, §5.1), verbatim:

============  ================================================================
Uniform       U(1.0, 10.0)  (here U(epsilon_min, epsilon_max), defaults 1 and 10)
Gauss         N(3.0, 1.0)
Pareto        "Pareto distribution" (parameters not given; see below)
MixGauss1     0.9·N(0.1, 0.01) + 0.1·N(10.0, 0.1)
MixGauss2     0.9·N(0.5, 0.01) + 0.1·N(10.0, 0.1)
MixGauss3     0.9·N(1.0, 0.1)  + 0.1·N(10.0, 0.1)
MixGauss4     0.5·N(0.1, 0.01) + 0.4·N(1.0, 0.1) + 0.1·N(10.0, 1.0)
============  ================================================================

Choices where the paper is silent (all documented in :func:`budget_for`):

* N(μ, s): s is the **standard deviation**, as in the authors' code (``np.random.normal``);
  the spreads in the paper's Fig. 9 agree.
* Pareto: scale x_m = 0.5 and shape α = 1.0, the authors' ``pareto1.txt``:
  ε = x_m (1 + Lomax(α)), i.e. P(ε > x) = x_m / x for x >= x_m (median 1.0, heavy tail).
* MixGauss3 follows the text (second component std 0.1); the authors' code file used 1.0.
* The paper states no clipping range, and its code clips nothing. A draw below
  :data:`MIN_BUDGET` (only plausible for Gauss: P(N(3, 1) < 0.01) ≈ 0.14 %) is rejected
  and redrawn, i.e. the distribution is truncated to [MIN_BUDGET, ∞); no upper cap.
* The code redraws a whole mixture list until some client is "public" (ε above a
  threshold); per-client draws cannot do this, so a small federation may have no
  high-ε client (MixGauss1, 10 clients: 0.9¹⁰ ≈ 35 %).

Two more distributions: ``"constant"`` gives every client ``epsilon``; ``"groups"`` is
GDPFed's setting (Table 1 of that paper): clients split into len(groups) contiguous
groups by id, equal or in a given ratio (:func:`group_of`); group g's clients all hold
``groups[g]``. Default: Fashion-MNIST's (ε₁, ε₂, ε₃) = (0.5, 1.5, 3.0) in equal groups.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from privacy.checks import check_choice, check_int, check_positive_finite

__all__ = [
    "BUDGET_DISTRIBUTIONS",
    "BUDGET_STREAM",
    "GDPFED_FMNIST_GROUPS",
    "MIN_BUDGET",
    "MIXTURES",
    "PARETO_ALPHA",
    "PARETO_SCALE",
    "budget_for",
    "budget_rng",
    "budgets_for",
    "exact_component",
    "group_of",
    "MIXTURE_COMPONENTS",
]

#: Names accepted by :func:`budget_for`.
BUDGET_DISTRIBUTIONS: tuple[str, ...] = (
    "constant",
    "uniform",
    "gauss",
    "pareto",
    "mixgauss1",
    "mixgauss2",
    "mixgauss3",
    "mixgauss4",
    "groups",
)

#: How a mixture's component is chosen per client: ``"drawn"`` independently with the
#: component weights (the PFA authors' code: the number of high-ε clients is binomial), or
#: ``"exact"``: a seeded permutation of the ids cut in contiguous blocks of round(weight·n)
#: clients, so every seed has the same number of clients per component.
MIXTURE_COMPONENTS: tuple[str, ...] = ("drawn", "exact")

#: Gaussian mixtures of PFA Table 1, as (weight, mean, std) components.
MIXTURES: Final[dict[str, tuple[tuple[float, float, float], ...]]] = {
    "gauss": ((1.0, 3.0, 1.0),),
    "mixgauss1": ((0.9, 0.1, 0.01), (0.1, 10.0, 0.1)),
    "mixgauss2": ((0.9, 0.5, 0.01), (0.1, 10.0, 0.1)),
    "mixgauss3": ((0.9, 1.0, 0.1), (0.1, 10.0, 0.1)),
    "mixgauss4": ((0.5, 0.1, 0.01), (0.4, 1.0, 0.1), (0.1, 10.0, 1.0)),
}

#: Pareto scale x_m and shape α (the PFA authors' ``pareto1.txt``).
PARETO_SCALE = 0.5
PARETO_ALPHA = 1.0

#: Smallest budget a draw may return; smaller draws are redrawn (truncation).
MIN_BUDGET = 0.01

#: GDPFed's group budgets for Fashion-MNIST (also SVHN and Shakespeare), strict -> loose.
GDPFED_FMNIST_GROUPS: tuple[float, ...] = (0.5, 1.5, 3.0)

#: Domain-separation word mixed into every budget seed (ASCII "budget").
BUDGET_STREAM = 0x627564676574

_MAX_REDRAWS = 10_000


def budget_rng(client_id: int, seed: int) -> np.random.Generator:
    """The generator behind client ``client_id``'s budget draw under ``seed``.

    ``SeedSequence([|seed|, int(seed < 0), client_id, BUDGET_STREAM])``: any integer seed,
    one independent stream per client.
    """
    seed = check_int("seed", seed, minimum=-(2**63))
    client_id = check_int("client_id", client_id, minimum=0)
    entropy = [abs(seed), int(seed < 0), client_id, BUDGET_STREAM]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def group_of(client_id: int, num_clients: int, num_groups: int, ratio: Sequence[int] | None = None) -> int:
    """Group of ``client_id`` when ids 0…n−1 are cut into ``num_groups`` contiguous groups.

    With relative sizes r_1 : … : r_M (``ratio``; equal when omitted) and R_g = r_1 + … + r_g,
    group g holds ids ⌈n·R_{g−1}/R_M⌉ ≤ i < ⌈n·R_g/R_M⌉ (exact integer arithmetic), so each
    size is within one of n·r_g/R_M and lower ids go to lower (stricter) groups. Equal
    ratios give g(i) = ⌊i·M/n⌋. With M > n some groups are empty. GDPFed's Table 8 uses
    1:4:1, 2:2:2, 3:2:1 and 1:2:3.

    Raises
    ------
    ValueError
        If n < 1, M < 1, i is not in [0, n), or ``ratio`` is not M positive integers.
    """
    num_clients = check_int("num_clients", num_clients, minimum=1)
    num_groups = check_int("num_groups", num_groups, minimum=1)
    client_id = check_int("client_id", client_id, minimum=0)
    if client_id >= num_clients:
        raise ValueError(f"client_id must be in [0, {num_clients}); found {client_id}")
    if ratio is None:
        return client_id * num_groups // num_clients
    if isinstance(ratio, (str, bytes)) or len(ratio) != num_groups:
        raise ValueError(f"ratio must hold {num_groups} group sizes; found {ratio!r}")
    sizes = [check_int(f"ratio[{g}]", r, minimum=1) for g, r in enumerate(ratio)]
    total, cumulative = sum(sizes), 0
    for g, size in enumerate(sizes):
        cumulative += size
        if client_id < -(-num_clients * cumulative // total):  # ⌈n·R_g/R_M⌉
            return g
    raise AssertionError("unreachable: the last boundary is n")


@functools.lru_cache(maxsize=8)
def _positions(num_clients: int, seed: int) -> np.ndarray:
    """A permutation of 0…n−1 seeded by the run seed alone (cached per simulation)."""
    order = np.random.default_rng(np.random.SeedSequence([abs(seed), int(seed < 0), BUDGET_STREAM, 1]))
    return order.permutation(num_clients)


def exact_component(client_id: int, num_clients: int, seed: int, weights: Sequence[float]) -> int:
    """Mixture component of ``client_id`` under ``components = "exact"``.

    Ids are permuted by a generator seeded with ``seed`` alone (the same permutation for
    every client), then cut by :func:`group_of` with the weights as integer ratios (in
    hundredths), so component k holds ⌈n·W_k⌉ − ⌈n·W_{k−1}⌉ clients (W: cumulative weights).
    """
    seed = check_int("seed", seed, minimum=-(2**63))
    position = int(_positions(num_clients, seed)[client_id])
    ratio = [max(1, round(100 * w)) for w in weights]
    return group_of(position, num_clients, len(ratio), ratio)


def _draw_truncated(rng: np.random.Generator, draw: str, component: int | None = None) -> float:
    for _ in range(_MAX_REDRAWS):
        if draw == "pareto":
            value = PARETO_SCALE * (1.0 + float(rng.pareto(PARETO_ALPHA)))
        else:
            components = MIXTURES[draw]
            weights = np.array([w for w, _, _ in components])
            k = int(rng.choice(len(components), p=weights / weights.sum())) if component is None else component
            _, mean, std = components[k]
            value = float(rng.normal(mean, std))
        if MIN_BUDGET <= value < math.inf:
            return value
    raise RuntimeError(f"no budget >= {MIN_BUDGET} in {_MAX_REDRAWS} draws of {draw!r}")


def budget_for(
    distribution: str,
    client_id: int,
    *,
    num_clients: int,
    seed: int,
    epsilon: float = 3.0,
    epsilon_min: float = 1.0,
    epsilon_max: float = 10.0,
    groups: Sequence[float] = GDPFED_FMNIST_GROUPS,
    group_ratio: Sequence[int] | None = None,
    components: str = "drawn",
) -> float:
    """The privacy budget ε of one client, deterministic in (distribution, id, seed, …).

    Parameters
    ----------
    distribution : str
        One of :data:`BUDGET_DISTRIBUTIONS`:

        * ``"constant"``: ``epsilon`` for everyone;
        * ``"uniform"``: U(epsilon_min, epsilon_max) (PFA: U(1, 10));
        * ``"gauss"``: N(3, 1²) truncated to [MIN_BUDGET, ∞);
        * ``"pareto"``: x_m = 0.5, α = 1, P(ε > x) = 0.5/x (no cap);
        * ``"mixgauss1"`` … ``"mixgauss4"``: PFA Table 1 mixtures (std parameters),
          truncated to [MIN_BUDGET, ∞) (a no-op in practice: > 9 std from every mean);
        * ``"groups"``: ``groups[group_of(client_id, num_clients, len(groups))]``.
    client_id : int
        In [0, num_clients).
    num_clients : int
        Federation size n >= 1.
    seed : int
        Root seed of the run (any integer).
    epsilon : float
        Budget of ``"constant"``, > 0.
    epsilon_min, epsilon_max : float
        Bounds of ``"uniform"``, 0 < min <= max.
    groups : sequence of float
        Group budgets of ``"groups"``, each > 0; default GDPFed Fashion-MNIST (0.5, 1.5, 3).
    group_ratio : sequence of int, optional
        Relative group sizes of ``"groups"`` (:func:`group_of`); equal when omitted.
    components : str
        For the mixtures: one of :data:`MIXTURE_COMPONENTS` (``"drawn"``, the authors' way,
        or ``"exact"``: a fixed number of clients per component, :func:`exact_component`).

    Returns
    -------
    float
        A positive, finite ε.

    Raises
    ------
    ValueError
        If the distribution is unknown (the message lists the allowed names) or a parameter
        is out of its domain.
    """
    distribution = check_choice("distribution", distribution, BUDGET_DISTRIBUTIONS)
    num_clients = check_int("num_clients", num_clients, minimum=1)
    client_id = check_int("client_id", client_id, minimum=0)
    if client_id >= num_clients:
        raise ValueError(f"client_id must be in [0, {num_clients}); found {client_id}")
    rng = budget_rng(client_id, seed)

    if distribution == "constant":
        return check_positive_finite("epsilon", epsilon)
    if distribution == "uniform":
        low = check_positive_finite("epsilon_min", epsilon_min)
        high = check_positive_finite("epsilon_max", epsilon_max)
        if high < low:
            raise ValueError(
                f"epsilon_max must be >= epsilon_min; found epsilon_min={low}, epsilon_max={high}"
            )
        return float(rng.uniform(low, high))
    if distribution == "groups":
        if isinstance(groups, (str, bytes)) or len(groups) == 0:
            raise ValueError(f"groups must be a non-empty sequence of budgets; found {groups!r}")
        values = [check_positive_finite(f"groups[{g}]", v) for g, v in enumerate(groups)]
        return values[group_of(client_id, num_clients, len(values), group_ratio)]
    components = check_choice("components", components, MIXTURE_COMPONENTS)
    if components == "exact" and distribution in MIXTURES:
        weights = [w for w, _, _ in MIXTURES[distribution]]
        return _draw_truncated(rng, distribution, exact_component(client_id, num_clients, seed, weights))
    return _draw_truncated(rng, distribution)


def budgets_for(distribution: str, num_clients: int, **kw: object) -> list[float]:
    """Budgets of clients 0…n−1: ``[budget_for(distribution, i, num_clients=n, **kw)]``.

    Keyword arguments are those of :func:`budget_for` (``seed`` is required).
    """
    num_clients = check_int("num_clients", num_clients, minimum=1)
    return [
        budget_for(distribution, i, num_clients=num_clients, **kw)  # type: ignore[arg-type]
        for i in range(num_clients)
    ]
