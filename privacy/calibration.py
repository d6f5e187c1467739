"""Noise calibration: the smallest σ that keeps a planned run within a target ε.

The closed forms in the papers (PFA Thm. 1, GDPFed Thm. 1, with their unknown or loose
constants) do not decide σ here; σ comes from the same numerical accountant that later
charges the ledger (:func:`privacy.accountants.epsilon_of`), so a calibrated plan is
accepted by the ledger by construction. ``calibration = "pfa-closed-form"`` may only
*raise* σ to the PFA authors' formula (:func:`pfa_closed_form_sigma`), to reproduce their
noise levels; the ledger still charges the true ε.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence

from privacy.accountants import ACCOUNTANTS, REPLACE_ONE, Charge, CurveStep, epsilon_of, epsilon_of_valid
from privacy.checks import (
    check_choice,
    check_delta,
    check_int,
    check_nonnegative_finite,
    check_positive_finite,
    check_probability,
    check_step,
)
from privacy.exceptions import PrivacyBudgetExhausted

__all__ = ["CALIBRATIONS", "MAX_SIGMA", "epsilon_for", "noise_multiplier_for", "pfa_closed_form_sigma"]

log = logging.getLogger(__name__)

#: Default precision of the search, relative to the target ε.
CALIBRATION_RTOL = 1e-3

#: Largest σ the search considers (Opacus' ``MAX_SIGMA``).
MAX_SIGMA = 1e6

_SIGMA_START = 10.0  # Opacus doubles σ_high from 10: the first probe is 20
_MAX_BISECTIONS = 200


def noise_multiplier_for(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    *,
    accountant: str = "rdp",
    prior_history: Sequence[Charge] = (),
    tolerance: float | None = None,
    relation: str = REPLACE_ONE,
) -> float:
    """Smallest noise multiplier σ whose run stays within ``target_epsilon``.

    Finds σ such that ``ε(σ) = epsilon_of(prior_history + [(σ, q, steps)], δ)`` satisfies
    ``ε_target − tolerance <= ε(σ) <= ε_target``; as ε(σ) decreases in σ, σ is the
    smallest admissible noise multiplier up to that tolerance. The search starts as Opacus'
    ``get_noise_multiplier`` does: σ_high doubles from 10 until ε(σ_high) <= ε_target; then the
    bracket is shrunk by a safeguarded false position in log σ (bisection where it stalls) until
    ε_target − ε(σ_high) <= tolerance, and the conservative endpoint σ_high is returned. Every σ_high ever held has been *evaluated* to satisfy the
    target, so the result never overshoots, whatever the accountant's numerical quirks.
    With an empty prior and the RDP accountant the result equals Opacus' (e.g. GDPFed's
    σ² = 2.26 for Fashion-MNIST) unless the extra RDP orders tighten ε.

    Parameters
    ----------
    target_epsilon : float
        Total ε allowed for the prior history plus the planned run, > 0 and finite.
    delta : float
        δ of the guarantee, in (0, 1).
    sample_rate : float
        Poisson sampling probability q of each planned step, in (0, 1].
    steps : int
        Number of planned steps, >= 1.
    accountant : {"rdp", "prv"}
        Accountant used for ε (see :func:`privacy.accountants.epsilon_of`).
    prior_history : sequence of (float, float, int)
        What was already spent, e.g. a client's ledger history from earlier runs.
    tolerance : float, optional
        Precision of the search in ε, > 0; by default :data:`CALIBRATION_RTOL` of the
        target (a budget near 0.1 is used as fully as one near 10). Given explicitly, the
        search is Opacus' plain bisection, so that a paper's table computed with
        ``get_noise_multiplier`` at that tolerance is reproduced to the digit.
    relation : {"replace-one", "add-remove"}
        Neighbouring relation (:mod:`privacy.accountants`); ledgers charge replace-one.

    Returns
    -------
    float
        σ in (0, 1e6].

    Raises
    ------
    PrivacyBudgetExhausted
        If ``prior_history`` alone already spends ε >= ``target_epsilon``.
    ValueError
        If an argument is out of its domain, or σ would have to exceed ``MAX_SIGMA``
        (the target is below what the accountant can certify for any σ, e.g. below
        ≈ 0.0035 at δ = 1e-5 for RDP).

    Notes
    -----
    A search costs about 6–10 accountant evaluations (tens of ms each for RDP, up to a second
    for PRV), where bisection took 14–17. With ``accountant="prv"``, ε(σ) jumps where the RDP bound crosses
    ``PRV_MAX_EPSILON`` (PRV below, RDP above), so targets near 50 may end with ε(σ) more
    than ``tolerance`` below the target; the result is still never above it.
    """
    target = check_positive_finite("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    rate = check_probability("sample_rate", sample_rate)
    steps = check_int("steps", steps, minimum=1)
    accountant = check_choice("accountant", accountant, ACCOUNTANTS)
    explicit = tolerance is not None
    tolerance = check_positive_finite(
        "tolerance", CALIBRATION_RTOL * target if tolerance is None else tolerance
    )
    prior = tuple(s if isinstance(s, CurveStep) else check_step(s, name=f"prior_history[{i}]")
                  for i, s in enumerate(prior_history))
    # an explicit tolerance mirrors Opacus' get_noise_multiplier (a paper's table): its bisection, its endpoint
    return _calibrated(target, delta, rate, steps, accountant, prior, tolerance, relation, explicit)


@functools.lru_cache(maxsize=1024)
def _calibrated(target: float, delta: float, rate: float, steps: int, accountant: str, prior: tuple[Charge, ...],
                tolerance: float, relation: str, bisection: bool = False) -> float:
    """:func:`noise_multiplier_for` on checked arguments, memoised (a pure function).

    The simulated clients of one process that share a budget and workload (constant or group
    budgets, PFA's references) search once instead of once each.
    """
    spent = epsilon_of_valid(prior, delta, accountant, relation)
    if spent >= target:
        raise PrivacyBudgetExhausted(
            f"prior history already spends epsilon={spent:.6g} >= target_epsilon={target:g} "
            f"(delta={delta:g}); no noise level allows {steps} more steps"
        )

    def eps_at(sigma: float, q: float = rate) -> float:
        return epsilon_of_valid((*prior, (sigma, q, steps)), delta, accountant, relation)

    # Fast feasibility check (q = 1 has a closed-form RDP): subsampling only lowers ε, so
    # if even q = 1 at MAX_SIGMA meets the target, the search below terminates; if not,
    # the target lies below the accountant's floor up to a negligible band.
    floor = eps_at(MAX_SIGMA, 1.0)
    if floor > target:
        raise ValueError(
            f"target_epsilon={target:g} is too small: sigma would have to exceed "
            f"{MAX_SIGMA:g} (at sigma={MAX_SIGMA:g} the {accountant} accountant certifies "
            f"only epsilon={floor:.4g} at delta={delta:g})"
        )

    sigma_low, sigma_high, eps_high = 0.0, _SIGMA_START, math.inf
    while eps_high > target:  # doubling; the feasibility check bounds it by MAX_SIGMA
        if sigma_high >= MAX_SIGMA:
            raise ValueError(
                f"target_epsilon={target:g} is too small: sigma would have to exceed "
                f"{MAX_SIGMA:g} (q={rate:g}, steps={steps}, delta={delta:g})"
            )
        sigma_high = min(2.0 * sigma_high, MAX_SIGMA)
        eps_high = eps_at(sigma_high)

    # Shrink [σ_low, σ_high] (ε(σ_low) > target, ε(σ_high) <= target) with a safeguarded false position
    # in (log σ, log ε), aiming inside the tolerance band, halving where it stalls: a
    # handful of accountant evaluations where plain bisection takes 15 or more. σ_high stays an
    # evaluated feasible point, so the result never overshoots.
    aim = target - 0.5 * tolerance
    eps_low, stalled = math.inf, 0
    for _ in range(_MAX_BISECTIONS):  # ends long before: the bracket shrinks every time
        if target - eps_high <= tolerance or sigma_high - sigma_low <= 1e-12 * sigma_high:
            break
        if not bisection and sigma_low > 0 and math.isfinite(eps_low) and stalled < 2:
            # ε falls about as a power of σ: interpolate log ε linearly in log σ
            x0, x1 = math.log(sigma_low), math.log(sigma_high)
            y0, y1, y = math.log(eps_low), math.log(max(eps_high, 1e-300)), math.log(aim)
            sigma = math.exp(x1 - (y1 - y) * (x1 - x0) / (y1 - y0))
            inside = sigma_low + 1e-3 * (sigma_high - sigma_low) < sigma < sigma_high - 1e-3 * (sigma_high - sigma_low)
            sigma = sigma if inside else 0.5 * (sigma_low + sigma_high)
        else:
            sigma = 0.5 * (sigma_low + sigma_high)
        eps = eps_at(sigma)
        if eps <= target:
            sigma_high, eps_high = sigma, eps
            stalled = stalled + 1 if eps_low < math.inf else 0
        else:
            sigma_low, eps_low = sigma, eps
            stalled = 0
    log.debug(
        "calibrated sigma=%.6g: epsilon=%.6g for target %.6g (q=%g, steps=%d, delta=%g, %s)",
        sigma_high, eps_high, target, rate, steps, delta, accountant,
    )
    return sigma_high


def epsilon_for(
    noise_multiplier: float,
    delta: float,
    sample_rate: float,
    steps: int,
    *,
    accountant: str = "rdp",
    relation: str = REPLACE_ONE,
) -> float:
    """ε of ``steps`` runs of a q-subsampled Gaussian mechanism with multiplier σ.

    Shorthand for ``epsilon_of([(σ, q, steps)], δ, accountant)``; σ = 0 gives ``inf``.

    Raises
    ------
    ValueError
        If σ < 0, q not in (0, 1], steps < 1, δ not in (0, 1) or the accountant is unknown.
    """
    sigma = check_nonnegative_finite("noise_multiplier", noise_multiplier)
    rate = check_probability("sample_rate", sample_rate)
    steps = check_int("steps", steps, minimum=1)
    return epsilon_of([(sigma, rate, steps)], delta, accountant, relation)


#: ``calibration``: how a client turns its budget into σ. ``"accountant"``: the smallest σ
#: the ledger's accountant accepts (:func:`noise_multiplier_for`); ``"pfa-closed-form"``: the
#: PFA authors' formula (:func:`pfa_closed_form_sigma`), never below the accountant's σ.
CALIBRATIONS = ("accountant", "pfa-closed-form")

#: The PFA authors' constant c₂ (their ``compute_noise_multiplier``: ``10 * q * sqrt(T * -log10(delta)) / eps``).
PFA_C2 = 10.0


def pfa_closed_form_sigma(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """σ = c₂ · q · √(T · (−log₁₀ δ)) / ε with c₂ = 10: the PFA authors' calibration.

    Their code's moments-accountant bound with a guessed constant (notes ``pfa.md`` §1.5):
    T is the number of DP-SGD steps planned, q their sampling rate. For ε ≲ 1 it adds several
    times the noise ε needs (5–6× at ε = 0.1 in their setting); it is *not* a guarantee by
    itself, so :func:`client.round_plan.plan_round` uses ``max(this, the accountant's σ)``
    and the ledger charges the true ε of the σ used.
    """
    eps = check_positive_finite("epsilon", epsilon)
    delta = check_delta(delta)
    rate = check_probability("sample_rate", sample_rate)
    steps = check_int("steps", steps, minimum=1)
    return PFA_C2 * rate * math.sqrt(steps * -math.log10(delta)) / eps
