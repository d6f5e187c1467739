"""A client's local work on its model, as a privacy mechanism runs it (:class:`privacy.mechanisms.LocalWork`).

:class:`ModelWork` trains the received model on the client's shard: plain SGD (the mechanism
then privatises the update, or releases it as trained) or DP-SGD (every step private).
:class:`PersonalizedWork` wraps it for PPSGD and CENTAUR: the client keeps a personal part in
its node state and releases only the shared part (:mod:`client.personalization`).
:class:`CanaryWork` is an auditor's canary client (``privet audit --runtime flower``): its node
config makes its round release a fixed random update instead of training (:func:`canary_update`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Context
from torch import nn

from client.personalization import train_personalized
from client.training import LocalTrainingConfig, local_sgd, train_dpsgd
from privacy.mechanisms import Privatizer, Upload
from privacy.randomness import NoiseSource
from protocol import keys
from protocol.train_config import TrainConfig
from tasks.array_dataset import ArrayDataset
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


@dataclass
class CanaryWork:
    """An auditor's canary client: "training" moves the received model by the fixed update S·B·u.

    The mechanism then releases it as any update (clipped to C, noised): the audit observes
    whether the release gives S away. Attributes: ``received`` (the global model's layers) and
    ``update`` (S·B·u in the same shapes, :func:`canary_update`).
    """

    received: list[np.ndarray]
    update: list[np.ndarray]

    def train(self, privatize: Privatizer | None) -> Upload:
        """The received model plus the canary update, privatised by ``privatize`` (None: as is)."""
        trained = [(r + u).astype(r.dtype) for r, u in zip(self.received, self.update, strict=True)]
        if privatize is None:
            return Upload(trained)
        upload, diagnostics = privatize(self.received, trained)
        return Upload(upload, diagnostics)

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """Refused: a canary client is client level; DP-SGD is audited with canary records."""
        raise ValueError(f"node-config '{keys.NODE_AUDIT_CANARY_SEED}' makes this node a client-level canary, "
                         "which has no DP-SGD work (dp-mode 'dpsgd' is audited with canary records)")


def canary_direction(seed: int, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """The unit direction u (over all layers together, float64) that a canary's ``seed`` draws.

    u = g / ‖g‖₂ with g ~ N(0, I) from ``numpy.random.default_rng(seed)``, split into ``shapes``
    in order: the auditor, who chose the seed, computes the same u.
    """
    sizes = [math.prod(shape) for shape in shapes]
    g = np.random.default_rng(seed).standard_normal(sum(sizes))
    g /= np.linalg.norm(g)
    bounds = np.cumsum([0, *sizes])
    return [g[a:b].reshape(shape) for a, b, shape in zip(bounds[:-1], bounds[1:], shapes, strict=True)]


def canary_update(node_config: Mapping[str, bool | int | float | str], received: Sequence[np.ndarray]
                  ) -> list[np.ndarray] | None:
    """S·B·u of a canary node (node-config ``audit-canary-seed/-sign/-norm``); None for any other node.

    Only the node's operator sets these keys (the server cannot: the threat model lets it deviate).

    Raises
    ------
    ValueError
        Naming the key, for a seed that is not an integer >= 0, a sign not in {-1, +1} or a norm
        that is not a finite number > 0.
    """
    if keys.NODE_AUDIT_CANARY_SEED not in node_config:
        return None
    seed, sign = node_config[keys.NODE_AUDIT_CANARY_SEED], node_config.get(keys.NODE_AUDIT_CANARY_SIGN)
    norm = node_config.get(keys.NODE_AUDIT_CANARY_NORM)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"node-config '{keys.NODE_AUDIT_CANARY_SEED}' must be an integer >= 0; found {seed!r}")
    if isinstance(sign, bool) or sign not in (-1, 1):
        raise ValueError(f"node-config '{keys.NODE_AUDIT_CANARY_SIGN}' must be -1 or 1; found {sign!r}")
    if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not (0 < norm < math.inf):
        raise ValueError(f"node-config '{keys.NODE_AUDIT_CANARY_NORM}' must be a number > 0; found {norm!r}")
    direction = canary_direction(seed, [np.shape(r) for r in received])
    return [(float(sign) * float(norm) * u).astype(np.asarray(r).dtype)
            for u, r in zip(direction, received, strict=True)]
