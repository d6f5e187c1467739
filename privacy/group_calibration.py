"""Per-group noise multipliers σ_m of GDPFed (paper 003), from the project's calibration.

Each group m of GDPFed is one Poisson-subsampled Gaussian mechanism on the group's noisy
sum of clipped updates: sensitivity C (one client), noise std C·σ_m, each client of G_m
taking part with probability q_m, T rounds. σ_m is the smallest multiplier for which this
mechanism is (ε_m, δ)-DP at the client level, with ε_m = min_{i∈G_m} ε_i
(:func:`privacy.calibration.noise_multiplier_for`), so every client of the group stays within
its own budget.

Two settings:

* :data:`PAPER_SETTINGS` reproduces the paper's Table 5 (docs/notes/gdpfed.md §1.4): Opacus'
  RDP accountant, the add/remove relation, the bisection stopping at ε_target − ε <= 0.01.
  The unit tests check σ² against Table 5 to 2 decimals.
* :func:`ledger_settings` (what runs use): the run's own accountant (the one every ledger
  charges with, ``prv`` by default: :data:`PROJECT_SETTINGS`) under **replace-one**, the
  relation every ledger charges (a client's example count is public), with the default
  relative tolerance. Calibrating with the accountant that charges makes the plan spend
  ε_m up to that tolerance and never more (the search only returns σ it has evaluated to
  meet ε_m). Under PRV at the paper's FMNIST setting σ_m is 0.73-1.17× the paper's
  add/remove RDP σ_m: replace-one costs more, the tighter accountant gives it back; a
  looser accountant than the ledger's (RDP against PRV ledgers) would spend only 32-73 %
  of each budget and add 1.3-1.9× the noise it needs.

**A group summed as a distributed discrete Gaussian** (``secure-aggregation = "secagg+ddg"``): the
members charge :class:`privacy.poisson_rdp.DDGPoissonStep` (KLS's curve at the sum's parameters,
amplified by Poisson sampling at q_m, T releases), not the Gaussian (σ_m, q_m, T). The sum's
parameters are a function of σ_m (the scale s falls as σ_m grows, and σ² = ⌈σ_m²C²s²/r_m⌉, B from
C·s), so :func:`ddg_group_noise_multiplier` searches σ_m itself: the smallest σ_m whose step, built
by :func:`privacy.distributed_discrete_gaussian.ddg_parameters` exactly as the secure sum builds it,
spends at most ε_m. The search returns only a σ_m it has evaluated to meet ε_m; a client's ledger
refuses a release over its budget in any case.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from privacy.accountants import ADD_REMOVE, DEFAULT_ACCOUNTANT, REPLACE_ONE, epsilon_of
from privacy.calibration import noise_multiplier_for
from privacy.distributed_discrete_gaussian import WRAP_PROBABILITY, DDGParameters, ddg_parameters
from privacy.poisson_rdp import DDGPoissonStep

__all__ = [
    "CalibrationSettings",
    "PAPER_SETTINGS",
    "PROJECT_SETTINGS",
    "ddg_group_noise_multiplier",
    "ddg_group_step",
    "ledger_settings",
    "paper_delta",
    "group_noise_multipliers",
]


@dataclass(frozen=True)
class CalibrationSettings:
    """How σ_m is searched.

    The accountant, the neighbouring relation, and the absolute ε tolerance (None: the
    project's relative default).
    """

    accountant: str = DEFAULT_ACCOUNTANT
    relation: str = REPLACE_ONE
    tolerance: float | None = None


def ledger_settings(accountant: str) -> CalibrationSettings:
    """The calibration that matches ledgers charging with ``accountant``: replace-one, project tolerance.

    Parameters
    ----------
    accountant : {"rdp", "prv"}
        The run's accountant (``accountant`` in the run config), the one every ledger charges with.
    """
    return CalibrationSettings(accountant, REPLACE_ONE, None)


#: The paper's experiments (Opacus ``get_noise_multiplier``, ``epsilon_tolerance=0.01``).
PAPER_SETTINGS = CalibrationSettings("rdp", ADD_REMOVE, 0.01)
#: What the ledgers charge by default: the default accountant (PRV), replace-one, project tolerance.
PROJECT_SETTINGS = ledger_settings(DEFAULT_ACCOUNTANT)


def paper_delta(num_clients: int) -> float:
    """δ = n^-1.1 (the paper's default for n clients), e.g. 6.983e-5 for n = 6000."""
    if num_clients < 2:
        raise ValueError(f"num_clients must be >= 2 for delta = n^-1.1; found {num_clients}")
    return float(float(num_clients) ** -1.1)


def group_noise_multipliers(
    epsilons: Sequence[float],
    sample_rates: Sequence[float],
    rounds: int,
    delta: float,
    settings: CalibrationSettings = PROJECT_SETTINGS,
    *,
    key: str = "gdpfed.group-epsilons",
) -> list[float]:
    """σ_m for each group: smallest σ with ε(σ, q_m, T; δ) <= ε_m.

    Parameters
    ----------
    epsilons : sequence of float
        ε_m = min ε of group m, each > 0.
    sample_rates : sequence of float
        q_m in (0, 1], one per group.
    rounds : int
        T, the number of rounds (one accounting step per round per group).
    delta : float
        The shared δ.
    settings : CalibrationSettings
        :func:`ledger_settings` of the run's accountant (default :data:`PROJECT_SETTINGS`), or
        :data:`PAPER_SETTINGS` (Table 5's test only: add/remove does not match what ledgers charge).
    key : str
        Config key named in the error when a budget cannot be reached.

    Raises
    ------
    ValueError
        Naming ``key`` if some ε_m is below what the accountant can certify for any σ, or
        the lengths differ.
    """
    if len(epsilons) != len(sample_rates):
        raise ValueError(f"'{key}': {len(epsilons)} budgets but {len(sample_rates)} sample rates")
    out = []
    for m, (eps, q) in enumerate(zip(epsilons, sample_rates, strict=True)):
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"'{key}': group {m + 1} budget eps={eps!r} must be a finite number > 0")
        try:
            out.append(noise_multiplier_for(eps, delta, q, rounds, accountant=settings.accountant,
                                            tolerance=settings.tolerance, relation=settings.relation))
        except ValueError as exc:
            raise ValueError(f"'{key}': group {m + 1} budget eps={eps:g} cannot be reached "
                             f"(q={q:g}, T={rounds}, delta={delta:.3g}): {exc}") from None
    return out


def ddg_group_step(params: DDGParameters, *, min_shares: int, sample_rate: float, rounds: int) -> DDGPoissonStep:
    """The ledger step of a group whose sum has ``params``: what each member charges for the run."""
    return DDGPoissonStep(float(params.local_sigma_sq), params.norm_bound_sq, params.padded_dim, min_shares,
                          max(min_shares, params.max_members), sample_rate, rounds)


def ddg_group_noise_multiplier(epsilon: float, delta: float, sample_rate: float, rounds: int, *, clip: float,
                               dim: int, bits: int, shares: int, beta: float = 0.0,
                               wrap_probability: float = WRAP_PROBABILITY, key: str = "gdpfed.group-epsilons",
                               iterations: int = 40) -> float:
    """The smallest σ_m (to a relative 10⁻³) whose discrete Gaussian group sum spends at most ``epsilon``.

    A sum of ``shares`` = r_m members (GDPFed releases a group sum only with all of them) is built by
    :func:`~privacy.distributed_discrete_gaussian.ddg_parameters` from (C, d, b, σ_m, r_m, β, wrap target);
    its members charge :func:`ddg_group_step` (module docstring). ε(σ_m) is not exactly monotone (σ² is
    rounded up to an integer, B has a rounding slack that grows relative to C·s as s falls), so the
    geometric bisection keeps the invariant ε(high) <= ε_m on evaluated points only.

    Raises
    ------
    ValueError
        Naming ``key`` when no σ_m <= 10⁴ reaches ``epsilon`` at ``bits`` (the rounding slack, charged
        through B, dominates at too few bits).
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"'{key}': budget eps={epsilon!r} must be a finite number > 0")

    def eps_at(sigma: float) -> float:
        try:
            params = ddg_parameters(clip=clip, dim=dim, bits=bits, noise_multiplier=sigma, noise_shares=shares,
                                    max_members=shares, beta=beta, wrap_probability_target=wrap_probability)
        except ValueError:  # too little noise for KLS's sigma >= 1/2, or no room in b bits
            return math.inf
        step = ddg_group_step(params, min_shares=shares, sample_rate=sample_rate, rounds=rounds)
        return epsilon_of([step], delta)

    low, high = 0.0, 0.25
    while eps_at(high) > epsilon:
        low, high = high, 2.0 * high
        if high > 1e4:
            raise ValueError(f"'{key}': budget eps={epsilon:g} cannot be reached by a discrete Gaussian group sum "
                             f"(q={sample_rate:g}, T={rounds}, r={shares}, bits={bits}, delta={delta:.3g}): raise "
                             "secagg.bits or the budget")
    for _ in range(iterations):
        if low > 0 and high / low < 1.0 + 1e-3:
            break
        middle = math.sqrt(low * high) if low > 0 else high / 2.0
        if eps_at(middle) <= epsilon:
            high = middle
        else:
            low = middle
    return high
