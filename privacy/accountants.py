"""Cumulative ε of composed (sub)sampled Gaussian mechanisms, via Opacus' accountants.

Every mechanism in this project, whether a DP-SGD step (sample level) or one noisy model
update (client level), is a Poisson-subsampled Gaussian mechanism: a sum of contributions
that each lie in the L2 ball of radius C, over a subset that contains each record (or
client) independently with probability q, released with N(0, σ²C²) noise. Its privacy is
fully described by the triple ``(σ, q, n)`` for n repetitions, the same triple Opacus keeps
in ``accountant.history``. This module turns a list of such triples into an (ε, δ)
guarantee under a **neighbouring relation**:

* ``"replace-one"`` (the default, and what every ledger charges): the neighbouring dataset
  has the same size, one unit (record or client) replaced by any other. This is the
  coherent relation when the dataset size is public, as it is here (clients publish their
  example counts, and DP-SGD's q = 1/⌈n/B⌉ depends on n). One unit moves the sum by up to
  2C; under Poisson sampling the dominating pair is (1−q)N(0, σ²) + qN(−1, σ²) against
  (1−q)N(0, σ²) + qN(1, σ²) in units of C (dp_accounting's ``REPLACE_ONE``).
* ``"add-remove"``: one unit added or removed (sensitivity C). Offered only to compare with
  papers that calibrate this way (e.g. GDPFed's Table 5); no ledger charges it.

Accountants:

* ``"rdp"``: Rényi DP, composed additively per order and converted with the improved bound
  of Balle et al. 2020 (Thm. 21): ε = min_α [ Σ_i n_i ρ_i(α) + log((α-1)/α) − (log δ +
  log α)/(α−1) ]. For add/remove, ρ is the RDP of the sampled Gaussian mechanism (Mironov,
  Talwar & Zhang 2019; Opacus). For replace-one, ρ(α) = 2α/σ² at q = 1 (a Gaussian with
  sensitivity 2C), and for q < 1 the smaller of that and the weak triangle inequality of
  Rényi divergence (Mironov 2017, Prop. 11) through the dataset without the unit:
  ρ_rep(α) <= (α − ½)/(α − 1) · ρ_ar(2α) + ρ_ar(2α − 1).
* ``"prv"``: numerical privacy-loss distributions. Replace-one: Google's ``dp_accounting``
  PLD accountant (``NeighboringRelation.REPLACE_ONE``, pessimistic connect-the-dots
  discretisation); add/remove: Opacus' ``PRVAccountant`` (Gopi, Lee & Wutschitz 2021). A
  history without sampling (every q = 1: update-mode uploads, DP-SGD with one batch per
  epoch) composes to a single Gaussian, whose ε is computed exactly
  (:func:`_gaussian_epsilon`) instead. The value returned is the minimum of this and the
  RDP bound (two valid upper bounds).

Both report an *upper bound* on the true ε; neither is an estimate.

**Steps that carry an RDP curve** (:class:`CurveStep`): a mechanism that is not a Gaussian, charged by
its own Rényi-DP curve per release (:mod:`privacy.poisson_rdp`: the distributed discrete Gaussian,
Poisson-subsampled). A history holding one is composed in RDP at the curve's integer orders and
converted like ``"rdp"`` above, whatever accountant was asked for: its (ε, δ) profile is not known,
only its RDP bound. Replace-one only.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from privacy.checks import (
    check_choice,
    check_delta,
    check_step,
)

__all__ = [
    "ACCOUNTANTS",
    "ADD_REMOVE",
    "DEFAULT_ACCOUNTANT",
    "RELATIONS",
    "REPLACE_ONE",
    "BUDGET_RTOL",
    "Charge",
    "CurveStep",
    "OPACUS_ALPHAS",
    "PRV_EPS_ERROR",
    "PRV_MAX_EPSILON",
    "RDP_ORDERS",
    "Step",
    "canonical_history",
    "curve_orders",
    "epsilon_of",
    "exceeds_budget",
    "merge_curve",
    "merge_step",
]

log = logging.getLogger(__name__)

#: Accountant names accepted everywhere in this package.
ACCOUNTANTS: tuple[str, ...] = ("rdp", "prv")

#: The accountant clients and server use unless a run names another: the replace-one PLD
#: (tight) with the RDP bound as a fallback.
DEFAULT_ACCOUNTANT = "prv"

#: Neighbouring relations (see the module docstring).
REPLACE_ONE = "replace-one"
ADD_REMOVE = "add-remove"
RELATIONS: tuple[str, ...] = (REPLACE_ONE, ADD_REMOVE)

#: Value discretisation of the replace-one PLD accountant: ε is pessimistic (an upper bound)
#: and within about 1e-3 of the 1e-4 discretisation, at a tenth of its cost.
PLD_DISCRETIZATION = 1e-3

#: One history entry: ``(noise_multiplier, sample_rate, num_steps)``, as in Opacus.
Step = tuple[float, float, int]


class CurveStep(ABC):
    """A history entry charged by its own Rényi-DP curve: ``count`` releases of one mechanism (module docstring).

    Implementations are frozen (hashable) dataclasses in :mod:`privacy.poisson_rdp`.
    """

    count: int

    @property
    @abstractmethod
    def key(self) -> tuple[Any, ...]:
        """The mechanism without its count: entries with equal keys merge."""

    @abstractmethod
    def with_count(self, count: int) -> CurveStep:
        """The same mechanism released ``count`` times."""

    @abstractmethod
    def rdp(self, orders: tuple[int, ...]) -> np.ndarray:
        """Replace-one RDP of one release at each of ``orders``."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""

    @abstractmethod
    def describe(self) -> str:
        """One line for messages."""


#: One history entry of either kind.
Charge = Step | CurveStep

#: Opacus' ``RDPAccountant.DEFAULT_ALPHAS`` (1.1 … 10.9, then 12 … 63).
OPACUS_ALPHAS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)]
)

#: Orders used for RDP: Opacus' defaults plus dp_accounting's large orders. ε is a minimum
#: over orders, so extra orders can only tighten the (still valid) bound; without them the
#: RDP bound cannot go below ≈ 0.103 at δ = 1e-5 for any σ, and the small budgets of PFA's
#: MixGauss distributions (ε ≈ 0.1) could not be calibrated. Where Opacus' optimum lies
#: below 63, as in its golden value (ε ≈ 7.3291) and GDPFed's σ, the result is unchanged.
RDP_ORDERS: tuple[float, ...] = OPACUS_ALPHAS + (128.0, 256.0, 512.0, 1024.0)

#: Additive ε slack of the PRV accountant (Opacus' default ``eps_error``).
PRV_EPS_ERROR = 0.01

#: Above this RDP ε the PRV accountant is skipped and the RDP bound returned: no meaningful
#: guarantee remains there, while Opacus' PRV discretisation becomes slow (minutes) or
#: returns ``inf``.
PRV_MAX_EPSILON = 50.0

#: Relative slack when comparing a projected ε with a budget: float round-off between a
#: history composed at once and the same history recorded in pieces, far below the
#: accountants' own numerical error.
BUDGET_RTOL = 1e-9


def import_opacus() -> ModuleType:
    """``opacus``, imported without the stderr handler it would put on the root logger.

    Opacus 1.6 calls ``logging.basicConfig`` when it is imported, which prints every Flower
    line a second time (Flower's logger propagates to the root). ``basicConfig`` does nothing
    while the root logger has a handler, so one is held there for the import only. Imported
    lazily (torch, scipy and Opacus cost seconds), so a message that needs no accounting or
    DP-SGD (a budget query) never pays for it.
    """
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        import opacus
    finally:
        root.removeHandler(placeholder)
    module: ModuleType = opacus
    return module


@lru_cache(maxsize=1)
def _opacus_rdp() -> ModuleType:
    """Opacus' RDP analysis, ``opacus/accountants/analysis/rdp.py``, without importing ``opacus``.

    The file needs only numpy and scipy.special. Importing it as ``opacus.accountants.analysis.rdp``
    would first run ``opacus/__init__``, which builds the PrivacyEngine, its optimizers and
    ``torch.distributed.tensor`` (about 1 s of a client's start-up, #38) although RDP accounting
    uses none of them. So the same file is executed as a module of its own; where Opacus is already
    imported (a DP-SGD client), its module is used.
    """
    loaded = sys.modules.get("opacus.accountants.analysis.rdp")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("opacus")
    if package is None or not package.submodule_search_locations:  # pragma: no cover
        raise ImportError("privacy accounting needs Opacus; install it with `pip install opacus==1.6.0`")
    path = Path(next(iter(package.submodule_search_locations))) / "accountants" / "analysis" / "rdp.py"
    spec = importlib.util.spec_from_file_location("privacy._opacus_rdp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _opacus_accountants() -> ModuleType:
    """``opacus.accountants``, imported lazily: it pulls in torch, which only accounting needs."""
    try:
        import_opacus()
        import opacus.accountants
        import opacus.accountants.analysis.rdp
    except ImportError as exc:  # pragma: no cover - opacus is a hard dependency
        raise ImportError(
            "privacy accounting needs Opacus; install it with `pip install opacus==1.6.0`"
        ) from exc
    accountants: ModuleType = opacus.accountants
    return accountants


def canonical_history(history: Iterable[Sequence[Any] | CurveStep]) -> tuple[Charge, ...]:
    """Validate a history and bring it to a canonical, shortest form.

    Entries that cost nothing (q = 0 or n = 0) are dropped, and all entries with the same
    ``(σ, q)`` are merged by summing their counts, in order of first appearance. This does
    not change ε: composition of mechanisms is commutative (RDP adds per order, PRVs
    convolve), and n self-compositions are n self-compositions however they are split.

    Raises
    ------
    ValueError
        If an entry is not a ``(σ >= 0, q in [0, 1], n >= 0 integer)`` triple.
    """
    merged: dict[tuple[float, float], int] = {}
    curves: dict[tuple[Any, ...], CurveStep] = {}
    for i, raw in enumerate(history):
        if isinstance(raw, CurveStep):
            if raw.count:
                old = curves.get(raw.key)
                curves[raw.key] = raw if old is None else raw.with_count(old.count + raw.count)
            continue
        sigma, rate, count = check_step(raw, name=f"history[{i}]")
        if rate == 0.0 or count == 0:
            continue
        merged[(sigma, rate)] = merged.get((sigma, rate), 0) + count
    return tuple((sigma, rate, count) for (sigma, rate), count in merged.items()) + tuple(curves.values())


def merge_step(history: list[Step], step: Step) -> None:
    """Append ``step`` to ``history`` in place, merging it into an identical last entry.

    Consecutive entries with equal ``(σ, q)`` become one entry with the summed count, as
    Opacus' accountants do; the order of distinct entries is kept for auditing.
    """
    if history and history[-1][0] == step[0] and history[-1][1] == step[1]:
        history[-1] = (step[0], step[1], history[-1][2] + step[2])
    else:
        history.append(step)


def merge_curve(curves: list[CurveStep], step: CurveStep) -> None:
    """:func:`merge_step` for steps that carry their RDP curve: equal keys merge, counts add."""
    if curves and curves[-1].key == step.key:
        curves[-1] = step.with_count(curves[-1].count + step.count)
    else:
        curves.append(step)


def exceeds_budget(epsilon: float, budget: float) -> bool:
    """Whether ``epsilon`` is over ``budget`` by more than the relative slack ``BUDGET_RTOL``.

    An infinite budget is never exceeded; an infinite ε exceeds every finite budget.
    """
    return epsilon > budget * (1.0 + BUDGET_RTOL)


def epsilon_of(
    history: Sequence[Charge], delta: float, accountant: str = "rdp", relation: str = REPLACE_ONE
) -> float:
    """Cumulative ε of a composed history of (sub)sampled Gaussian mechanisms.

    Parameters
    ----------
    history : sequence of (float, float, int)
        ``(noise_multiplier σ, sample_rate q, num_steps n)`` triples: n applications of a
        Poisson-subsampled Gaussian mechanism with noise std σ·C for sensitivity C.
    delta : float
        Target δ, in (0, 1).
    accountant : {"rdp", "prv"}
        ``"rdp"``: RDP over :data:`RDP_ORDERS` (module docstring). ``"prv"``: a numerical
        privacy-loss distribution (replace-one: dp_accounting's PLD; add/remove: Opacus'
        ``PRVAccountant`` with ``eps_error = PRV_EPS_ERROR``, whose ``get_epsilon``
        already returns the *upper* end of its error interval); the value returned is
        ``min(ε_numerical, ε_RDP)``, a minimum of two valid upper bounds and hence itself
        one. Where the numerical accountant cannot answer (it raises, or returns ``inf``),
        or the RDP ε exceeds :data:`PRV_MAX_EPSILON`, the RDP bound is returned; a failure
        is logged as a warning.
    relation : {"replace-one", "add-remove"}
        The neighbouring relation the guarantee is stated for (module docstring).

    Returns
    -------
    float
        ε >= 0 such that the composition is (ε, δ)-DP. ``0.0`` for an empty history (or one
        whose entries all have q = 0 or n = 0); ``math.inf`` if an entry with σ = 0 ran at
        least once.

    Raises
    ------
    ValueError
        If δ is not in (0, 1), the accountant is unknown, or an entry is malformed.

    Notes
    -----
    Results are cached per (canonical history, δ, accountant); the canonical form
    (:func:`canonical_history`) makes a history recorded round by round give exactly the
    same value as the same history composed at once.
    """
    delta = check_delta(delta)
    accountant = check_choice("accountant", accountant, ACCOUNTANTS)
    relation = check_choice("relation", relation, RELATIONS)
    return epsilon_of_valid(canonical_history(history), delta, accountant, relation)


def epsilon_of_valid(steps: Sequence[Charge], delta: float, accountant: str, relation: str = REPLACE_ONE) -> float:
    """:func:`epsilon_of` on arguments validated at the edge (a ledger's history, a calibration's prior).

    Validation happens once, where a value enters (the ledger's constructor and ``record``, the
    public functions here); the inner loops (a calibration's bisection, a ledger's checks) call this.
    A history holding a :class:`CurveStep` is composed and converted through RDP at the integer orders
    (module docstring).
    """
    merged: dict[tuple[float, float], int] = {}
    curves: dict[tuple[Any, ...], CurveStep] = {}
    for step in steps:
        if isinstance(step, CurveStep):
            if step.count:
                old = curves.get(step.key)
                curves[step.key] = step if old is None else step.with_count(old.count + step.count)
            continue
        sigma, rate, count = step
        if rate != 0.0 and count != 0:
            merged[(sigma, rate)] = merged.get((sigma, rate), 0) + count
    if not merged and not curves:
        return 0.0
    if any(sigma == 0.0 for sigma, _ in merged):
        return math.inf
    gaussian = tuple((s, q, n) for (s, q), n in merged.items())
    if curves:
        if relation != REPLACE_ONE:
            raise ValueError("steps that carry an RDP curve are accounted under replace-one only")
        return _curve_epsilon(gaussian, tuple(curves.values()), delta)
    return _epsilon_cached(gaussian, delta, accountant, relation)


def curve_orders() -> tuple[int, ...]:
    """The integer orders 2-256 a history holding a :class:`CurveStep` converts at (``poisson_rdp.CURVE_ORDERS``)."""
    return tuple(int(a) for a in RDP_ORDERS if float(a).is_integer() and 2 <= a <= 256)


@lru_cache(maxsize=1024)
def _curve_epsilon(gaussian: tuple[Step, ...], curves: tuple[CurveStep, ...], delta: float) -> float:
    """RDP composition at :func:`curve_orders` of Gaussian steps (replace-one) and curve steps, then conversion.

    The conversion is Opacus' (Balle et al. 2020, Thm. 21), the one :func:`_rdp_epsilon` uses.
    """
    analysis = _opacus_rdp()
    orders = curve_orders()
    as_float = tuple(float(a) for a in orders)
    rdp = np.zeros(len(orders))
    for sigma, rate, count in gaussian:
        rdp = rdp + np.asarray(_replace_one_rdp_curve(sigma, rate, as_float)) * count
    for step in curves:
        rdp = rdp + np.asarray(step.rdp(orders), dtype=np.float64) * step.count
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eps, _ = analysis.get_privacy_spent(orders=list(as_float), rdp=rdp, delta=delta)
    for w in caught:
        log.debug("RDP accountant: %s", w.message)
    eps = float(eps)
    if math.isnan(eps):
        return math.inf
    return max(0.0, eps)


@lru_cache(maxsize=4096)
def _epsilon_cached(steps: tuple[Step, ...], delta: float, accountant: str, relation: str) -> float:
    rdp = _rdp_epsilon(steps, delta, relation)
    if accountant == "rdp":
        return rdp
    if all(rate >= 1.0 for _, rate, _ in steps):  # no sampling: the exact Gaussian profile
        return min(_gaussian_epsilon(steps, delta, relation), rdp)
    if relation == REPLACE_ONE:
        return _pld_epsilon(steps, delta, rdp)
    return _prv_epsilon(steps, delta, rdp)


def _gaussian_epsilon(steps: tuple[Step, ...], delta: float, relation: str) -> float:
    """Exact ε of composed Gaussian mechanisms without sampling (every q = 1).

    n releases at multiplier σ of a sum with sensitivity Δ (2 under replace-one, 1 under
    add/remove, in units of C) compose to one Gaussian pair N(0, 1) vs N(μ, 1) with
    μ² = Σ_i n_i Δ²/σ_i² (Dong, Roth & Su 2022, Cor. 3.3), whose privacy profile is
    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) (Balle & Wang 2018, Thm. 8). ε is the root of
    δ(ε) = δ, found by bisection on the bracket [ε with δ(ε) > δ, ε with δ(ε) <= δ]; the end
    returned is the verified one, so ε is an upper bound; what the PLD accountant approximates
    with a discretisation, in microseconds instead of ~50 ms (and without scipy.optimize).
    """
    from scipy.special import log_ndtr

    sensitivity = 2.0 if relation == REPLACE_ONE else 1.0
    mu = math.sqrt(sum(count * (sensitivity / sigma) ** 2 for sigma, _, count in steps))

    def excess(eps: float) -> float:  # log δ(ε) − log δ, decreasing in ε
        log_first = float(log_ndtr(mu / 2 - eps / mu))
        log_second = eps + float(log_ndtr(-mu / 2 - eps / mu))
        gap = log_first + math.log1p(-math.exp(min(log_second - log_first, 0.0))) if log_second < log_first \
            else -math.inf
        return gap - math.log(delta)

    if excess(0.0) <= 0:
        return 0.0
    low, high = 0.0, 1.0  # excess(low) > 0 >= excess(high)
    while excess(high) > 0:
        low, high = high, 2.0 * high
    while high - low > 1e-12 * max(1.0, high):
        middle = 0.5 * (low + high)
        if excess(middle) > 0:
            low = middle
        else:
            high = middle
    return high


def _rdp_epsilon(steps: tuple[Step, ...], delta: float, relation: str = REPLACE_ONE) -> float:
    """``RDPAccountant.get_epsilon(delta, alphas=RDP_ORDERS)`` on ``steps``, to float round-off.

    Opacus' accountant sums ``compute_rdp(q, σ, n, orders)`` (= n · per-step RDP) over the
    history and converts once; we do the same with the same series summed in numpy
    (:mod:`privacy.sampled_gaussian_rdp`), and keep each (σ, q)'s per-step RDP curve in a
    cache, so a ledger that grows round by round does not recompute old entries.
    """
    analysis = _opacus_rdp()
    orders = RDP_ORDERS
    curve = _rdp_curve if relation == ADD_REMOVE else _replace_one_rdp_curve
    rdp = sum([np.asarray(curve(sigma, rate, orders)) * count for sigma, rate, count in steps])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eps, _ = analysis.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    for w in caught:  # "Optimal order is the smallest/largest alpha": still a valid bound
        log.debug("RDP accountant: %s", w.message)
    eps = float(eps)
    if math.isnan(eps):
        return math.inf
    return max(0.0, eps)  # the conversion can dip below 0 for negligible RDP; ε >= 0


@lru_cache(maxsize=4096)
def _rdp_curve(sigma: float, rate: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    """Per-step RDP of the q-subsampled Gaussian with multiplier σ at each order (add/remove).

    Opacus' ``compute_rdp`` series, summed in numpy (:mod:`privacy.sampled_gaussian_rdp`, imported
    here: it loads scipy, which validating a config does not need).
    """
    from privacy.sampled_gaussian_rdp import rdp_curve

    return tuple(float(x) for x in rdp_curve(rate, sigma, orders))


@lru_cache(maxsize=4096)
def _replace_one_rdp_curve(sigma: float, rate: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    """Per-step RDP of the q-subsampled Gaussian under replace-one (module docstring).

    q = 1: exactly 2α/σ² (sensitivity 2C). q < 1: the weak triangle inequality through the
    dataset without the replaced unit, capped by the q = 1 value (subsampling never hurts:
    Rényi divergence is jointly quasi-convex, and the coupled components differ by 2C).
    """
    full = np.asarray([2.0 * a / sigma**2 for a in orders])
    if rate >= 1.0:
        return tuple(float(x) for x in full)
    a = np.asarray(orders, dtype=np.float64)
    doubled = np.asarray(_rdp_curve(sigma, rate, tuple(float(x) for x in 2.0 * a)))
    doubled_less_one = np.asarray(_rdp_curve(sigma, rate, tuple(float(x) for x in 2.0 * a - 1.0)))
    triangle = (a - 0.5) / (a - 1.0) * doubled + doubled_less_one
    return tuple(float(x) for x in np.minimum(triangle, full))


@lru_cache(maxsize=1024)
def _replace_one_pld(sigma: float, rate: float) -> Any:
    """Build dp_accounting's PLD of one replace-one subsampled Gaussian step.

    The PLD is immutable (composing returns new objects), so it is cached: building it costs
    most of an ε evaluation.
    """
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    return pld_lib.from_gaussian_mechanism(
        sigma,
        sampling_prob=rate,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
        value_discretization_interval=PLD_DISCRETIZATION,
    )


def _pld_epsilon(steps: tuple[Step, ...], delta: float, rdp_eps: float) -> float:
    """min(dp_accounting's replace-one PLD ε, the RDP bound)."""
    if not math.isfinite(rdp_eps) or rdp_eps > PRV_MAX_EPSILON:
        return rdp_eps
    try:
        composed = None
        for sigma, rate, count in steps:
            pld = _replace_one_pld(sigma, rate).self_compose(count)
            composed = pld if composed is None else composed.compose(pld)
        if composed is None:
            return rdp_eps
        with np.errstate(all="ignore"):
            eps = float(composed.get_epsilon_for_delta(delta))
    except (ArithmeticError, RuntimeError, ValueError) as exc:
        log.warning("PLD accountant failed on history %s at delta=%g (%s); using the RDP bound %.6g",
                    list(steps), delta, exc, rdp_eps)
        return rdp_eps
    if math.isnan(eps):
        return rdp_eps
    return max(0.0, min(eps, rdp_eps))


def _prv_epsilon(steps: tuple[Step, ...], delta: float, rdp_eps: float) -> float:
    if not math.isfinite(rdp_eps) or rdp_eps > PRV_MAX_EPSILON:
        return rdp_eps
    acc = _opacus_accountants().PRVAccountant()
    acc.history = list(steps)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eps = float(acc.get_epsilon(delta=delta, eps_error=PRV_EPS_ERROR))
    except (ArithmeticError, RuntimeError, ValueError) as exc:
        log.warning(
            "PRV accountant failed on history %s at delta=%g (%s); using the RDP bound %.6g",
            list(steps), delta, exc, rdp_eps,
        )
        return rdp_eps
    if math.isnan(eps):
        log.warning("PRV accountant returned NaN; using the RDP bound %.6g", rdp_eps)
        return rdp_eps
    return max(0.0, min(eps, rdp_eps))
