"""Client-level Gaussian mechanisms on the whole model update, and the null mechanism.

``update``
    The client clips its update Δ to ‖Δ‖₂ ≤ C and adds N(0, σ²C²/m) (its 1/m share of the
    noise, m = ``noise-shares``). An upload seen alone is a Gaussian mechanism with multiplier
    σ/√m and sensitivity 2C under replace-one (two updates in the C-ball): that is what the
    ledger charges, the guarantee against whoever sees the upload (McMahan et al. 2018;
    GDPFed Alg. 1's share).
``secure-share``
    The same upload, leaving the client only inside a secure sum of at least r_min members
    (:mod:`privacy.secure_sum`): the released sum carries σ·√(r_min/m), charged per release.
``none``
    Nothing private: charged as a zero-noise release, so the ledger honestly reads ε = ∞.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from privacy.mechanisms.base import Calibration, ExpectedRelease, LocalWork, Mechanism, Release, Upload
from privacy.mechanisms.gaussian import privatize_update
from privacy.randomness import NoiseSource
from privacy.secure_sum import charged_multiplier

__all__ = ["NoPrivacy", "SecureSumShare", "WholeUpdate"]


class WholeUpdate(Mechanism):
    """One Gaussian release of the clipped update per round: N(0, σ²C²/m) added by the client."""

    kind: ClassVar[str] = "update"

    def __init__(self, clip: float, noise_multiplier: float, calibration: Calibration | None = None, *,
                 noise_shares: int = 1) -> None:
        super().__init__(clip, noise_multiplier, calibration)
        self.noise_shares = noise_shares

    @property
    def workload(self) -> tuple[float, int]:
        """One release per round, q = 1: the server knows who took part."""
        return 1.0, 1

    def charged(self, sigma: float) -> float:
        """σ/√m: what one upload carries on its own."""
        return sigma / math.sqrt(self.noise_shares)

    def privatize(self, received: list[np.ndarray], trained: list[np.ndarray], release: Release,
                  noise: NoiseSource) -> tuple[list[np.ndarray], dict[str, float]]:
        """The upload: received + clip(trained − received, C) + N(0, σ²C²/m)."""
        update = [t - r for t, r in zip(trained, received, strict=True)]
        noisy, diag = privatize_update(update, clip=self.clip, noise_multiplier=release.noise_multiplier,
                                       noise_shares=self.noise_shares, rng=noise)
        return [r + u for r, u in zip(received, noisy, strict=True)], diag

    def run(self, work: LocalWork, release: Release, noise: NoiseSource) -> Upload:
        """Plain local training; the released part's update is clipped and noised."""
        return work.train(lambda received, trained: self.privatize(received, trained, release, noise))

    def guarantee(self) -> str:
        """Client level, local (or shared) Gaussian noise, per upload."""
        return f"its clipped update with {self._share()}, charged per upload (no secure aggregation)"

    def _share(self) -> str:
        return "local Gaussian noise" if self.noise_shares == 1 else \
            f"a 1/{self.noise_shares} share of the Gaussian noise"


class SecureSumShare(WholeUpdate):
    """A :class:`WholeUpdate` share released only inside a secure sum of at least ``min_survivors`` inputs.

    Each of the m shares is N(0, σ²C²/m); a released sum holds at least r_min of them, hence
    the charge σ·√(r_min/m) per release (:func:`privacy.secure_sum.charged_multiplier`), exact
    when exactly r_min survive and conservative when more do. r_min is the larger of the
    server's and the client's own floor, enforced by the client before it trains and again
    before it helps unmask.
    """

    kind: ClassVar[str] = "secure-share"

    def __init__(self, clip: float, noise_multiplier: float, calibration: Calibration | None = None, *,
                 noise_shares: int = 1, min_survivors: int = 1) -> None:
        super().__init__(clip, noise_multiplier, calibration, noise_shares=noise_shares)
        self.min_survivors = min_survivors

    def charged(self, sigma: float) -> float:
        """σ·√(r_min/m)."""
        return charged_multiplier(sigma, self.noise_shares, self.min_survivors)

    def guarantee(self) -> str:
        """Client level, inside a secure sum of at least r_min updates."""
        return (f"its clipped update with {self._share()}, released only inside a secure sum (SecAgg+) of at "
                f"least {self.min_survivors} clients' updates and charged as noise multiplier "
                f"sigma*sqrt({self.min_survivors}/{self.noise_shares}); the quantisation before the sum "
                "(stochastic rounding, clipping with probability <= secagg.clip-probability) is outside the "
                "accounting")


class NoPrivacy(Mechanism):
    """The non-private baseline (a null mechanism): trains, releases as trained, charges ε = ∞."""

    kind: ClassVar[str] = "none"
    ledger_mode: ClassVar[str] = "none"
    private: ClassVar[bool] = False

    def __init__(self, clip: float = 1.0) -> None:
        super().__init__(clip, noise_multiplier=0.0)

    @property
    def workload(self) -> tuple[float, int]:
        """One release per round."""
        return 1.0, 1

    def expected(self, num_examples: int) -> ExpectedRelease:  # noqa: D102 - σ 0, q 1, 1 step
        return ExpectedRelease(num_examples, 0.0, 1.0, 1)

    def run(self, work: LocalWork, release: Release, noise: NoiseSource) -> Upload:
        """Plain local training; the update leaves as trained."""
        return work.train(None)

    def guarantee(self) -> str:
        """None."""
        return "no noise (non-private)"
