"""Readers of the local datasets' files into normalised :class:`~tasks.array_dataset.DatasetSplits`.

- the IDX family (:mod:`tasks.idx`): MNIST, Fashion-MNIST and EMNIST, whose images NIST stores
  column-major and whose ``letters`` labels run from 1;
- CIFAR-10's python batches (pickles: only read files you trust).

Where the files are is :mod:`tasks.dataset_files`; the cache in front is :mod:`tasks.datasets`.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tasks.array_dataset import DatasetSplits
from tasks.dataset_files import EMNIST_SPLITS
from tasks.idx import idx_read
from tasks.normalization import NORMALIZATION, normalized_splits

__all__ = ["read_cifar10", "read_idx_dataset"]


def read_idx_dataset(family: str, paths: Sequence[Path]) -> DatasetSplits:
    """Read ``fashion-mnist``, ``mnist`` or ``emnist-<split>`` from its four IDX files.

    Parameters
    ----------
    family : str
        The full name, as :func:`tasks.dataset_files.locate_idx_files` returns it.
    paths : sequence of Path
        Train images, train labels, test images, test labels.

    Raises
    ------
    ValueError
        If a file is not uint8 ``N x H x W`` images, or labels of the right count and range.
    """
    if family.startswith("emnist"):
        split = family.removeprefix("emnist-")
        return _read_idx_family(family, paths, EMNIST_SPLITS[split], "emnist", transpose=True,
                                label_offset=1 if split == "letters" else 0)
    return _read_idx_family(family, paths, 10, family)


def _idx_images(path: Path) -> np.ndarray:
    images = idx_read(path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{path}: expected uint8 N x H x W images; found {images.dtype} {images.shape}"
        )
    return images[:, None, :, :]


def _idx_labels(path: Path, count: int) -> np.ndarray:
    labels = idx_read(path)
    if labels.shape != (count,):
        raise ValueError(f"{path}: expected {count} labels; found shape {labels.shape}")
    return labels.astype(np.int64)


def _read_idx_family(
    name: str,
    paths: Sequence[Path],
    num_classes: int,
    norm_key: str,
    *,
    transpose: bool = False,
    label_offset: int = 0,
) -> DatasetSplits:
    tr_img, tr_lab, te_img, te_lab = paths
    parts = []
    for img_path, lab_path in ((tr_img, tr_lab), (te_img, te_lab)):
        images = _idx_images(img_path)
        if transpose:  # EMNIST stores images column-major
            images = np.ascontiguousarray(images.transpose(0, 1, 3, 2))
        labels = _idx_labels(lab_path, len(images)) - label_offset
        if labels.min() < 0 or labels.max() >= num_classes:
            raise ValueError(
                f"{lab_path}: labels must lie in [0, {num_classes}) after the offset "
                f"{label_offset}; found [{labels.min()}, {labels.max()}]"
            )
        parts.append((images, labels))
    mean, std = NORMALIZATION[norm_key]
    return normalized_splits(name, num_classes, mean, std, parts[0], parts[1])


def read_cifar10(train_batches: Sequence[Path], test_batch: Path) -> DatasetSplits:
    """Read CIFAR-10 from its python batches (as :func:`tasks.dataset_files.locate_cifar10_files` finds them).

    Raises
    ------
    ValueError
        If a file is not a CIFAR-10 python batch of ``N x 3072`` uint8 images.
    """
    mean, std = NORMALIZATION["cifar10"]
    return normalized_splits("cifar10", 10, mean, std, _cifar_arrays(train_batches), _cifar_arrays([test_batch]))


def _unpickle(path: Path) -> dict[bytes, Any]:
    # CIFAR's python batches are pickles: only load files you trust.
    with path.open("rb") as f:
        batch = pickle.load(f, encoding="bytes")
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: not a CIFAR-10 python batch (needs b'data' and b'labels')")
    return batch


def _cifar_arrays(paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for path in paths:
        batch = _unpickle(path)
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise ValueError(f"{path}: b'data' must be N x 3072 uint8; found {data.shape}")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)
