"""The in-memory dataset types: a labelled image array (:class:`ArrayDataset`) and its official
train/test pair (:class:`DatasetSplits`), each checked on construction.

What :func:`tasks.datasets.load_dataset` returns, what the partitioners cut into client shards,
and what the clients train on; this module reads no files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ArrayDataset", "DatasetSplits"]


@dataclass(frozen=True)
class ArrayDataset:
    """A labelled image dataset held in memory.

    Parameters
    ----------
    x : np.ndarray
        float32 images, ``N x C x H x W``, already normalised.
    y : np.ndarray
        int64 labels in ``[0, num_classes)``, shape ``(N,)``.
    num_classes : int
        Number of classes of the whole dataset (not only those present in ``y``).
    name : str
        Dataset name, for logs.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        """Check shapes and dtypes."""
        if self.x.ndim != 4:
            raise ValueError(f"{self.name}: x must be N x C x H x W; found shape {self.x.shape}")
        if self.y.ndim != 1 or len(self.y) != len(self.x):
            raise ValueError(
                f"{self.name}: y must have shape ({len(self.x)},); found {self.y.shape}"
            )
        if self.x.dtype != np.float32 or self.y.dtype != np.int64:
            raise ValueError(
                f"{self.name}: x must be float32 and y int64; "
                f"found {self.x.dtype} and {self.y.dtype}"
            )
        if self.num_classes < 1:
            raise ValueError(f"{self.name}: num_classes must be >= 1; found {self.num_classes}")

    def __len__(self) -> int:
        """Return the number of examples."""
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one image, ``(C, H, W)``."""
        c, h, w = self.x.shape[1:]
        return (int(c), int(h), int(w))

    def subset(self, indices: np.ndarray | Sequence[int]) -> ArrayDataset:
        """Return a new dataset with the given rows (copied, so writable)."""
        idx = np.asarray(indices, dtype=np.int64)
        return ArrayDataset(self.x[idx], self.y[idx], self.num_classes, self.name)


@dataclass(frozen=True)
class DatasetSplits:
    """The official train and test splits of one dataset."""

    train: ArrayDataset
    test: ArrayDataset

    def __post_init__(self) -> None:
        """Check that the splits agree on classes and image shape."""
        if self.train.num_classes != self.test.num_classes:
            raise ValueError(
                f"train and test disagree on num_classes: "
                f"{self.train.num_classes} != {self.test.num_classes}"
            )
        if self.train.input_shape != self.test.input_shape:
            raise ValueError(
                f"train and test disagree on the image shape: "
                f"{self.train.input_shape} != {self.test.input_shape}"
            )
