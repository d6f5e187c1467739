"""DP-FedC's centroid release (paper 004, eq. 19): W̃_i = W^t + clip(W_i − W^t) + ξ_i.

Two calibrations (:mod:`privacy.centroid_noise` states both in full):

``rigorous``
    The round's update of the centroids is clipped to Frobenius norm C and N(0, z²C²) is
    added per entry; z is calibrated by the client from its own budget over the rounds it
    plans to join, and every release is charged ``(z, 1, 1)`` under replace-one: a
    client-level (whole local dataset) Gaussian mechanism. H_i never leaves the client.
``paper``
    z from eq. (29) at the per-round ε of Theorem 3's (32) inverted (the paper's nominal ε̄),
    the W phase clipping every minibatch gradient to G, so that ‖ΔW‖ ≤ C = Q₂G/η (Lemma 2)
    without a further clip; charged ``(z, 1, 1)`` like the rigorous release, treating η (which
    the paper derives from the data) as public, as the report says.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, cast

import numpy as np

from privacy.centroid_noise import paper_noise_multiplier, paper_round_epsilon, privatize_centroids
from privacy.mechanisms.base import Calibration, LocalWork, Release, Upload
from privacy.mechanisms.update import WholeUpdate
from privacy.randomness import NoiseSource

__all__ = ["CentroidRelease", "ClusteringWork"]


class ClusteringWork(LocalWork, Protocol):
    """DP-FedC's local work: also the bound its W phase guarantees on ‖ΔW‖ (Lemma 2's Q₂G/η)."""

    def update_bound(self) -> float:
        """C = Q₂ᵗG/η of the round just trained."""


class CentroidRelease(WholeUpdate):
    """The noisy centroids of one round (module docstring).

    Parameters
    ----------
    clip : float
        C (rigorous), or G, the per-minibatch gradient bound (paper: the reported clip).
    noise_multiplier : float
        z (> 0 fixed; 0: the client calibrates, rigorous only).
    paper : bool
        The paper's calibration: the noise std is z·Q₂G/η, the W phase's own bound.
    """

    kind: ClassVar[str] = "centroids"

    def __init__(self, clip: float, noise_multiplier: float, calibration: Calibration | None = None, *,
                 paper: bool = False) -> None:
        super().__init__(clip, noise_multiplier, calibration, noise_shares=1)
        self.paper = paper

    @classmethod
    def from_paper(cls, *, epsilon_bar: float, delta: float, sample_ratio: float, client_rate: float,
                   rounds: int, grad_clip: float) -> CentroidRelease:
        """The paper's calibration: z from eq. (29) at the per-round ε of (32) inverted."""
        epsilon = paper_round_epsilon(epsilon_bar, sample_ratio, client_rate, rounds)
        return cls(grad_clip, paper_noise_multiplier(epsilon, delta, sample_ratio), paper=True)

    def privatize(self, received: list[np.ndarray], trained: list[np.ndarray], release: Release,
                  noise: NoiseSource, clip: float | None = None) -> tuple[list[np.ndarray], dict[str, float]]:
        """W^t + clip(W_i − W^t, C) + N(0, z²C²) entrywise (eq. 19)."""
        out = privatize_centroids(received[0], trained[0], self.clip if clip is None else clip,
                                  release.noise_multiplier, noise)
        return [out.centroids], {"update-norm": out.update_norm}

    def run(self, work: LocalWork, release: Release, noise: NoiseSource) -> Upload:
        """The H and W phases, then the noisy centroids; in the paper's calibration C is the W phase's bound."""
        def privatize(received: list[np.ndarray], trained: list[np.ndarray]) -> tuple[list[np.ndarray],
                                                                                       dict[str, float]]:
            clip = cast(ClusteringWork, work).update_bound() if self.paper else None
            return self.privatize(received, trained, release, noise, clip)

        return work.train(privatize)

    def guarantee(self) -> str:
        """Client level, its update of the centroids."""
        if self.paper:
            return ("its centroid update under the paper's eq. (29) noise (a nominal calibration; the charged eps "
                    "treats the step size eta as public)")
        return "its clipped centroid update with local Gaussian noise, charged per upload"
