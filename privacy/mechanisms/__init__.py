"""The privacy mechanisms a client round runs, one object each (:mod:`privacy.mechanisms.base`).

========================  ====================================================  ==================
kind                      what one round releases                               charged per release
========================  ====================================================  ==================
``dpsgd``                 DP-SGD on the client's records (:mod:`.dpsgd`)         (σ, 1/⌈n/B⌉, E⌈n/B⌉)
``update``                its clipped update + N(0, σ²C²/m) (:mod:`.update`)     (σ/√m, 1, 1)
``secure-share``          the same, only inside a secure sum of >= r_min         (σ√(r_min/m), 1, 1)
``secure-ddg``            its rounded, rotated update + N_Z(0, σ²) (:mod:`.ddg`)  (σ_eq, 1, 1), RDP only
``group-share``           GDPFed's share of its group's noise (:mod:`.group_share`)  (σ_m, q_m, T) once a run
``centroids``             DP-FedC's noisy centroids (:mod:`.centroids`)          (z, 1, 1)
``none``                  nothing private                                       (0, 1, 1): ε = ∞
========================  ====================================================  ==================

The client's round (:mod:`client.round`) and the server's verification
(:mod:`strategies.reply_book`) are written once over these objects; which one a round runs is
decided from the decoded request by :func:`protocol.train_config.TrainConfig.mechanism`.
A new mechanism is a class here and a line in :data:`MECHANISMS`.
"""

from __future__ import annotations

from typing import Final

from privacy.mechanisms.base import Calibration, ExpectedRelease, LocalWork, Mechanism, Privatizer, Release, Upload
from privacy.mechanisms.centroids import CentroidRelease
from privacy.mechanisms.ddg import DDGSum, GroupDiscreteGaussianShare, SecureDiscreteGaussianShare
from privacy.mechanisms.dpsgd import (
    DPSGD,
    dpsgd_batches_per_epoch,
    dpsgd_expected_batch,
    dpsgd_sample_rate,
    dpsgd_steps_per_round,
)
from privacy.mechanisms.gaussian import (
    clip_update,
    gaussian_noise_like,
    l2_norm,
    local_noise_multiplier,
    privatize_update,
)
from privacy.mechanisms.group_share import GroupShare
from privacy.mechanisms.update import NoPrivacy, SecureSumShare, WholeUpdate

__all__ = ["DPSGD", "MECHANISMS", "Calibration", "CentroidRelease", "DDGSum", "ExpectedRelease", "GroupShare",
           "GroupDiscreteGaussianShare", "LocalWork", "Mechanism", "NoPrivacy", "Privatizer", "Release",
           "SecureDiscreteGaussianShare",
           "SecureSumShare", "Upload", "WholeUpdate", "clip_update",
           "dpsgd_batches_per_epoch", "dpsgd_expected_batch", "dpsgd_sample_rate", "dpsgd_steps_per_round",
           "gaussian_noise_like", "l2_norm", "local_noise_multiplier", "privatize_update"]

#: kind -> mechanism class: every mechanism privet runs.
MECHANISMS: Final[dict[str, type[Mechanism]]] = {
    cls.kind: cls for cls in (DPSGD, WholeUpdate, SecureSumShare, SecureDiscreteGaussianShare, GroupShare,
                              GroupDiscreteGaussianShare, CentroidRelease, NoPrivacy)
}
