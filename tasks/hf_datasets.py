"""Hugging Face image-classification datasets (``hf:<name>``) as normalised splits.

Any Hub dataset with ``train`` and ``test`` splits, an image column and a label column, through
``datasets.load_dataset`` (needs the Hub, or its local cache). With no standard constants for an
arbitrary dataset, the pixels are normalised with the training split's own per-channel mean and
std (:mod:`tasks.normalization`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from tasks.array_dataset import DatasetSplits
from tasks.dataset_files import DATASETS
from tasks.normalization import normalized_splits

__all__ = ["HF_PREFIX", "hf_split_arrays", "read_hf_dataset"]

HF_PREFIX: Final = "hf:"

_HF_IMAGE_COLUMNS: Final = ("image", "img")
_HF_LABEL_COLUMNS: Final = ("label", "fine_label")


def read_hf_dataset(name: str, data_dir: str | None) -> DatasetSplits:
    """Load ``hf:<hub name>`` from the Hub, or from the Hugging Face cache folder ``data_dir``.

    Raises
    ------
    ConnectionError
        When the dataset is neither reachable nor cached (or the name is wrong).
    ValueError
        When it lacks a ``train`` or ``test`` split, or an image or label column.
    """
    import datasets  # heavy import; only needed here

    hub_name = name.removeprefix(HF_PREFIX)
    try:
        dd = datasets.load_dataset(hub_name, cache_dir=data_dir or None)
    except (ConnectionError, OSError) as exc:
        raise ConnectionError(
            f"could not load Hugging Face dataset {hub_name!r}: the Hub is unreachable "
            f"(offline?) and the dataset is not in the local cache, or the name is wrong. "
            f"Use a local dataset instead ({', '.join(DATASETS)}). Cause: {exc}"
        ) from exc
    missing = [s for s in ("train", "test") if s not in dd]
    if missing:
        raise ValueError(f"hf dataset {hub_name!r} lacks split(s) {missing}; found {list(dd)}")
    tr_img, tr_lab, n_cls = hf_split_arrays(dd["train"], name)
    te_img, te_lab, _ = hf_split_arrays(dd["test"], name)
    # No standard constants for an arbitrary dataset: use the train set's own statistics.
    scaled = tr_img.astype(np.float64) / 255.0
    mean = tuple(float(m) for m in scaled.mean(axis=(0, 2, 3)))
    std = tuple(max(float(s), 1e-6) for s in scaled.std(axis=(0, 2, 3)))
    del scaled
    return normalized_splits(name, n_cls, mean, std, (tr_img, tr_lab), (te_img, te_lab))


def _pick_column(columns: Sequence[str], candidates: Sequence[str], what: str, name: str) -> str:
    for column in candidates:
        if column in columns:
            return column
    raise ValueError(
        f"hf dataset {name!r}: no {what} column; looked for {', '.join(candidates)}; "
        f"found {', '.join(columns)}"
    )


def hf_split_arrays(split: Any, name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Convert one Hugging Face image-classification split to uint8 NCHW and labels.

    Parameters
    ----------
    split : datasets.Dataset
        A split with an image column (``image`` or ``img``) and a label column
        (``label`` or ``fine_label``).
    name : str
        Dataset name, for error messages.

    Returns
    -------
    images : np.ndarray
        uint8 ``N x C x H x W``.
    labels : np.ndarray
        int64 ``(N,)``.
    num_classes : int
        From the label's ``ClassLabel`` feature, else ``max(label) + 1``.
    """
    image_col = _pick_column(split.column_names, _HF_IMAGE_COLUMNS, "image", name)
    label_col = _pick_column(split.column_names, _HF_LABEL_COLUMNS, "label", name)
    columns = split.select_columns([image_col, label_col]).with_format("numpy")[:]
    images = np.asarray(columns[image_col])
    if images.dtype == object:
        raise ValueError(f"hf dataset {name!r}: images do not all have the same size")
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4:
        images = images.transpose(0, 3, 1, 2)  # HWC -> CHW
    else:
        raise ValueError(f"hf dataset {name!r}: unexpected image array shape {images.shape}")
    labels = np.asarray(columns[label_col]).astype(np.int64)
    feature = split.features[label_col]
    num_classes = int(getattr(feature, "num_classes", 0) or labels.max() + 1)
    return np.ascontiguousarray(images.astype(np.uint8)), labels, num_classes
