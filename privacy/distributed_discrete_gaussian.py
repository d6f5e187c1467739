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

**Privacy**: the released sum's Rényi DP (KLS's Theorem 1 / eq. (17)), its charge in a ledger of
Gaussian steps and its subsampled form are :mod:`privacy.ddg_accounting`'s (eqs. (1), (2) and (4)).

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
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from privacy.ddg_accounting import round_up_sigma_sq
from privacy.discrete_gaussian import discrete_gaussian
from privacy.randomness import NoiseSource

__all__ = [
    "MAX_BITS",
    "WRAP_PROBABILITY",
    "ConditionalRoundingError",
    "DDGParameters",
    "conditional_round",
    "ddg_parameters",
    "decode",
    "encode",
    "padded_dimension",
    "rotate",
    "rotation_signs",
    "rounded_norm_bound",
    "unrotate",
    "wrap_probability",
]

#: Default bound on the probability that any coordinate of a sum wraps around mod M.
WRAP_PROBABILITY = 1e-6

#: Largest bit width: a sum mod 2^b travels packed in b bits (``protocol.secure_sum.pack_masked``), and the
#: centred lift and the rotation back stay exact in float64.
MAX_BITS = 32


#: Rotation keys are domain-separated from secure-sum masks expanded from the same seed.
_ROTATION_DOMAIN = b"privet/ddg/rotation/v1\x00"

#: Slack on the scaled clip before B is computed: the rotation's float error (~d'·2⁻⁵³
#: relative) must never push an honest rounding over B.
_NORM_SLACK = 1e-9



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
    local_sigma_sq = round_up_sigma_sq(z * z * c * c * scale * scale / m)
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


def _check_positive_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be > 0 and finite; found {value!r}")
