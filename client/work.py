"""A client's local work on its model, as a privacy mechanism runs it (:class:`privacy.mechanisms.LocalWork`).

:class:`ModelWork` trains the received model on the client's shard: plain SGD (the mechanism
then privatises the update, or releases it as trained) or DP-SGD (every step private).
:class:`PersonalizedWork` wraps it for PPSGD and CENTAUR: the client keeps a personal part in
its node state and releases only the shared part (:mod:`client.personalization`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Context
from torch import nn

from client.personalization import train_personalized
from client.training import LocalTrainingConfig, local_sgd, train_dpsgd
from privacy.mechanisms import Privatizer, Upload
from privacy.randomness import NoiseSource
from protocol.train_config import TrainConfig
from tasks.datasets import ArrayDataset
from tasks.models import get_weights


@dataclass
class ModelWork:
    """Local training of ``model`` (holding the received weights) on ``data``.

    Attributes
    ----------
    model : nn.Module
        The model, loaded with the received global weights.
    data : ArrayDataset
        The client's training shard.
    local : LocalTrainingConfig
        The round's local hyperparameters.
    grad_sample_mode : str
        How DP-SGD computes per-example gradients (resolved, not ``auto``).
    """

    model: nn.Module
    data: ArrayDataset
    local: LocalTrainingConfig
    grad_sample_mode: str

    def train(self, privatize: Privatizer | None) -> Upload:
        """Plain local SGD; the update privatised by ``privatize`` (None: released as trained)."""
        received = get_weights(self.model)
        metrics = local_sgd(self.model, self.data, self.local)
        trained = get_weights(self.model)
        if privatize is None:
            return Upload(trained, metrics)
        upload, diagnostics = privatize(received, trained)
        return Upload(upload, {**metrics, **diagnostics})

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """Every local step a DP-SGD step (:func:`client.training.train_dpsgd`)."""
        metrics, _ = train_dpsgd(self.model, self.data, self.local, clip=clip, noise_multiplier=noise_multiplier,
                                 noise=noise, grad_sample_mode=self.grad_sample_mode)
        return Upload(get_weights(self.model), metrics)


@dataclass
class PersonalizedWork:
    """PPSGD's or CENTAUR's round around a :class:`ModelWork`: only the shared part is released.

    Attributes
    ----------
    base : ModelWork
        The model, shard and hyperparameters.
    config : TrainConfig
        The round's request (its ``personalization`` scheme and parameters).
    context : Context
        The node's context, whose state keeps the personal part between rounds.
    partition_id : int
        The client's partition (its train/holdout split is a function of it).
    """

    base: ModelWork
    config: TrainConfig
    context: Context
    partition_id: int

    def train(self, privatize: Privatizer | None) -> Upload:
        """The scheme's local steps; the shared part's update privatised by ``privatize``."""
        return self._run(privatize, None)

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """The scheme's local steps, every one a DP-SGD step."""
        return self._run(None, (clip, noise_multiplier, noise))

    def _run(self, privatize: Privatizer | None, dpsgd: tuple[float, float, NoiseSource] | None) -> Upload:
        b = self.base
        metrics = train_personalized(b.model, b.data, b.local, self.config, self.context,
                                     partition_id=self.partition_id, privatize=privatize, dpsgd=dpsgd,
                                     grad_sample_mode=b.grad_sample_mode)
        return Upload([np.asarray(w) for w in get_weights(b.model)], metrics)
