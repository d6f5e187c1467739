"""A model-training round for the shared client round (:mod:`client.round`): shard, model, work, upload.

The client's shard comes through the node's shard cache (:mod:`client.shard_cache`), capped by
its operator's ``max-examples``; the model is the run's, loaded with the received weights (into the
thread's model of that architecture, built once: :func:`round_model`); the work is
:class:`client.work.ModelWork` (wrapped by :class:`client.work.PersonalizedWork` for
PPSGD / CENTAUR); the upload is encoded in the format the request asks for (:mod:`client.uploads`).
"""

from __future__ import annotations

import threading
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
from tasks.array_dataset import ArrayDataset
from tasks.datasets import is_loaded, load_dataset, source
from tasks.model_names import resolve_grad_sample_mode
from tasks.models import build_model, get_weights, set_weights
from tasks.partition import client_data, client_size


def partitioning(settings: RunSettings) -> dict[str, Any]:
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
                       **partitioning(settings))
    return min(size, profile.max_examples) if profile.max_examples is not None else size


def load_local_data(profile: ClientProfile, settings: RunSettings) -> tuple[ArrayDataset, int]:
    """This client's training shard (and the dataset's class count), via the node's shard cache."""
    dataset = settings.dataset
    data_dir = profile.data_dir or settings.data_dir or None
    split = partitioning(settings)

    def build() -> tuple[ArrayDataset, int]:
        splits = load_dataset(dataset, data_dir)
        shard = client_data(splits, profile.partition_id, profile.num_partitions, **split)
        return shard, splits.train.num_classes

    if is_loaded(dataset, data_dir):  # a long-lived process (simulation): memory beats disk
        shard, num_classes = build()
    else:
        name, folder = source(dataset, data_dir)
        key = shard_key(name, folder, split, profile.partition_id, profile.num_partitions)
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


#: per thread, the models built so far, by (name, input shape, classes): see round_model
_models = threading.local()


def _as_built(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds nothing a round may leave behind: no hook on any module, every parameter trainable."""
    return all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)
               for m in model.modules()) and all(p.requires_grad and not hasattr(p, "grad_sample")
                                                  for p in model.parameters())


def round_model(model_name: str, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """This thread's model of that architecture, for a round to load the received weights into (#38).

    Built once per thread and per architecture (a thread runs one round at a time), and handed out
    again only while it is as built: every module without hooks (Opacus' and book-keeping's are
    removed when their steps end), every parameter trainable; a model that is not (a round that
    froze a part, or hooks a failure left) is replaced by a fresh one. Gradients are dropped and the
    model set to training mode. The weights are whatever the last round left: the caller loads
    every tensor of the state (:func:`tasks.models.set_weights`, strict), so nothing of another
    client's round is left in it.
    """
    built: dict[tuple[str, tuple[int, ...], int], torch.nn.Module] = _models.__dict__.setdefault("by_key", {})
    key = (model_name, tuple(input_shape), num_classes)
    model = built.get(key)
    if model is None or not _as_built(model):
        model = built[key] = build_model(model_name, input_shape=input_shape, num_classes=num_classes)
    for p in model.parameters():
        p.grad = None
    model.train()
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
        """The round's work from the received model; ``seed`` seeds dropout (not DP)."""
        model = round_model(self.settings.model, tuple(self.data.x.shape[1:]), self.num_classes)
        set_weights(model, self.msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays())
        # after the model: the same draws whether it was built now or before; the CPU's generator only (the
        # model is on the CPU), as torch.manual_seed's lazy CUDA seeding formats the call stack (#38)
        torch.default_generator.manual_seed(seed)
        self._received = get_weights(model)  # copies
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
