"""The validation split: a fixed part of the training split that no client holds, for tuning
hyperparameters without ever looking at the test split (``evaluation-split``).

The same images for every run seed (:data:`VALIDATION_SEED`); the clients share the rest of the
training split (:func:`training_pool`), the server evaluates on the split chosen (:func:`evaluation_set`).
"""

from __future__ import annotations

import functools
from typing import Final

import numpy as np

from tasks.array_dataset import ArrayDataset, DatasetSplits

__all__ = ["EVALUATION_SPLITS", "VALIDATION_PARTS", "VALIDATION_SEED", "check_evaluation_split", "evaluation_set",
           "training_pool", "validation_mask"]

#: ``evaluation-split``: what the server evaluates on. ``"test"``: the official test split;
#: ``"validation"``: a fixed part of the training split that no client holds, for tuning
#: hyperparameters without ever looking at the test split.
EVALUATION_SPLITS: Final = ("test", "validation")

#: The validation split is one part in this many of the training split, rounded up (10,000
#: of Fashion-MNIST's 60,000 images).
VALIDATION_PARTS: Final = 6

#: Seed of the validation hold-out, the same for every run seed: tuning runs on any seed
#: evaluate on the same images, and none of them trains on those.
VALIDATION_SEED: Final = 0x76616C6964  # ASCII "valid"


@functools.lru_cache(maxsize=4)
def validation_mask(num_train: int) -> np.ndarray:
    """Which of ``num_train`` training examples form the validation split (read-only mask).

    ⌈n/6⌉ of them (:data:`VALIDATION_PARTS`), chosen by a permutation seeded with
    :data:`VALIDATION_SEED`.
    """
    held = np.zeros(num_train, dtype=bool)
    held[np.random.default_rng(VALIDATION_SEED).permutation(num_train)[: -(-num_train // VALIDATION_PARTS)]] = True
    held.flags.writeable = False
    return held


def check_evaluation_split(evaluation_split: str) -> str:
    """``evaluation_split`` if it is one of :data:`EVALUATION_SPLITS`; a ValueError naming the key otherwise."""
    if evaluation_split not in EVALUATION_SPLITS:
        raise ValueError(f"'evaluation-split' must be one of {', '.join(EVALUATION_SPLITS)}; "
                         f"found {evaluation_split!r}")
    return evaluation_split


def training_pool(splits: DatasetSplits, evaluation_split: str) -> np.ndarray:
    """Indices into ``splits.train`` of the examples clients may hold.

    All of them, or all but the validation split (:func:`validation_mask`) under ``"validation"``.
    """
    n = len(splits.train)
    if check_evaluation_split(evaluation_split) == "test":
        return np.arange(n, dtype=np.int64)
    return np.flatnonzero(~validation_mask(n))


def evaluation_set(splits: DatasetSplits, evaluation_split: str) -> ArrayDataset:
    """What the server evaluates on.

    The official test split, or the validation split (training examples no client holds,
    named ``<dataset>-validation``).
    """
    if check_evaluation_split(evaluation_split) == "test":
        return splits.test
    held = splits.train.subset(np.flatnonzero(validation_mask(len(splits.train))))
    return ArrayDataset(held.x, held.y, held.num_classes, f"{held.name}-validation")
