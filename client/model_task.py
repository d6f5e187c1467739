"""A model-training round for the shared client round (:mod:`client.round`): shard, model, work, upload.

The client's shard comes through the node's shard cache (:mod:`client.shard_cache`), capped by
its operator's ``max-examples``; the model is the run's, loaded with the received weights; the
work is :class:`client.work.ModelWork` (wrapped by :class:`client.work.PersonalizedWork` for
PPSGD / CENTAUR); the upload is encoded in the format the request asks for (:mod:`client.uploads`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message

from client.profile import ClientProfile
from client.shard_cache import cached_shard, shard_key
from client.training import LocalTrainingConfig
from client.uploads import encode_upload
from client.work import CanaryWork, ModelWork, PersonalizedWork, canary_update
from privacy.mechanisms import LocalWork, Upload
from protocol import keys
from protocol.dpfedc import DPFedCRound
from protocol.run_settings import RunSettings
from protocol.train_config import TrainConfig
from tasks.datasets import ArrayDataset, is_loaded, load_dataset, source
from tasks.model_names import resolve_grad_sample_mode
from tasks.models import build_model, get_weights, set_weights
from tasks.partition import client_data, client_size


def _partitioning(settings: RunSettings) -> dict[str, Any]:
    """client_data's keywords, and the shard cache's identity."""
    return {"method": settings.partitioner, "alpha": settings.dirichlet_alpha,
            "shards_per_client": settings.shards_per_client, "seed": settings.seed,
            "max_examples": settings.max_examples_per_client, "evaluation_split": settings.evaluation_split}


def count_local_examples(profile: ClientProfile, settings: RunSettings) -> int:
    """The size of this client's shard: counted from the partition where the data is in memory
    (a simulation: no copy of the examples), else from the node's shard cache.
    """
    data_dir = profile.data_dir or settings.data_dir or None
    if not is_loaded(settings.dataset, data_dir):
        return len(load_local_data(profile, settings)[0])
    size = client_size(load_dataset(settings.dataset, data_dir), profile.partition_id, profile.num_partitions,
                       **_partitioning(settings))
    return min(size, profile.max_examples) if profile.max_examples is not None else size


def load_local_data(profile: ClientProfile, settings: RunSettings) -> tuple[ArrayDataset, int]:
    """This client's training shard (and the dataset's class count), via the node's shard cache."""
    dataset = settings.dataset
    data_dir = profile.data_dir or settings.data_dir or None
    partitioning = _partitioning(settings)

    def build() -> tuple[ArrayDataset, int]:
        splits = load_dataset(dataset, data_dir)
        shard = client_data(splits, profile.partition_id, profile.num_partitions, **partitioning)
        return shard, splits.train.num_classes

    if is_loaded(dataset, data_dir):  # a long-lived process (simulation): memory beats disk
        shard, num_classes = build()
    else:
        name, folder = source(dataset, data_dir)
        key = shard_key(name, folder, partitioning, profile.partition_id, profile.num_partitions)
        shard, num_classes = cached_shard(profile.shard_cache, key, build)
    if profile.max_examples is not None and len(shard) > profile.max_examples:  # the operator's cap
        shard = ArrayDataset(shard.x[: profile.max_examples], shard.y[: profile.max_examples], shard.num_classes,
                             shard.name)
    return shard, num_classes


def model_from(arrays: ArrayRecord, data: ArrayDataset, num_classes: int, model_name: str) -> torch.nn.Module:
    """The run's model with the received weights."""
    model = build_model(model_name, input_shape=tuple(data.x.shape[1:]), num_classes=num_classes)
    set_weights(model, arrays.to_numpy_ndarrays())
    return model


class ModelTask:
    """A model-training round: the client's shard, its model and local work, and the upload's encoding."""

    clustering: DPFedCRound | None = None

    def __init__(self, msg: Message, context: Context, profile: ClientProfile, cfg: TrainConfig) -> None:
        self.msg, self.context, self.profile, self.cfg = msg, context, profile, cfg
        self.settings = RunSettings.of(context.run_config)
        self.data, self.num_classes = load_local_data(profile, self.settings)
        self.num_examples = len(self.data)
        self._received: list[np.ndarray] = []

    def work(self, seed: int) -> LocalWork:
        """The round's work from the received model; ``seed`` seeds weight init and dropout (not DP)."""
        torch.manual_seed(seed)
        model = model_from(self.msg.content.array_records[keys.ARRAYS], self.data, self.num_classes,
                           self.settings.model)
        self._received = [w.copy() for w in get_weights(model)]
        canary = canary_update(self.context.node_config, self._received)  # an auditor's canary node
        if canary is not None:
            return CanaryWork(self._received, canary)
        cfg = self.cfg
        local = LocalTrainingConfig(epochs=cfg.local_epochs, steps=cfg.local_steps, batch_size=cfg.batch_size,
                                    learning_rate=cfg.learning_rate, momentum=cfg.momentum, seed=seed)
        mode = resolve_grad_sample_mode(cfg.grad_sample_mode, self.settings.model)
        base = ModelWork(model, self.data, local, mode)
        if cfg.personalization:
            return PersonalizedWork(base, cfg, self.context, self.profile.partition_id)
        return base

    def encode(self, upload: Upload) -> ArrayRecord:
        """The upload in the format the request asks for (the full model, or PFA+'s coordinates)."""
        return encode_upload(self.msg.content, self._received, upload.arrays)

    def commit(self) -> None:
        """Nothing to keep after the charge (a personal part is kept by the work itself)."""

    @staticmethod
    def count(settings: RunSettings, profile: ClientProfile) -> int:
        """N for the handshake."""
        return count_local_examples(profile, settings)
