"""The arithmetic of a secure sum: quantisation, modulus, masks, and what the server observes.

Secure aggregation (Bonawitz et al. 2017; SecAgg+ of Bell et al. 2020, as Flower implements
it) lets the server learn only Σ_i x_i over the clients whose masked input made it into the
sum. It works on integers mod M, so each client's real vector is quantised first. This
module holds the parts that client and server must compute identically:

**Quantisation.** A client's privatised update ỹ_i = clip(Δ_i, C) + N(0, s²I) with
s = C·σ/√m (``update`` mode, m = ``noise-shares``) is clipped coordinate-wise to
[−c, c] and mapped to the integers {0, …, L} by Flower's unbiased stochastic rounding
(``flwr.common.secure_aggregation.quantization``), L = 2^b − 1:

    c = C + z·s,   z = Φ⁻¹(1 − p / (2·K·d))                                    (1)

so that, over K clients and d coordinates, a coordinate is clipped with probability at most
p (``clip_probability``; |clip(Δ, C)_j| ≤ C always). The step is 2c/L; the rounding error of
one coordinate has mean 0 and variance at most (2c/L)²/4.

**Modulus.** M = 2^⌈log₂(K·L + 1)⌉: a sum of K values in {0, …, L} never exceeds M − 1, so
there is no wrap-around at all (probability 0 given (1)), and M is a power of two so that a
mask drawn uniformly from 64-bit words is exactly uniform mod M.

**Masks.** Flower's ``pseudo_rand_gen`` folds a 256-bit seed to a 32-bit ``RandomState``
seed, which a curious server could search exhaustively; privet expands every 256-bit seed
(the self-mask seed and each pairwise key from Flower's X25519 key agreement) with ChaCha20
from ``cryptography`` instead: :func:`mask`. Everything else (key agreement, Shamir shares,
authenticated encryption of the shares, the four stages) is Flower's.

**What is observed and charged.** Each client adds N(0, C²σ²/m); a sum of r_alive
survivors carries N(0, C²σ²·r_alive/m), i.e. the Gaussian mechanism with multiplier
σ·√(r_alive/m) for each member (sensitivity: one client's clipped update).
The sum is released only when r_alive ≥ r_min (``min_survivors``, enforced by every honest
client before it trains and again before it sends its unmasking shares), so each client
charges σ·√(r_min/m): :func:`charged_multiplier`. This is exact when r_alive = r_min and
conservative when more survive. The accounting treats the released sum as real-valued:
the stochastic rounding (variance ≤ K·(2c/L)²/4 per coordinate, far below the noise for
b ≥ 16) and the clipping event of probability ≤ p are not covered by it, and the report
says so.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

#: Default probability that any coordinate of any client is clipped by the quantiser.
CLIP_PROBABILITY = 1e-9

#: The largest quantisation level count that Flower's stochastic rounding (int32) holds.
MAX_BITS = 30


@dataclass(frozen=True)
class Quantisation:
    """The integer encoding of one secure sum (eq. 1 and the modulus rule above).

    Attributes
    ----------
    clipping_range : float
        c: each coordinate is clipped to [−c, c] before quantising.
    levels : int
        L = 2^b − 1: a coordinate becomes an integer in {0, …, L}.
    modulus : int
        M, a power of two with K·L < M.
    clip_probability : float
        Bound on the probability that any coordinate of any client is clipped.
    """

    clipping_range: float
    levels: int
    modulus: int
    clip_probability: float

    @property
    def step(self) -> float:
        """The quantisation step 2c/L."""
        return 2.0 * self.clipping_range / self.levels


def quantisation_for(
    clip: float, noise_std: float, dim: int, num_clients: int, bits: int,
    clip_probability: float = CLIP_PROBABILITY,
) -> Quantisation:
    """Eq. (1): the clipping range, levels and modulus for K clients' d-dimensional inputs.

    Parameters
    ----------
    clip : float
        C, the L2 clipping norm of each update (so every coordinate is within ±C).
    noise_std : float
        s, the standard deviation of each client's Gaussian noise per coordinate.
    dim : int
        d, the number of coordinates.
    num_clients : int
        K, the most inputs the sum can hold.
    bits : int
        b: L = 2^b − 1 levels per coordinate, 2 ≤ b ≤ 30.
    clip_probability : float
        p in (0, 1).

    Raises
    ------
    ValueError
        On a parameter outside its range.
    """
    if not (clip > 0 and math.isfinite(clip) and noise_std >= 0 and math.isfinite(noise_std)):
        raise ValueError(f"need clip > 0 and a finite noise std >= 0; found clip={clip}, noise std={noise_std}")
    if dim < 1 or num_clients < 1:
        raise ValueError(f"need dim >= 1 and num_clients >= 1; found {dim}, {num_clients}")
    if not 2 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in [2, {MAX_BITS}]; found {bits}")
    if not 0 < clip_probability < 1:
        raise ValueError(f"clip_probability must be in (0, 1); found {clip_probability}")
    z = -NormalDist().inv_cdf(clip_probability / (2.0 * num_clients * dim))  # upper tail, no 1 - tiny
    levels = 2**bits - 1
    modulus = 1 << (num_clients * levels).bit_length()
    return Quantisation(clip + z * noise_std, levels, modulus, clip_probability)


def charged_multiplier(sigma: float, noise_shares: int, min_survivors: int) -> float:
    """σ·√(r_min/m): the noise multiplier of the smallest sum that can be released.

    Each of the m noise shares is N(0, C²σ²/m); a released sum holds at least r_min of them.
    """
    if noise_shares < 1 or min_survivors < 1:
        raise ValueError(f"noise_shares and min_survivors must be >= 1; found {noise_shares}, {min_survivors}")
    return sigma * math.sqrt(min_survivors / noise_shares)


def mask(seed: bytes, modulus: int, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Uniform integers mod M (a power of two), one array per shape, from a 256-bit seed.

    ChaCha20 keyed with SHA-256(seed) (zero nonce: every seed is used for one vector only,
    keys are fresh every round) produces little-endian 64-bit words, reduced mod M.
    """
    if modulus < 2 or modulus & (modulus - 1):
        raise ValueError(f"modulus must be a power of two >= 2; found {modulus}")
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    total = sum(sizes)
    key = hashlib.sha256(seed).digest()
    stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(8 * total))
    words = np.frombuffer(stream, dtype="<u8") & np.uint64(modulus - 1)
    out, start = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        out.append(words[start:start + size].astype(np.int64).reshape(shape))
        start += size
    return out


def add_mod(a: Sequence[np.ndarray], b: Sequence[np.ndarray], modulus: int, sign: int = 1) -> list[np.ndarray]:
    """(a ± b) mod M, array by array, in int64 (M ≤ 2^62 keeps every intermediate exact)."""
    return [np.mod(x + sign * y, modulus) for x, y in zip(a, b, strict=True)]
