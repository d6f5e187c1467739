"""The privacy of the distributed discrete Gaussian sum (:mod:`privacy.distributed_discrete_gaussian`).

Kairouz, Liu & Steinke, ICML 2021 (KLS); n members of a sum each add N_Z(0, σ²) to their rounded,
rotated integer input x̃ (‖x̃‖₂² <= B², d' coordinates) and only the sum mod 2^b is released.

**Privacy** holds against whoever sees the released sum but none of the n noise shares in
it (the server; a member, who knows its own share, sees n − 1: the caller chooses n). It is
the discrete Gaussian's, with sensitivity measured on the integer vectors: the rounding is
part of the client's randomised map (Rényi divergence is jointly quasi-convex, so any two
rounded inputs within the bound may be paired), and the bound B is enforced exactly in
integer arithmetic, so no float result enters the guarantee. The sum of n independent
N_Z(0, σ²) is not a discrete Gaussian; KLS bound its Rényi divergence (their Theorem 1,
which defines τ; the three-term form is Proposition 14 / eq. (17) of the arXiv version, as
the authors' reference code ``distributed_dp/accounting_utils.py`` cites it, and the tests
check it against the exact divergence of the summed pmf): for integer Δ ∈ Z^{d'},
σ >= 1/2, α >= 1,

    D_α(Z + Δ ‖ Z) <= min{ α‖Δ‖₂²/(2nσ²) + τd',
                           (α/2)·(‖Δ‖₂²/(nσ²) + 2‖Δ‖₁τ/(√n σ) + τ²d'),
                           (α/2)·(‖Δ‖₂/(√n σ) + τ√d')² },                               (1)
    τ = 10 · Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1)).                                          (2)

Every term grows with τ and falls with n·σ², and τ grows with n, so when the number of
noise shares in a released sum lies in [n_min, n_max], evaluating (1) at n_min and τ at
n_max bounds every case (:func:`rdp_of_sum`). Sensitivities (:func:`sensitivities`), with
B² the enforced bound on ‖x̃‖₂² and x̃ integer (so ‖x̃‖₁ <= min(√d'·B, B²)):

- replace-one (privet's relation): ‖Δ‖₂ <= 2B, ‖Δ‖₁ <= 2·min(√d'·B, B²);
- add-remove, read as *zero-out* (a member's input replaced by 0, its noise share kept, as
  in KLS and TFF): ‖Δ‖₂ <= B, ‖Δ‖₁ <= min(√d'·B, B²).

T releases compose additively in RDP; (ε, δ) follows from the conversion of Canonne,
Kamath & Steinke 2020 (Prop. 12; dp_accounting's ``compute_epsilon``).

**In a ledger of Gaussian steps** (:mod:`privacy.ledger`, ``(σ, q, n)`` triples) a release is
charged as the Gaussian step (σ_eq, 1, 1) whose replace-one RDP curve 2α/σ_eq² lies on or
above eq. (1) at every order α the RDP accountant converts at (:data:`RDP_ORDERS`):

    σ_eq = min_{α ∈ RDP_ORDERS} √(2α / ε_DDG(α))                                        (4)

(:func:`gaussian_equivalent_multiplier`). Composed in RDP and converted at those orders, the
ledger's ε is then at least the ε of the true bound (RDP adds per order, and the conversion
ε = min_α [ρ(α) + log((α−1)/α) − (log δ + log α)/(α−1)] is increasing in every ρ(α)), so it
stays an upper bound. It is *not* an upper bound when converted through a privacy-loss
distribution: RDP dominance does not imply dominance of the (ε, δ) profile, so a ledger that
holds such a step converts its whole history through RDP (:data:`privacy.ledger.RDP_ONLY_MODES`).
With the third term of (1), ε_DDG(α) <= (α/2)(‖Δ‖₂/(√n σ) + τ√d')², (4) is never below
2/(‖Δ‖₂/(√n σ) + τ√d'); for σ² >= 4 in integer units τ <= 10⁻¹⁶·(n − 1), and (4) is √n σ/B
under replace-one to within float round-off: the Gaussian mechanism's own multiplier at
sensitivity 2B. Poisson sampling of
members (rate q) is amplified with the general upper bound of Zhu & Wang (ICML 2019) for
any mechanism's integer-order RDP (:func:`privacy.subsampled_rdp.poisson_subsampled_rdp`), as KLS's
code does — offered for zero-out only, and only meaningful where the sampling is hidden from the
adversary: a plain secure sum's members are picked by the server, so they charge q = 1
(:func:`ddg_epsilon`); a GDPFed group's members charge their group's q_m through the replace-one
curve step of :mod:`privacy.poisson_rdp`, under GDPFed's stated sampling assumption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from privacy.accountants import ADD_REMOVE, RDP_ORDERS, RELATIONS, REPLACE_ONE
from privacy.subsampled_rdp import poisson_subsampled_rdp

__all__ = ["SUBSAMPLED_ORDERS", "ddg_epsilon", "gaussian_equivalent_multiplier", "rdp_of_sum", "round_up_sigma_sq",
           "sensitivities", "smallest_local_sigma_sq", "tau"]

#: Integer RDP orders for the subsampled bound (Zhu & Wang's sum runs over 2 … α).
SUBSAMPLED_ORDERS: tuple[int, ...] = tuple(range(2, 257))

#: Largest σ² with a fractional part allowed to stay (below it, σ² is rounded up to a
#: multiple of 2⁻²⁰; above, up to an integer).
_SIGMA_GRID = 2**20


def round_up_sigma_sq(value: float) -> Fraction:
    """σ² rounded up onto the grid every member's noise is drawn at: an integer, or a multiple of 2⁻²⁰ below 1."""
    if value >= 1.0:
        return Fraction(math.ceil(value))
    return Fraction(math.ceil(value * _SIGMA_GRID), _SIGMA_GRID)


def tau(local_sigma_sq: float | Fraction, shares: int) -> float:
    """Eq. (2): τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1)) (0 for n = 1)."""
    s2 = float(local_sigma_sq)
    k = np.arange(1, int(shares), dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * s2 * k / (k + 1.0))))


def sensitivities(norm_bound_sq: int, padded_dim: int, relation: str = REPLACE_ONE) -> tuple[float, float]:
    """(‖Δ‖₂, ‖Δ‖₁) bounds for one member's change of its rounded input (module docstring)."""
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {', '.join(RELATIONS)}; found {relation!r}")
    if isinstance(norm_bound_sq, bool) or not isinstance(norm_bound_sq, int) or norm_bound_sq < 1:
        raise ValueError(f"norm_bound_sq must be an integer >= 1; found {norm_bound_sq!r}")
    bound = math.sqrt(norm_bound_sq)
    factor = 2.0 if relation == REPLACE_ONE else 1.0
    return factor * bound, factor * min(math.sqrt(padded_dim) * bound, float(norm_bound_sq))


def rdp_of_sum(orders: Sequence[float] | np.ndarray, *, l2_sensitivity: float, l1_sensitivity: float,
               local_sigma_sq: float | Fraction, dim: int, min_shares: int,
               max_shares: int | None = None) -> np.ndarray:
    """Eq. (1): RDP at each order of one release of a sum holding n in [n_min, n_max] noise shares.

    ``dim`` is the number of noised coordinates (d'). σ is the local (per share) parameter
    in the same units as the sensitivities.

    Raises
    ------
    ValueError
        If σ < 1/2 (outside KLS's theorem), an order is below 1, or the share counts are invalid.
    """
    s2 = float(local_sigma_sq)
    if not s2 >= 0.25:
        raise ValueError(f"KLS's bound needs sigma >= 1/2 per share; found sigma^2 = {s2!r}")
    n_max = min_shares if max_shares is None else max_shares
    if min_shares < 1 or n_max < min_shares:
        raise ValueError(f"need 1 <= min_shares <= max_shares; found {min_shares}, {max_shares}")
    alpha = np.asarray(orders, dtype=np.float64)
    if np.any(alpha < 1.0):
        raise ValueError("Renyi orders must be >= 1")
    t = tau(s2, n_max)
    a2 = l2_sensitivity**2 / (min_shares * s2)
    a1 = l1_sensitivity / math.sqrt(min_shares * s2)
    first = alpha / 2.0 * a2 + t * dim
    second = alpha / 2.0 * (a2 + 2.0 * a1 * t + t * t * dim)
    third = alpha / 2.0 * (math.sqrt(a2) + t * math.sqrt(dim)) ** 2
    return np.minimum(np.minimum(first, second), third)


def ddg_epsilon(*, local_sigma_sq: float | Fraction, norm_bound_sq: int, padded_dim: int, min_shares: int,
                rounds: int, delta: float, max_shares: int | None = None, sample_rate: float = 1.0,
                relation: str = REPLACE_ONE) -> float:
    """ε after ``rounds`` releases of the distributed discrete Gaussian sum, at ``delta``.

    RDP of eq. (1) (subsampled by Zhu & Wang for q < 1, zero-out only), times ``rounds``,
    converted with Canonne, Kamath & Steinke 2020, Prop. 12.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0; found {rounds!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1); found {delta!r}")
    if sample_rate < 1.0 and relation != ADD_REMOVE:
        raise ValueError("sampling amplification is offered for add-remove (zero-out) neighbours only; "
                         "charge sample_rate=1 under replace-one")
    if rounds == 0:
        return 0.0
    l2, l1 = sensitivities(norm_bound_sq, padded_dim, relation)

    def curve(alpha: np.ndarray) -> np.ndarray:
        return rdp_of_sum(alpha, l2_sensitivity=l2, l1_sensitivity=l1, local_sigma_sq=local_sigma_sq,
                          dim=padded_dim, min_shares=min_shares, max_shares=max_shares)

    if sample_rate >= 1.0:
        orders: Sequence[float] = RDP_ORDERS
        rdp = curve(np.asarray(orders, dtype=np.float64))
    else:
        orders = SUBSAMPLED_ORDERS
        rdp = poisson_subsampled_rdp(SUBSAMPLED_ORDERS, curve, sample_rate)
    return _epsilon_from_rdp(orders, rounds * rdp, delta)


def gaussian_equivalent_multiplier(*, local_sigma_sq: float | Fraction, norm_bound_sq: int, padded_dim: int,
                                   min_shares: int, max_shares: int | None = None,
                                   orders: Sequence[float] = RDP_ORDERS) -> float:
    """Eq. (4): the largest σ whose replace-one Gaussian RDP 2α/σ² is >= eq. (1) at every order.

    One release of the sum (replace-one sensitivities of :func:`sensitivities`), n in
    [``min_shares``, ``max_shares``] shares of N_Z(0, σ²) each. A ledger that charges
    (σ_eq, 1, 1) for it and converts through RDP at ``orders`` never reports less than the
    ε of eq. (1) composed and converted at the same orders (module docstring).
    """
    l2, l1 = sensitivities(norm_bound_sq, padded_dim, REPLACE_ONE)
    alpha = np.asarray(orders, dtype=np.float64)
    rdp = rdp_of_sum(alpha, l2_sensitivity=l2, l1_sensitivity=l1, local_sigma_sq=local_sigma_sq, dim=padded_dim,
                     min_shares=min_shares, max_shares=max_shares)
    sigma = float(np.min(np.sqrt(2.0 * alpha / rdp)))
    # round down until the Gaussian curve, as the accountant computes it, is on or above eq. (1)
    while np.any(2.0 * alpha / sigma**2 < rdp):
        sigma = math.nextafter(sigma, 0.0)
    return sigma


def smallest_local_sigma_sq(*, epsilon: float, delta: float, rounds: int, norm_bound_sq: int, padded_dim: int,
                            min_shares: int, max_shares: int | None = None, sample_rate: float = 1.0,
                            relation: str = REPLACE_ONE) -> Fraction:
    """Find the smallest local σ² (scaled units; an integer, or a multiple of 2⁻²⁰ below 1) with ε <= target.

    ε of :func:`ddg_epsilon` falls as σ² grows (every term of eq. 1 and τ do), so a
    bisection on log σ² finds it; the result is checked before it is returned.

    Raises
    ------
    ValueError
        If even σ² = 2⁶⁰ does not reach the target.
    """
    if not 0.0 < epsilon < math.inf:
        raise ValueError(f"epsilon must be > 0 and finite; found {epsilon!r}")

    def eps(s2: Fraction) -> float:
        return ddg_epsilon(local_sigma_sq=s2, norm_bound_sq=norm_bound_sq, padded_dim=padded_dim,
                           min_shares=min_shares, max_shares=max_shares, rounds=rounds, delta=delta,
                           sample_rate=sample_rate, relation=relation)

    low, high = Fraction(1, 4), Fraction(1, 4)
    while eps(high) > epsilon:
        low, high = high, high * 4
        if high > 2**60:
            raise ValueError(f"no sigma^2 <= 2^60 reaches epsilon={epsilon:g}")
    if high == low:
        return high
    while True:  # invariant: eps(low) > target >= eps(high)
        middle = round_up_sigma_sq(math.sqrt(float(low) * float(high)))
        if middle >= high or middle <= low:
            return high
        if eps(middle) <= epsilon:
            high = middle
        else:
            low = middle


def _epsilon_from_rdp(orders: Sequence[float], rdp: np.ndarray, delta: float) -> float:
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    eps, _ = compute_epsilon(list(orders), [float(r) for r in rdp], delta)
    return float(eps)
