"""Where a client round's randomness comes from: a seed for what is not DP, the client's own source for what is.

:func:`client_seed` seeds only what is *not* DP randomness (weight initialisation, shuffling and
dropout of plain local SGD, DP-FedC's minibatch choice); :func:`noise_for` gives the round's DP
randomness (:mod:`privacy.randomness`): entropy that never leaves the client, or the ``seeded``
source that reports declare void against whoever knows the run seed.
"""

from __future__ import annotations

import numpy as np

from client.profile import ClientProfile
from privacy.randomness import NoiseSource, noise_source

__all__ = ["client_seed", "noise_for"]


def client_seed(run_seed: int, partition_id: int, server_round: int) -> int:
    """Per-(client, round) seed derived from the run's root seed (never DP randomness, but ``seeded`` noise)."""
    return int(np.random.SeedSequence([run_seed, partition_id, server_round]).generate_state(1)[0])


def noise_for(profile: ClientProfile, seed: int) -> NoiseSource:
    """The client's DP randomness for one round."""
    return noise_source(profile.noise_source, seed if profile.noise_source == "seeded" else None)
