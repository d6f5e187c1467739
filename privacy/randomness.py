"""Where a client's DP randomness comes from: sources nobody else can reproduce.

Every random draw a differential-privacy guarantee rests on (Gaussian noise, Poisson
sampling of records) must be unpredictable to whoever the guarantee is for. The server
sends a run seed, knows each client's partition id and every round number, so nothing
derived from those may seed DP randomness: a server that can regenerate the noise can
subtract it. The sources here:

``"csprng"`` (the default)
    An AES-256-CTR keystream (the ``cryptography`` package, already a Flower dependency)
    under a 256-bit key and a 128-bit initial counter read from the operating system's
    entropy pool (``os.urandom``) when the source is created; the key never leaves the
    process and is never stored. Uniforms take 53 keystream bits each; Gaussians come from
    the Box–Muller transform of two such uniforms. Recovering the noise from its outputs
    means breaking AES.
``"os"``
    numpy's PCG64 seeded with 128 bits of fresh OS entropy (``np.random.default_rng()``):
    not cryptographically secure (its state could in principle be reconstructed from
    enough *exact* outputs, which no party sees: every output is added to data), but
    faster. The seed is never stored or sent.
``"seeded"``
    PCG64 seeded from an explicit integer, for reproducible experiments only. **Whoever
    knows the seed can regenerate every draw and remove the noise**: no DP guarantee holds
    against them. Clients accept it only where their operator allows it (see
    ``client.profile``), and every report says so.

Not covered by any source: floating-point attacks on the textbook Gaussian sampler
(Mironov 2012; Jin et al. 2022), which Opacus' ``secure_mode`` counters with a sum of
Gaussians; its CSPRNG backend (torchcsprng) has no build for the pinned torch.
"""

from __future__ import annotations

import math
import os
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "NOISE_SOURCES",
    "NoiseSource",
    "OSEntropyNoise",
    "SecureNoise",
    "SeededNoise",
    "noise_source",
]

#: Names accepted for a client's DP randomness, strongest first.
NOISE_SOURCES: tuple[str, ...] = ("csprng", "os", "seeded")

_TWO_PI = 2.0 * math.pi
_INV_2_53 = 1.0 / float(1 << 53)


@runtime_checkable
class NoiseSource(Protocol):
    """What DP mechanisms draw from: uniforms and Gaussians, as float64 numpy arrays."""

    name: str

    def uniform(self, size: int) -> np.ndarray:
        """``size`` independent draws from U[0, 1)."""
        ...

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        """Independent N(0, std²) draws of the given shape."""
        ...


class SecureNoise:
    """AES-256-CTR keystream from OS entropy (module docstring: ``"csprng"``)."""

    name = "csprng"

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        cipher = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(os.urandom(16)))
        self._encryptor = cipher.encryptor()

    def _words(self, count: int) -> np.ndarray:
        """``count`` uniformly random 64-bit words from the keystream."""
        stream = self._encryptor.update(bytes(8 * count))
        return np.frombuffer(stream, dtype=np.uint64, count=count)

    def uniform(self, size: int) -> np.ndarray:
        """U[0, 1) with 53 random bits each: k · 2⁻⁵³ for a uniform integer k < 2⁵³."""
        return (self._words(int(size)) >> np.uint64(11)).astype(np.float64) * _INV_2_53

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        """Draw N(0, std²) entries by Box–Muller.

        For U₁ in (0, 1] and U₂ in [0, 1), √(−2 ln U₁)·(cos, sin)(2πU₂) are two independent
        N(0, 1) draws. The radius is computed in float64 from 53-bit uniforms (the tails);
        the angle's cosine and sine in float32, which numpy vectorises (about 25x faster than
        float64 here, where they dominated a large model's DP-SGD step): an absolute error of
        at most 3·10⁻⁷ of the radius, the float32 resolution every noisy gradient and model
        is stored in anyway.
        """
        count = int(np.prod(shape, dtype=np.int64))
        pairs = (count + 1) // 2
        u = self.uniform(2 * pairs)
        radius = np.sqrt(-2.0 * np.log1p(-u[:pairs]))  # 1 − U is in (0, 1]: log is finite
        angle = (_TWO_PI * u[pairs:]).astype(np.float32)
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]
        return (float(std) * z).reshape(shape)


class _NumpyNoise:
    """A numpy Generator behind the :class:`NoiseSource` interface."""

    name = "os"

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def uniform(self, size: int) -> np.ndarray:
        return self._rng.random(int(size))

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return self._rng.normal(0.0, float(std), size=shape)


class OSEntropyNoise(_NumpyNoise):
    """PCG64 seeded with fresh OS entropy (module docstring: ``"os"``)."""

    name = "os"

    def __init__(self) -> None:
        super().__init__(np.random.default_rng())


class SeededNoise(_NumpyNoise):
    """PCG64 from an explicit seed: reproducible, and no guarantee against the seed's holders."""

    name = "seeded"

    def __init__(self, seed: int) -> None:
        super().__init__(np.random.default_rng(int(seed)))


def noise_source(name: str, seed: int | None = None) -> NoiseSource:
    """A fresh source of the given kind (``seed`` only for ``"seeded"``).

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`NOISE_SOURCES`, or ``"seeded"`` has no seed.
    """
    if name == "csprng":
        return SecureNoise()
    if name == "os":
        return OSEntropyNoise()
    if name == "seeded":
        if seed is None:
            raise ValueError("noise source 'seeded' needs a seed")
        return SeededNoise(seed)
    raise ValueError(f"noise source must be one of {', '.join(NOISE_SOURCES)}; found {name!r}")
