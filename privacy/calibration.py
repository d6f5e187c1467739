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
from collections.abc import Callable, Sequence

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
    smallest admissible noise multiplier up to that tolerance. The search first probes σ = 20,
    as Opacus' ``get_noise_multiplier`` does, and brackets the answer by extrapolating ε ∝ 1/σ
    (:func:`_bracket`); then the bracket is shrunk by the Illinois false position in log σ until
    ε_target − ε(σ_high) <= tolerance, and the conservative end σ_high is returned. Every σ_high
    ever held has been *evaluated* to satisfy the target, so the result never overshoots,
    whatever the accountant's numerical quirks.
    With an empty prior, the RDP accountant and an explicit tolerance the result equals Opacus' (e.g. GDPFed's
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
    A search costs about 4–10 accountant evaluations (tens of ms each for RDP, up to a second
    for PRV), where Opacus' doubling and bisection take 14–17. With ``accountant="prv"``, ε(σ) jumps where the RDP bound crosses
    ``PRV_MAX_EPSILON`` (PRV below, RDP above; the PRV ε there can be as low as ~12), so a target
    above that may end with ε(σ) more than ``tolerance`` below it; the result is still never above it.
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

    aim = target - 0.5 * tolerance
    if bisection:  # Opacus' get_noise_multiplier: σ_high doubles from 10, then plain bisection
        sigma_low, eps_low, sigma_high, eps_high = 0.0, math.inf, _SIGMA_START, math.inf
        while eps_high > target:  # the feasibility check bounds it by MAX_SIGMA
            if sigma_high >= MAX_SIGMA:
                raise _unreachable(target, rate, steps, delta)
            sigma_high = min(2.0 * sigma_high, MAX_SIGMA)
            eps_high = eps_at(sigma_high)
    else:
        sigma_low, eps_low, sigma_high, eps_high = _bracket(eps_at, target, aim, tolerance)
        if sigma_high > MAX_SIGMA:
            raise _unreachable(target, rate, steps, delta)

    # Shrink [σ_low, σ_high] (ε(σ_low) > target, ε(σ_high) <= target) until ε(σ_high) is within
    # the tolerance: Opacus' bisection where asked, else the Illinois variant of false position on
    # f(σ) = log ε(σ) − log aim in log σ (ε falls about as a power of σ), which halves the retained
    # end's f when the same end is kept twice, so a kinked ε(σ) (a minimum over RDP orders) does not
    # stall it: a handful of accountant evaluations where bisection takes 15 or more. σ_high stays an
    # evaluated feasible point, so the result never overshoots.
    f_low = math.log(eps_low / aim) if sigma_low > 0 else math.inf
    f_high = math.log(max(eps_high, 1e-300) / aim)
    kept = ""
    for _ in range(_MAX_BISECTIONS):  # ends long before: the bracket shrinks every time
        if target - eps_high <= tolerance or sigma_high - sigma_low <= 1e-12 * sigma_high:
            break
        if bisection or sigma_low <= 0:
            sigma = 0.5 * (sigma_low + sigma_high)
        else:
            sigma = _false_position(sigma_low, f_low, sigma_high, f_high)
        eps = eps_at(sigma)
        if eps <= target:
            sigma_high, eps_high, f_high = sigma, eps, math.log(max(eps, 1e-300) / aim)
            f_low, kept = (0.5 * f_low if kept == "high" else f_low), "high"
        else:
            sigma_low, f_low = sigma, math.log(eps / aim)
            f_high, kept = (0.5 * f_high if kept == "low" else f_high), "low"
    log.debug(
        "calibrated sigma=%.6g: epsilon=%.6g for target %.6g (q=%g, steps=%d, delta=%g, %s)",
        sigma_high, eps_high, target, rate, steps, delta, accountant,
    )
    return sigma_high


def _unreachable(target: float, rate: float, steps: int, delta: float) -> ValueError:
    return ValueError(
        f"target_epsilon={target:g} is too small: sigma would have to exceed "
        f"{MAX_SIGMA:g} (q={rate:g}, steps={steps}, delta={delta:g})"
    )


def _bracket(eps_at: Callable[[float], float], target: float, aim: float,
             tolerance: float) -> tuple[float, float, float, float]:
    """``(σ_low, ε(σ_low), σ_high, ε(σ_high))`` with ε(σ_low) > target >= ε(σ_high), in a few probes.

    ε(σ) of a (sub)sampled Gaussian falls at least as fast as 1/σ (about 1/σ where noise dominates,
    up to 1/σ² where it does not), so from a probe (σ, ε) the next one is σ·ε/aim: where the
    probe was infeasible this lands at or above the σ that reaches ``aim`` (steps of at least 2×,
    as Opacus' doubling), where it was feasible at or below it (steps of at most 64×, so an
    ε near 0 does not send the search to σ ≈ 0). The first probe is Opacus' (σ = 20). A feasible
    probe already within ``tolerance`` of the target ends the search with σ_low = 0. σ_high
    above :data:`MAX_SIGMA` means the target is unreachable.
    """
    sigma, low, eps_low, high, eps_high = 2.0 * _SIGMA_START, 0.0, math.inf, math.inf, math.inf
    for _ in range(_MAX_BISECTIONS):  # ends within a few probes unless ε stays below the target as σ -> 0
        if sigma > MAX_SIGMA:
            break
        eps = eps_at(sigma)
        if eps <= target:
            high, eps_high = sigma, eps
            if low > 0 or target - eps <= tolerance:
                break
            sigma *= max(eps / aim, 1 / 64)
        else:
            low, eps_low = sigma, eps
            if high <= MAX_SIGMA:
                break
            sigma = min(sigma * max(2.0, eps / aim), MAX_SIGMA) if sigma < MAX_SIGMA else math.inf
    return low, eps_low, high, eps_high


def _false_position(sigma_low: float, f_low: float, sigma_high: float, f_high: float) -> float:
    """The root of the line through (log σ_low, f_low) and (log σ_high, f_high), f_low > 0 > f_high.

    The geometric midpoint where f_low is infinite or the root leaves the inner 99.8% of the bracket.
    """
    middle = math.sqrt(sigma_low * sigma_high)
    if not math.isfinite(f_low):
        return middle
    x0, x1 = math.log(sigma_low), math.log(sigma_high)
    sigma = math.exp(x1 - f_high * (x1 - x0) / (f_high - f_low))
    margin = 1e-3 * (sigma_high - sigma_low)
    return sigma if sigma_low + margin < sigma < sigma_high - margin else middle

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
