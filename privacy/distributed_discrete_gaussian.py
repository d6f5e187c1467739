"""The distributed discrete Gaussian mechanism: integer updates with exact noise inside a secure sum.

Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning
with Secure Aggregation" (ICML 2021, arXiv:2102.06387; hereafter KLS), Algorithms 1–2, as
TensorFlow Federated implements them (``tff.aggregators.DistributedDpSumFactory`` with
``mechanism="distributed_dgauss"``, ``rotation_type="hd"``). Each of n members of a sum
turns its update x ∈ R^d into integers mod M = 2^b:

1. **clip** to ‖x‖₂ <= c;
2. **scale** by s = 1/γ (γ: the rounding granularity);
3. **rotate** with the randomised Hadamard transform R = H·D/√d', d' = 2^⌈log₂ d⌉ (x
   padded with zeros), D = diag of ±1 signs from a seed all members agree on, H the
   Sylvester–Hadamard matrix (entries ±1, H² = d'·I), so R is orthogonal and R⁻¹ = D·H/√d';
4. **round conditionally** (KLS §4.1): each coordinate to ⌊y_j⌋ + Bernoulli(y_j − ⌊y_j⌋),
   again until ‖x̃‖₂² <= B² (:func:`rounded_norm_bound`); with β = 0 this always holds;
5. **add noise** N_Z(0, σ²)^{d'} (exact, :mod:`privacy.discrete_gaussian`) and reduce mod M.

The secure sum returns Σ_i (x̃_i + z_i) mod M; the server lifts it to [−M/2, M/2), rotates
back and divides by s (:func:`decode`).

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

**Wrap-around** (utility, not privacy: the sum mod M is a post-processing). With each x_i
chosen independently of the signs D, coordinate j of Y = Σ_i (x̃_i + z_i) is a Rademacher
sum of the data (variance proxy s²‖Σx_i‖²/d' <= s²n²c²/d'), plus rounding errors (given D,
independent, mean 0, in an interval of length 1: proxy 1/4 each by Hoeffding's lemma; with
β > 0 only |e| < 1 is used), plus discrete Gaussians (σ²-subgaussian, CKS 2020). So

    P[some |Y_j| >= M/2] <= 2d'·exp(−M²/(8v)),       v = s²n²c²/d' + n/4 + nσ²   (β = 0),
                         <= 2d'·exp(−(M/2 − n)²/(2v')), v' = s²n²c²/d' + nσ²      (β > 0),   (3)

for at most n members (:func:`wrap_probability`); the lift to [−M/2, M/2) is then exact.
:func:`ddg_parameters` chooses the largest s for which (3) is at most the stated probability
(TFF's heuristic solves 2^b = 2k·√(c²n²/d' + (γ²/4 + σ²)n)/γ for a per-coordinate k; (3) is
the same shape with a union bound over coordinates).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from privacy.accountants import ADD_REMOVE, RDP_ORDERS, RELATIONS, REPLACE_ONE
from privacy.discrete_gaussian import discrete_gaussian
from privacy.randomness import NoiseSource
from privacy.subsampled_rdp import poisson_subsampled_rdp

__all__ = [
    "MAX_BITS",
    "SUBSAMPLED_ORDERS",
    "WRAP_PROBABILITY",
    "ConditionalRoundingError",
    "DDGParameters",
    "conditional_round",
    "ddg_epsilon",
    "ddg_parameters",
    "decode",
    "gaussian_equivalent_multiplier",
    "encode",
    "padded_dimension",
    "rdp_of_sum",
    "rotate",
    "rotation_signs",
    "rounded_norm_bound",
    "sensitivities",
    "smallest_local_sigma_sq",
    "tau",
    "unrotate",
    "wrap_probability",
]

#: Default bound on the probability that any coordinate of a sum wraps around mod M.
WRAP_PROBABILITY = 1e-6

#: Largest bit width: a sum mod 2^b travels packed in b bits (``protocol.secure_sum.pack_masked``), and the
#: centred lift and the rotation back stay exact in float64.
MAX_BITS = 32

#: Integer RDP orders for the subsampled bound (Zhu & Wang's sum runs over 2 … α).
SUBSAMPLED_ORDERS: tuple[int, ...] = tuple(range(2, 257))

#: Rotation keys are domain-separated from secure-sum masks expanded from the same seed.
_ROTATION_DOMAIN = b"privet/ddg/rotation/v1\x00"

#: Slack on the scaled clip before B is computed: the rotation's float error (~d'·2⁻⁵³
#: relative) must never push an honest rounding over B.
_NORM_SLACK = 1e-9

#: Largest σ² with a fractional part allowed to stay (below it, σ² is rounded up to a
#: multiple of 2⁻²⁰; above, up to an integer).
_SIGMA_GRID = 2**20


class ConditionalRoundingError(RuntimeError):
    """Conditional rounding found no vector within the norm bound in ``max_tries`` tries."""


# ---------------------------------------------------------------------------------------
# Randomised Hadamard rotation
# ---------------------------------------------------------------------------------------

def padded_dimension(dim: int) -> int:
    """Return d' = 2^⌈log₂ d⌉, the length the Hadamard transform needs."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1; found {dim!r}")
    return 1 << (dim - 1).bit_length()


def rotation_signs(seed: bytes, padded_dim: int) -> np.ndarray:
    """Expand the agreed seed into the diagonal of D: ``padded_dim`` signs ±1 (float64).

    ChaCha20 keyed with SHA-256(domain ‖ seed), zero nonce, one keystream bit per sign
    (as :func:`privacy.secure_sum.mask` expands a mask seed, with a different domain).
    """
    if not isinstance(seed, bytes) or not seed:
        raise ValueError("the rotation seed must be non-empty bytes that every member of the sum holds")
    key = hashlib.sha256(_ROTATION_DOMAIN + seed).digest()
    stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(-(-padded_dim // 8)))
    bits = np.unpackbits(np.frombuffer(stream, dtype=np.uint8))[:padded_dim]
    return 1.0 - 2.0 * bits.astype(np.float64)


def rotate(vector: np.ndarray, seed: bytes) -> np.ndarray:
    """R·x = H·D·x/√d' for x padded with zeros to d' (float64, length d')."""
    x = np.asarray(vector, dtype=np.float64).ravel()
    padded = padded_dimension(x.size)
    out = np.zeros(padded)
    out[:x.size] = x
    out *= rotation_signs(seed, padded)
    rotated: np.ndarray = _hadamard(out) / math.sqrt(padded)
    return rotated


def unrotate(rotated: np.ndarray, seed: bytes, dim: int) -> np.ndarray:
    """R⁻¹·y = D·H·y/√d', truncated to the first ``dim`` coordinates."""
    y = np.asarray(rotated, dtype=np.float64).ravel()
    padded = y.size
    if padded != padded_dimension(dim):
        raise ValueError(f"a rotated vector of {dim} coordinates has {padded_dimension(dim)}; found {padded}")
    out: np.ndarray = _hadamard(y) / math.sqrt(padded) * rotation_signs(seed, padded)
    return out[:dim]


def _hadamard(x: np.ndarray) -> np.ndarray:
    """H·x for the Sylvester–Hadamard H of order len(x) (a power of two), in O(d log d)."""
    out = np.array(x, dtype=np.float64)
    n, h = out.size, 1
    while h < n:
        view = out.reshape(-1, 2, h)
        top = view[:, 0, :].copy()
        view[:, 0, :] += view[:, 1, :]
        view[:, 1, :] = top - view[:, 1, :]
        h *= 2
    return out


# ---------------------------------------------------------------------------------------
# Conditional randomised rounding (KLS §4.1)
# ---------------------------------------------------------------------------------------

def rounded_norm_bound(norm: float, dim: int, beta: float) -> float:
    """B: a bound on ‖x̃‖₂ after conditional rounding of a vector of norm <= ``norm``.

    Rounding moves each coordinate by less than 1, so ‖x̃‖ < ‖x‖ + √d always (β = 0). For
    β in (0, 1): E‖x̃‖² <= ‖x‖² + d/4, and ‖x̃‖² is a sum of independent terms of range
    |2⌊x_j⌋ + 1| <= 2|x_j| + 1, so by Hoeffding
    P[‖x̃‖² > ‖x‖² + d/4 + √(2 ln(1/β))·(‖x‖ + √d/2)] <= β: one try succeeds with
    probability >= 1 − β, and

        B = min(‖x‖ + √d, √(‖x‖² + d/4 + √(2 ln(1/β))·(‖x‖ + √d/2)))

    (KLS §4.1, TFF ``inflated_l2_norm_bound``).
    """
    if not (norm >= 0 and math.isfinite(norm)):
        raise ValueError(f"norm must be finite and >= 0; found {norm!r}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must lie in [0, 1); found {beta!r}")
    root_d = math.sqrt(dim)
    plain = norm + root_d
    if beta == 0.0:
        return plain
    conditional = math.sqrt(norm * norm + dim / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta)) * (norm + root_d / 2.0))
    return min(plain, conditional)


def conditional_round(x: np.ndarray, norm_bound_sq: int, source: NoiseSource, *,
                      max_tries: int = 1000) -> tuple[np.ndarray, int]:
    """Round each coordinate up with probability its fractional part, again until ‖x̃‖² <= B².

    Returns the ``int64`` vector and the number of tries. The check is exact (integer
    arithmetic), so the returned vector always meets the bound the accounting uses.

    Raises
    ------
    ConditionalRoundingError
        After ``max_tries`` tries over the bound (probability <= β^max_tries for a vector
        within the norm :func:`rounded_norm_bound` was given).
    """
    y = np.asarray(x, dtype=np.float64)
    floor = np.floor(y)
    if not np.all(np.abs(floor) < 2.0**52):
        raise ValueError("conditional_round needs finite coordinates below 2^52 in magnitude")
    frac = y - floor  # exact in float64
    base = floor.astype(np.int64)
    for tries in range(1, max_tries + 1):
        rounded = base + (source.uniform(y.size) < frac)
        if _squared_norm(rounded) <= norm_bound_sq:
            return rounded, tries
    raise ConditionalRoundingError(f"conditional rounding stayed above the squared norm bound {norm_bound_sq} "
                                   f"in {max_tries} tries: was the input clipped to the scaled clip?")


def _squared_norm(v: np.ndarray) -> int:
    """Σ v_j² exactly, as a Python int."""
    if v.size == 0:
        return 0
    peak = int(np.max(np.abs(v)))
    if peak * peak * v.size < 2**63:
        return int(np.dot(v, v))
    return sum(a * a for a in v.tolist())


# ---------------------------------------------------------------------------------------
# Parameters: scale, noise, norm bound, modulus
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DDGParameters:
    """What every member of a sum and the server must agree on (all noise in scaled units).

    Attributes
    ----------
    dim : int
        d, the number of coordinates of an update.
    clip : float
        c, the L2 clipping norm of an update (unscaled).
    scale : float
        s = 1/γ: updates are multiplied by s before rounding; the sum is divided by s.
    beta : float
        Conditional rounding's β (0: plain randomised rounding, TFF's default).
    local_sigma_sq : Fraction
        σ² of each member's N_Z(0, σ²) noise per coordinate, in scaled units.
    norm_bound_sq : int
        B²: every rounded input satisfies ‖x̃‖₂² <= B², checked exactly.
    bits : int
        b: the sum is taken mod M = 2^b.
    max_members : int
        The most inputs a sum may hold (for the wrap-around bound).
    """

    dim: int
    clip: float
    scale: float
    beta: float
    local_sigma_sq: Fraction
    norm_bound_sq: int
    bits: int
    max_members: int

    @property
    def padded_dim(self) -> int:
        """Return d' = 2^⌈log₂ d⌉."""
        return padded_dimension(self.dim)

    @property
    def modulus(self) -> int:
        """M = 2^b."""
        return 1 << self.bits

    @property
    def wrap_probability(self) -> float:
        """Eq. (3) for ``max_members`` members."""
        return wrap_probability(self)


def ddg_parameters(*, clip: float, dim: int, bits: int, noise_multiplier: float, noise_shares: int,
                   max_members: int, beta: float = 0.0,
                   wrap_probability_target: float = WRAP_PROBABILITY) -> DDGParameters:
    """Choose the largest scale s with wrap-around probability (3) <= the target, and the noise for it.

    Each member's noise is σ² = ⌈z²c²s²/m⌉ in scaled units (z = ``noise_multiplier``, m =
    ``noise_shares``: m shares make the central N(0, z²c²) of the continuous mechanism,
    as privet's ``noise-shares`` does), rounded up to an integer (or to a multiple of
    2⁻²⁰ below 1). Solving (3) with v = s²(n²c²/d' + nz²c²/m) + n/4 + n (the last n
    covers the rounding up of σ²) for s gives

        s² = (M²/(8 L) − n/4 − n) / (n²c²/d' + n z²c²/m),   L = ln(2d'/p)   (β = 0),

    and (M/2 − n)²/(2L) − n in the numerator for β > 0. B² = ⌊B(s·c·(1 + 10⁻⁹), d', β)²⌋.

    Raises
    ------
    ValueError
        On a parameter outside its range, or when b bits cannot hold the sum at the target
        wrap-around probability (the message says which knob to turn).
    """
    _check_positive_finite("clip", clip)
    _check_positive_finite("noise_multiplier", noise_multiplier)
    for name, value in (("dim", dim), ("noise_shares", noise_shares), ("max_members", max_members)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1; found {value!r}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [2, {MAX_BITS}]; found {bits!r}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must lie in [0, 1); found {beta!r}")
    if not 0.0 < wrap_probability_target < 1.0:
        raise ValueError(f"wrap_probability_target must lie in (0, 1); found {wrap_probability_target!r}")
    padded = padded_dimension(dim)
    n, m, c, z = max_members, noise_shares, float(clip), float(noise_multiplier)
    modulus = float(1 << bits)
    log_term = math.log(2.0 * padded / wrap_probability_target)
    if beta == 0.0:
        room = modulus**2 / (8.0 * log_term) - n / 4.0 - n
    else:
        room = ((modulus / 2.0 - n) ** 2 / (2.0 * log_term) - n) if modulus / 2.0 > n else -1.0
    if room <= 0:
        raise ValueError(f"bits={bits} cannot hold a sum of {n} members at wrap probability "
                         f"{wrap_probability_target:g}: raise bits or lower max_members")
    scale = math.sqrt(room / (n * n * c * c / padded + n * z * z * c * c / m))
    local_sigma_sq = _round_up_sigma_sq(z * z * c * c * scale * scale / m)
    if local_sigma_sq < Fraction(1, 4):
        raise ValueError(f"bits={bits} leave each member's noise at sigma^2 = {float(local_sigma_sq):.3g} < 1/4 "
                         "in integer units (KLS's bound needs sigma >= 1/2): raise bits or noise_multiplier")
    bound = rounded_norm_bound(scale * c * (1.0 + _NORM_SLACK), padded, beta)
    return DDGParameters(dim=dim, clip=c, scale=scale, beta=float(beta), local_sigma_sq=local_sigma_sq,
                         norm_bound_sq=math.floor(bound * bound), bits=bits, max_members=n)


def wrap_probability(params: DDGParameters, members: int | None = None) -> float:
    """Eq. (3): P[some coordinate of a sum of at most ``members`` inputs leaves [−M/2, M/2)]."""
    n = params.max_members if members is None else members
    padded, s, c = params.padded_dim, params.scale, params.clip
    sigma_sq = float(params.local_sigma_sq)
    half = params.modulus / 2.0
    data = s * s * n * n * c * c / padded
    if params.beta == 0.0:
        exponent = half * half / (2.0 * (data + n / 4.0 + n * sigma_sq))
    else:
        if half <= n:
            return 1.0
        exponent = (half - n) ** 2 / (2.0 * (data + n * sigma_sq))
    return min(1.0, 2.0 * padded * math.exp(-exponent))


def _round_up_sigma_sq(value: float) -> Fraction:
    if value >= 1.0:
        return Fraction(math.ceil(value))
    return Fraction(math.ceil(value * _SIGMA_GRID), _SIGMA_GRID)


# ---------------------------------------------------------------------------------------
# What a member sends and what the server decodes
# ---------------------------------------------------------------------------------------

def encode(update: np.ndarray, params: DDGParameters, seed: bytes,
           source: NoiseSource) -> tuple[np.ndarray, dict[str, float]]:
    """Compute a member's input to the secure sum: (x̃ + z) mod M, ``int64`` of length d'.

    Steps 1–5 of the module docstring (R is orthogonal: the scaled, rotated vector has norm
    <= s·c, up to the rotation's float round-off, which is taken back out). Returns the
    vector and diagnostics for the client's own log: ``norm`` (‖x‖ before clipping),
    ``clipped`` (1.0 if it was clipped) and ``tries`` (rounding attempts; it depends on the
    data, so it must not be sent).

    Raises
    ------
    ValueError
        If ``update`` does not have ``params.dim`` coordinates or is not finite.
    """
    x = np.asarray(update, dtype=np.float64).ravel()
    if x.size != params.dim or not np.all(np.isfinite(x)):
        raise ValueError(f"the update must hold {params.dim} finite coordinates; found {x.size}")
    norm = float(np.linalg.norm(x))
    clipped = norm > params.clip
    y = rotate(x * (params.scale * (params.clip / norm if clipped else 1.0)), seed)
    ceiling = params.scale * params.clip
    rotated_norm = float(np.linalg.norm(y))
    if rotated_norm > ceiling:  # float round-off of the rotation: pull it back onto the ball
        y *= ceiling / rotated_norm
    rounded, tries = conditional_round(y, params.norm_bound_sq, source)
    noisy = rounded + discrete_gaussian(rounded.size, params.local_sigma_sq, source)
    return np.mod(noisy, params.modulus), {"norm": norm, "clipped": float(clipped), "tries": float(tries)}


def decode(total: np.ndarray, params: DDGParameters, seed: bytes) -> np.ndarray:
    """Estimate Σ_i clip(x_i) from the sum: lift to [−M/2, M/2), rotate back, divide by s."""
    modulus = params.modulus
    values = np.asarray(total, dtype=np.int64).ravel()
    if values.size != params.padded_dim:
        raise ValueError(f"a sum has {params.padded_dim} coordinates; found {values.size}")
    centred = np.mod(values + modulus // 2, modulus) - modulus // 2
    return unrotate(centred.astype(np.float64), seed, params.dim) / params.scale


# ---------------------------------------------------------------------------------------
# Accounting (eqs. 1–2), composition, subsampling, conversion, inverse
# ---------------------------------------------------------------------------------------

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
        middle = _round_up_sigma_sq(math.sqrt(float(low) * float(high)))
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


def _check_positive_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be > 0 and finite; found {value!r}")
