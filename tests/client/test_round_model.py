"""A round's model is the thread's model of its architecture, reused (client/model_task.py, #38).

Reuse must leave nothing of one client's round in the next: the same round (received weights,
shard, seed) gives bit-identical weights on a freshly built model and on the thread's model after
other rounds trained it, plain and DP-SGD through Opacus' hooks, with dropout (mlp2) drawing from
the seed; a model something left frozen or hooked is replaced, never handed out.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from client import model_task
from client.model_task import round_model
from client.training import LocalTrainingConfig, local_sgd, train_dpsgd
from privacy.randomness import noise_source
from tasks.array_dataset import ArrayDataset
from tasks.models import build_model, get_weights, set_weights

SHAPE = (1, 28, 28)


def _shard(seed: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    return ArrayDataset(rng.standard_normal((20, *SHAPE)).astype(np.float32), rng.integers(0, 10, 20), 10, "toy")


def _round(model: torch.nn.Module, weights: list[np.ndarray], data: ArrayDataset, seed: int) -> list[np.ndarray]:
    """What ModelTask.work and a plain round do with the model."""
    set_weights(model, weights)
    torch.manual_seed(seed)
    local_sgd(model, data, LocalTrainingConfig(epochs=2, batch_size=5, learning_rate=0.1, momentum=0.5, seed=seed))
    return get_weights(model)


def _fresh_thread_cache() -> None:
    model_task._models.__dict__.pop("by_key", None)


def test_a_reused_model_gives_the_round_of_a_fresh_one() -> None:
    _fresh_thread_cache()
    received = get_weights(build_model("mlp2", input_shape=SHAPE, num_classes=10, seed=1))
    fresh = round_model("mlp2", SHAPE, 10)
    first = _round(fresh, received, _shard(0), seed=7)

    other = round_model("mlp2", SHAPE, 10)  # another client's plain round, then a DP-SGD one through Opacus
    assert other is fresh
    _round(other, get_weights(build_model("mlp2", input_shape=SHAPE, num_classes=10, seed=2)), _shard(1), seed=8)
    other = round_model("mlp2", SHAPE, 10)
    train_dpsgd(other, _shard(2), LocalTrainingConfig(epochs=1, batch_size=5, learning_rate=0.1, momentum=0.0,
                                                      seed=9),
                clip=1.0, noise_multiplier=1.0, noise=noise_source("seeded", 3), grad_sample_mode="hooks")

    again = round_model("mlp2", SHAPE, 10)
    assert again is fresh and again.training and all(p.grad is None for p in again.parameters())
    second = _round(again, received, _shard(0), seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, received, strict=True))  # it did train


def test_a_model_left_frozen_or_hooked_is_replaced() -> None:
    _fresh_thread_cache()
    model = round_model("cnn", SHAPE, 10)
    next(model.parameters()).requires_grad_(False)
    unfrozen = round_model("cnn", SHAPE, 10)
    assert unfrozen is not model and all(p.requires_grad for p in unfrozen.parameters())
    handle = unfrozen.fc1.register_forward_hook(lambda *_: None)
    unhooked = round_model("cnn", SHAPE, 10)
    assert unhooked is not unfrozen
    handle.remove()
    assert round_model("cnn", SHAPE, 10) is unhooked
    assert round_model("cnn", SHAPE, 62) is not unhooked  # another architecture, another model


def test_each_thread_has_its_own_model() -> None:
    _fresh_thread_cache()
    mine = round_model("cnn", SHAPE, 10)
    theirs: list[torch.nn.Module] = []
    thread = threading.Thread(target=lambda: theirs.append(round_model("cnn", SHAPE, 10)))
    thread.start()
    thread.join()
    assert theirs and theirs[0] is not mine and round_model("cnn", SHAPE, 10) is mine
