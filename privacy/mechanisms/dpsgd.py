"""DP-SGD (Abadi et al. 2016): sample-level DP of a client's records, by Poisson-sampled noisy steps.

One round is ``steps`` DP-SGD steps at Poisson rate q = 1/⌈n/B⌉: each step clips every
example's gradient to C and adds N(0, σ²C²) to their sum (Opacus computes the per-example
gradients; the sampling and the noise come from the client's own source). Every step is taken
and charged, an empty batch included. Both q and the step count are functions of public figures
(n, B, the epochs or τ), so the server derives them and checks the reply.

Guarantee: (ε, δ)-DP of the client's dataset with respect to replacing one record, against
anyone who sees its uploads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from privacy.ledger import UNIT_RECORD
from privacy.mechanisms.base import Calibration, ExpectedRelease, LocalWork, Mechanism, Release, Upload
from privacy.randomness import NoiseSource

__all__ = ["DPSGD", "dpsgd_batches_per_epoch", "dpsgd_expected_batch", "dpsgd_sample_rate",
           "dpsgd_steps_per_round"]


def dpsgd_batches_per_epoch(num_examples: int, batch_size: int) -> int:
    """⌈n/B⌉: the expected number of Poisson batches of size B in one pass over n examples."""
    return max(1, -(-int(num_examples) // int(batch_size)))


def dpsgd_sample_rate(num_examples: int, batch_size: int) -> float:
    """DP-SGD's Poisson sampling rate q = 1/⌈n/B⌉ (expected batch n/⌈n/B⌉ <= B).

    A function of the public n and B only: the server derives it too and checks replies.
    """
    return 1.0 / dpsgd_batches_per_epoch(num_examples, batch_size)


def dpsgd_expected_batch(num_examples: int, batch_size: int) -> int:
    """⌊n·q⌋ at q = 1/⌈n/B⌉: the expected batch size DP-SGD divides its noisy sum by.

    Opacus takes ``int(n * q)``, which float rounding makes one less for some n where n·q is a
    whole number (196 · (1/49) = 3.999…: a step 4/3 too large); this is the same figure in
    integers. It scales the step, not the privacy: the noise is calibrated on the sum.
    """
    return num_examples // dpsgd_batches_per_epoch(num_examples, batch_size)


def dpsgd_steps_per_round(num_examples: int, batch_size: int, epochs: int, local_steps: int = 0) -> int:
    """DP-SGD steps in one round, every one taken (empty batches too).

    τ = ``local_steps`` when it is > 0 (PFA's and GDPFed's "τ local iterations"), else
    ``epochs`` × ⌈n/B⌉.
    """
    if local_steps > 0:
        return int(local_steps)
    return int(epochs) * dpsgd_batches_per_epoch(num_examples, batch_size)


class DPSGD(Mechanism):
    """DP-SGD on ``num_examples`` records in batches of ``batch_size`` for ``epochs`` passes (or τ steps).

    A personalized client (PPSGD, CENTAUR) trains on its training split for the scheme's passes:
    the caller gives that workload, an upper bound where the model decides how many phases train
    (CENTAUR with a model that is all head), so ``steps_known`` is then False: the server checks
    q but not the step count, and the client charges the steps its work took (:meth:`settle`).
    """

    kind: ClassVar[str] = "dpsgd"
    unit: ClassVar[str] = UNIT_RECORD
    ledger_mode: ClassVar[str] = "dpsgd"

    def __init__(self, clip: float, noise_multiplier: float, calibration: Calibration | None, *,
                 num_examples: int, batch_size: int, epochs: int, local_steps: int = 0,
                 steps_known: bool = True) -> None:
        super().__init__(clip, noise_multiplier, calibration)
        self.num_examples, self.batch_size, self.epochs, self.local_steps = (num_examples, batch_size, epochs,
                                                                               local_steps)
        self.steps_known = steps_known

    @property
    def workload(self) -> tuple[float, int]:
        """The rate q = 1/⌈n/B⌉ and E·⌈n/B⌉ steps (or τ)."""
        return (dpsgd_sample_rate(self.num_examples, self.batch_size),
                dpsgd_steps_per_round(self.num_examples, self.batch_size, self.epochs, self.local_steps))

    def expected(self, num_examples: int) -> ExpectedRelease:
        """σ if fixed, q, and the steps where the workload fixes them."""
        expected = super().expected(num_examples)
        return expected if self.steps_known else replace(expected, steps=None)

    def run(self, work: LocalWork, release: Release, noise: NoiseSource) -> Upload:
        """Every local step is a DP-SGD step: the update leaves as trained."""
        return work.train_dpsgd(self.clip, release.noise_multiplier, noise)

    def settle(self, release: Release, upload: Upload) -> Release:
        """Charge the DP-SGD steps the work took (at most the planned ones), each of them."""
        taken = int(upload.metrics.get("local-steps", release.steps))
        if taken == release.steps:
            return release
        return Release(release.noise_multiplier, release.sample_rate, taken,
                       ((self.charged(release.noise_multiplier), release.sample_rate, taken),))

    def guarantee(self) -> str:
        """Sample level, by DP-SGD."""
        return "DP-SGD with Poisson sampling"
