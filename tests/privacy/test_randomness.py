"""The client's secure noise source draws what the DP analysis assumes: N(0, std²), independently.

The source is keyed from OS entropy (it cannot be seeded, by design), so the distribution
checks use bounds that a correct sampler violates with probability below 10⁻⁴; the error of
the float32 angle is checked exactly by feeding the sampler known uniforms.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from privacy.randomness import SecureNoise

N = 400_000
#: Kolmogorov-Smirnov: P(√n·D > 2.3) < 10⁻⁴ for a correct sampler
KS_BOUND = 2.3 / math.sqrt(N // 2)


class KnownUniforms(SecureNoise):
    """The Box-Muller arithmetic of :class:`SecureNoise` on given uniforms."""

    def __init__(self, u: np.ndarray) -> None:
        super().__init__()
        self.u = u

    def uniform(self, size: int) -> np.ndarray:
        assert size == len(self.u)
        return self.u


def test_both_halves_of_each_pair_are_gaussian_with_the_asked_std():
    std = 3.5
    z = SecureNoise().normal((N,), std)
    cosine, sine = z[: N // 2] / std, z[N // 2:] / std  # the two Box-Muller outputs of each pair
    for half in (cosine, sine):
        assert stats.kstest(half, "norm").statistic < KS_BOUND
    # the pair's two draws are uncorrelated, also in their squares (independence, not just orthogonality)
    assert abs(np.corrcoef(cosine, sine)[0, 1]) < 4.5 / math.sqrt(N // 2)
    assert abs(np.corrcoef(cosine**2, sine**2)[0, 1]) < 4.5 / math.sqrt(N // 2)
    beyond = np.mean(np.abs(z / std) > 3.0)  # tails: P(|Z| > 3) = 0.0027
    p = 2 * stats.norm.sf(3.0)
    assert abs(beyond - p) < 4.5 * math.sqrt(p * (1 - p) / N)


def test_float32_angles_change_a_draw_by_at_most_3e_7_of_its_radius():
    rng = np.random.default_rng(7)
    pairs = 100_000
    u = np.concatenate([rng.random(pairs), rng.random(pairs)])
    u[0], u[pairs] = 1 - 2.0**-53, 0.999_999_9  # the largest radius, an angle just below 2π
    z = KnownUniforms(u).normal((2 * pairs,), 1.0)
    radius = np.sqrt(-2.0 * np.log1p(-u[:pairs]))
    angle = 2.0 * np.pi * u[pairs:]
    exact = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])
    assert np.all(np.abs(z - exact) <= 3e-7 * np.concatenate([radius, radius]))
    assert radius[0] > 8.5  # 53-bit uniforms keep the tails
