"""GDPFed's plan: its variants, and the groups, sampling rates and noise of a run (paper 003, Algorithm 1).

The plan is made once, after the budget handshake (:func:`plan_groups`; the steps are those of
:mod:`strategies.gdpfed`'s docstring): clients grouped by declared ε, each group's ε_m and δ_m
(the strictest member's), its sampling rate q_m (q, Problem 1, or given), its count r_m and its
noise multiplier σ_m, calibrated with the accountant the clients' ledgers charge with, so that
each group spends ε_m up to the calibration's tolerance and never more. :data:`VARIANTS` names
what distinguishes the registered methods (docs/notes/gdpfed.md §2.9, §6); :func:`check_plan`
runs the plan on a simulation's budgets before anything starts, so that a plan that cannot work
fails naming its key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from privacy.accountants import DEFAULT_ACCOUNTANT
from privacy.budgets import budgets_for
from privacy.group_calibration import group_noise_multipliers, ledger_settings
from strategies.gdpfed_config import GDPFedConfig
from strategies.gdpfed_math import group_weights, idp_scale_clips, optimal_sampling, round_counts


@dataclass(frozen=True)
class Variant:
    """What distinguishes the registered methods (docs/notes/gdpfed.md §2.9, §6)."""

    name: str
    sampling: str = "uniform"  # "uniform" | "optimal" | "idp"
    noise: str = "group"  # "group" | "common-std" (IDP Scale) | "common-sigma" (IDP Sample)
    weighting: str | None = None  # None: the config's; "mean": DP-FedAvg's plain mean
    sparsify: bool = False
    single_group: bool = False
    pfa: bool = False


@dataclass(frozen=True)
class GroupPlan:
    """The per-group mechanism of a run (group index m = 0..M−1, strict to loose)."""

    epsilons: list[float]
    deltas: list[float]
    sizes: list[int]
    sample_rates: list[float]  # q_m = r_m/|G_m| actually used (and charged)
    requested_rates: list[float]  # q_m before rounding (Problem 1's, Table 1's, or q)
    counts: list[int]  # r_m
    sigmas: list[float]  # σ_m of the group sum
    clips: list[float]  # C_m
    weights: list[float]  # ω_m on the group sum
    sparsity: list[float]  # k_m/d (1: none)
    rounds: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe, for the results' summary."""
        return {k: v for k, v in self.__dict__.items()}


#: ``(ε_m, δ_m, q_m, T, r_m) -> σ_m``: a group's calibration other than the Gaussian accountant's.
SigmaRule = Callable[[float, float, float, int, int], float]


def group_index(epsilon: float, thresholds: Sequence[float]) -> int | None:
    """The highest m with thresholds[m] <= ε (a 1e-9 relative slack), or None below the first."""
    below = [m for m, t in enumerate(thresholds) if t <= epsilon * (1 + 1e-9)]
    return below[-1] if below else None


@lru_cache(maxsize=256)
def _sigmas(epsilons: tuple[float, ...], rates: tuple[float, ...], rounds: int,
            deltas: tuple[float, ...], key: str, accountant: str) -> tuple[float, ...]:
    """σ_m per group, calibrated by ``accountant`` (the ledgers' own) under replace-one."""
    settings = ledger_settings(accountant)
    return tuple(group_noise_multipliers([e], [q], rounds, d, settings, key=key)[0]
                 for e, q, d in zip(epsilons, rates, deltas, strict=True))


def smallest_q(sampling: str, sizes: Sequence[int]) -> float:
    """The smallest global ratio q that samples every group at least once per round.

    Uniform sampling (q_m = q) needs q·|G_m| >= 1 for every group: q >= 1/min_m |G_m|. Problem 1
    (``sampling = "optimal"``) chooses r_m = q_m|G_m| >= 1 with Σ r_m = q·n: it needs q·n >= M,
    q >= M/n (below that its bounds 1/(qn) <= r_m/(qn) <= 1 are empty, which scipy reports as "An
    upper bound is less than the corresponding lower bound."). Rounded up to 4 decimals, so that
    the value printed is one that works.
    """
    exact = len(sizes) / sum(sizes) if sampling == "optimal" else 1.0 / min(sizes)
    return min(1.0, math.ceil(exact * 1e4 - 1e-6) / 1e4)


def _check_q(q: float, sampling: str, sizes: Sequence[int]) -> None:
    """ValueError naming ``gdpfed.q`` and the smallest value that works, where q is below it."""
    floor = smallest_q(sampling, sizes)
    n, m = sum(sizes), len(sizes)
    if sampling == "optimal" and q * n < m * (1 - 1e-9):
        raise ValueError(f"'gdpfed.q' = {q:g} samples q*n = {q * n:.4g} of {n} clients per round, fewer than one "
                         f"per budget group ({m} groups): the optimal sampling (Problem 1) needs gdpfed.q >= "
                         f"{floor:g} here (--set gdpfed.q={floor:g})")
    if sampling == "uniform" and q * min(sizes) < 1 - 1e-9:
        raise ValueError(f"'gdpfed.q' = {q:g} samples no client of the smallest budget group in a round (q*|G_m| = "
                         f"{q:g}*{min(sizes)} = {q * min(sizes):.3g} < 1; group sizes {list(sizes)}): gdpfed.q must "
                         f"be >= {floor:g} here (--set gdpfed.q={floor:g})")


def plan_groups(
    variant: Variant,
    params: GDPFedConfig,
    budgets: Sequence[tuple[float, float]],
    rounds: int,
    clip: float,
    *,
    lr: float = 0.1,
    local_steps: int = 5,
    accountant: str = DEFAULT_ACCOUNTANT,
    sigma_rule: SigmaRule | None = None,
) -> tuple[GroupPlan, list[int]]:
    """The run's group plan from the declared budgets ``[(ε_i, δ_i)]`` (module docstring).

    σ_m is calibrated with ``accountant``, which must be the one the clients' ledgers charge
    with (the run's ``accountant``): then each group spends ε_m up to the calibration's
    tolerance and never more.

    ``sigma_rule(ε_m, δ_m, q_m, T, r_m)``, where given, calibrates σ_m instead of the Gaussian
    accountant: the members of a ``secagg+ddg`` group charge the discrete Gaussian's curve step
    (:func:`privacy.group_calibration.ddg_group_noise_multiplier`).

    Returns the plan and each budget's group index. Raises ValueError naming the config key
    for an empty group, q_m·|G_m| < 1, or a budget the calibration cannot reach; a budget
    below the first threshold must have been refused before (ValueError otherwise).
    """
    if not budgets:
        raise ValueError("'gdpfed.group-epsilons': no client to group")
    if variant.single_group:
        assign = [0] * len(budgets)
        m_groups = 1
    else:
        idx = [group_index(e, params.group_epsilons) for e, _ in budgets]
        if any(i is None for i in idx):
            raise ValueError(f"'gdpfed.group-epsilons': a declared budget is below the first threshold "
                             f"{params.group_epsilons[0]:g}")
        assign = [int(i) for i in idx]  # type: ignore[arg-type]
        m_groups = len(params.group_epsilons)
    sizes = [assign.count(m) for m in range(m_groups)]
    for m, size in enumerate(sizes):
        if size == 0:
            raise ValueError(f"'gdpfed.group-epsilons': group {m + 1} (eps >= {params.group_epsilons[m]:g}) is "
                             "empty: no client declared a budget in its range; drop that threshold")
    eps = [min(e for (e, _), a in zip(budgets, assign, strict=True) if a == m) for m in range(m_groups)]
    deltas = [min(d for (_, d), a in zip(budgets, assign, strict=True) if a == m) for m in range(m_groups)]
    q = params.q
    rate_key = "gdpfed.q"
    if variant.sampling != "idp" and not (variant.sampling == "optimal" and params.sample_rates):
        _check_q(q, variant.sampling, sizes)
    if variant.sampling == "idp":
        requested, rate_key = params.per_group("idp_sample_rates", m_groups), "gdpfed.idp-sample-rates"
    elif variant.sampling == "optimal" and params.sample_rates:
        requested, rate_key = list(params.sample_rates), "gdpfed.sample-rates"
    elif variant.sampling == "optimal":
        requested = optimal_sampling(sizes, eps, q, min(deltas), rounds, lr=lr, local_steps=local_steps)
    else:
        requested = [q] * m_groups
    counts = round_counts(requested, sizes, key=rate_key)
    rates = [r / g for r, g in zip(counts, sizes, strict=True)]
    if sigma_rule is None:
        sigmas = list(_sigmas(tuple(eps), tuple(rates), rounds, tuple(deltas),
                              "gdpfed.group-epsilons" if not variant.single_group else "epsilon", accountant))
    else:
        sigmas = [sigma_rule(e, d, q_m, rounds, r) for e, d, q_m, r in zip(eps, deltas, rates, counts, strict=True)]
    clips = [clip] * m_groups
    if variant.noise == "common-std":  # IDP Scale: one noise std s for every group
        clips = (params.per_group("idp_clips", m_groups) if params.idp_clips
                 else idp_scale_clips(clip, sigmas, sizes))  # empty: IDP's own rule, C_m ∝ 1/σ_m
        std = max(c * s for c, s in zip(clips, sigmas, strict=True))
        # s/C_m >= σ_m; the max() keeps a rounding hair of std/C_m from undercutting the calibrated σ_m
        sigmas = [max(std / c, s) for c, s in zip(clips, sigmas, strict=True)]
    elif variant.noise == "common-sigma":  # IDP Sample: one σ for every group
        sigmas = [max(sigmas)] * m_groups
    weights = group_weights(counts, variant.weighting or params.weighting).tolist()
    if variant.sparsify:
        sparsity = params.per_group("sparsity", m_groups)
    else:
        sparsity = [1.0] * m_groups
    plan = GroupPlan(eps, deltas, sizes, rates, [float(x) for x in requested], counts, sigmas, clips,
                     weights, sparsity, rounds)
    return plan, assign


#: The registered methods of the GDPFed family, by name (docs/notes/gdpfed.md §2.9, §6).
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("dp-fedavg", weighting="mean", single_group=True),  # Algorithm 2: one group at min ε, plain mean
    Variant("gdpfed"),  # per-group σ_m at q_m = q
    Variant("gdpfed-op", sampling="optimal"),  # Problem 1's q_m
    Variant("gdpfed-plus", sampling="optimal", sparsify=True),  # Problem 1 + per-group top-k
    Variant("idp-fedavg-scale", noise="common-std"),  # per-group clip C_m, one noise std
    Variant("idp-fedavg-sample", sampling="idp", noise="common-sigma"),  # per-group q_m, one σ
    Variant("pfa-groups", pfa=True),  # PFA on the group sums
)}


def check_plan(cfg: Any) -> None:
    """Plan the groups from the simulated budgets at start (GDPFed family in simulation).

    An empty group, q_m|G_m| < 1 or an unreachable ε fails before the run naming its key (``cfg``: a
    validated RunConfig, already through :func:`strategies.gdpfed_config.check`). It lives here, not
    in :mod:`strategies.gdpfed_config`, because it needs :func:`plan_groups` and the variants, and
    this module imports that one.
    """
    if cfg.budget_distribution == "none":
        return
    budgets = budgets_for(cfg.budget_distribution, cfg.num_clients, **cfg.budget_params)
    variant = VARIANTS[cfg.strategy]
    if not variant.single_group and min(budgets) < cfg.gdpfed.group_epsilons[0] * (1 - 1e-9):
        raise ValueError(f"'gdpfed.group-epsilons': the first threshold {cfg.gdpfed.group_epsilons[0]:g} is "
                         f"above the smallest simulated budget {min(budgets):g}; those clients would be refused")
    plan_groups(variant, cfg.gdpfed, [(e, cfg.delta) for e in budgets], cfg.num_server_rounds, cfg.clip,
                lr=cfg.learning_rate, local_steps=cfg.local_steps or cfg.local_epochs, accountant=cfg.accountant)
