"""Pixel normalisation: each dataset's standard constants, uint8 images to standardised float32,
and the read-only :class:`~tasks.array_dataset.DatasetSplits` built from them.

For pixels ``u`` in ``{0, ..., 255}`` and channel constants ``(mean, std)`` in [0, 1] pixel units,
``x = (u / 255 - mean) / std``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from tasks.array_dataset import ArrayDataset, DatasetSplits

__all__ = ["NORMALIZATION", "normalize_uint8", "normalized_splits"]

NORMALIZATION: Final[dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "emnist": ((0.1307,), (0.3081,)),  # MNIST constants, as in FedCEO's code
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
"""Per-channel (mean, std) of pixels scaled to [0, 1]."""


def normalize_uint8(images: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Scale uint8 ``N x C x H x W`` images to [0, 1], then standardise per channel.

    Parameters
    ----------
    images : np.ndarray
        uint8 images, channels first.
    mean, std : sequence of float
        One value per channel, in [0, 1] pixel units.

    Returns
    -------
    np.ndarray
        float32 array of the same shape.
    """
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(
            f"normalize_uint8 expects uint8 N x C x H x W; found {images.dtype} {images.shape}"
        )
    channels = images.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"normalize_uint8: need {channels} mean/std values; found {len(mean)}/{len(std)}"
        )
    mean64, std64 = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    if not (np.all(np.isfinite(mean64)) and np.all(std64 > 0)):
        raise ValueError(f"normalize_uint8: need finite means and stds > 0; found {mean}, {std}")
    # (u / 255 - mean) / std, as one multiply and one subtract in place (fast on 47M pixels)
    scale = (1.0 / (255.0 * std64)).astype(np.float32).reshape(1, channels, 1, 1)
    shift = (mean64 / std64).astype(np.float32).reshape(1, channels, 1, 1)
    out = images.astype(np.float32)
    out *= scale
    out -= shift
    return out


def _frozen(data: ArrayDataset) -> ArrayDataset:
    """Mark the arrays read-only (they are shared through the cache)."""
    data.x.setflags(write=False)
    data.y.setflags(write=False)
    return data


def normalized_splits(
    name: str,
    num_classes: int,
    mean: Sequence[float],
    std: Sequence[float],
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
) -> DatasetSplits:
    """The train and test splits of uint8 ``(images, labels)`` pairs, normalised with ``(mean, std)``.

    Labels become int64; every array comes back read-only, as the cache of
    :func:`tasks.datasets.load_dataset` shares it between callers.
    """

    def one(images: np.ndarray, labels: np.ndarray) -> ArrayDataset:
        x = normalize_uint8(images, mean, std)
        return _frozen(ArrayDataset(x, labels.astype(np.int64), num_classes, name))

    return DatasetSplits(train=one(*train), test=one(*test))
