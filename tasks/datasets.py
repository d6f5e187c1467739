"""Image-classification datasets as normalised in-memory numpy arrays: the front door.

Sources, all read without torchvision:

- ``fashion-mnist``: the four official IDX files (gzip or not). The default folder is
  where Debian's ``dataset-fashion-mnist`` package installs them.
- ``mnist``: the four official IDX files in ``data_dir``.
- ``emnist`` / ``emnist-<split>``: the IDX files of NIST's ``gzip.zip`` in ``data_dir``.
  Plain ``emnist`` is the ``letters`` split, the one FedCEO uses.
- ``cifar10``: the python batches of ``cifar-10-python.tar.gz`` in ``data_dir`` (or in
  ``data_dir/cifar-10-batches-py``).
- ``hf:<name>``: any Hugging Face image-classification dataset with ``train`` and
  ``test`` splits, through ``datasets.load_dataset`` (needs the Hub, or its local cache).

Images come back as float32 ``N x C x H x W`` arrays normalised to zero mean and unit
variance with each dataset's standard constants (:data:`tasks.normalization.NORMALIZATION`);
labels as int64. Parsed datasets are cached per process (:func:`load_dataset` parses each one
once), and the cached arrays are read-only so that no caller can corrupt them for the others.

Behind it: the types (:mod:`tasks.array_dataset`), where the files are and the errors when they
are not (:mod:`tasks.dataset_files`), the readers (:mod:`tasks.idx`, :mod:`tasks.dataset_readers`,
:mod:`tasks.hf_datasets`), the normalisation (:mod:`tasks.normalization`) and the validation
split (:mod:`tasks.validation_split`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path

from tasks.array_dataset import DatasetSplits
from tasks.dataset_files import (
    DATASETS,
    DEFAULT_FASHION_MNIST_DIR,
    EMNIST_SPLITS,
    locate_cifar10_files,
    locate_idx_files,
)
from tasks.dataset_readers import read_cifar10, read_idx_dataset
from tasks.hf_datasets import HF_PREFIX, read_hf_dataset

__all__ = ["check_available", "clear_cache", "is_loaded", "load_dataset", "source"]

log = logging.getLogger(__name__)

_load_lock = threading.Lock()


#: Datasets parsed in this process, most recently used last (at most _CACHE_SIZE).
_cache: OrderedDict[tuple[str, str | None], DatasetSplits] = OrderedDict()
_CACHE_SIZE = 4


def _parse(name: str, data_dir: str | None) -> DatasetSplits:
    if name == "cifar10":
        train_batches, test_batch = locate_cifar10_files(data_dir)
        splits = read_cifar10(train_batches, test_batch)
        log.info("loaded cifar10 from %s", test_batch.parent)
        return splits
    if name.startswith(HF_PREFIX):
        return read_hf_dataset(name, data_dir)
    family, paths = locate_idx_files(name, data_dir)
    splits = read_idx_dataset(family, paths)
    log.info("loaded %s from %s", family, paths[0].parent)
    return splits


def _check_name(name: str) -> str:
    if name in DATASETS or (name.startswith("emnist-") and name[7:] in EMNIST_SPLITS):
        return name
    if name.startswith(HF_PREFIX) and len(name) > len(HF_PREFIX):
        return name
    raise ValueError(
        f"dataset must be one of {', '.join(DATASETS)}, "
        f"emnist-<{'|'.join(EMNIST_SPLITS)}> or hf:<name>; found {name!r}"
    )


def load_dataset(name: str, data_dir: str | None = None) -> DatasetSplits:
    """Load the train and test splits of a dataset, normalised, cached per process.

    Parameters
    ----------
    name : str
        One of :data:`~tasks.dataset_files.DATASETS`, ``emnist-<split>`` (see
        :data:`~tasks.dataset_files.EMNIST_SPLITS`), or ``hf:<name>`` for a Hugging Face dataset.
    data_dir : str or None
        Folder with the dataset's files. ``None`` or ``""`` means the default folder
        (only Fashion-MNIST has one, :data:`~tasks.dataset_files.DEFAULT_FASHION_MNIST_DIR`).
        For ``hf:`` names it is the Hugging Face cache folder. Expected files:

        - fashion-mnist, mnist: :data:`~tasks.dataset_files.MNIST_FILES` (each may end in
          ``.gz``), in ``data_dir`` or torchvision's ``data_dir/{FashionMNIST,MNIST}/raw``;
        - emnist-<split>: ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte``
          (``.gz`` optional), in ``data_dir``, ``data_dir/gzip`` (NIST's zip) or
          ``data_dir/EMNIST/raw``;
        - cifar10: ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, in
          ``data_dir`` or ``data_dir/cifar-10-batches-py``.

    Returns
    -------
    DatasetSplits
        Read-only arrays shared by every caller in the process; use
        :meth:`~tasks.array_dataset.ArrayDataset.subset` or ``np.array(...)`` for a writable copy.

    Raises
    ------
    ValueError
        For an unknown name, or files that do not hold what they should.
    FileNotFoundError
        Naming every file looked for and how to get it.
    ConnectionError
        For an ``hf:`` dataset that is neither reachable nor cached.
    """
    key = source(name, data_dir)
    with _load_lock:  # concurrent clients in one process parse each dataset once
        if key in _cache:
            _cache.move_to_end(key)
        else:
            _cache[key] = _parse(*key)
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return _cache[key]


def source(name: str, data_dir: str | None = None) -> tuple[str, str | None]:
    """``(name, folder)`` that ``load_dataset(name, data_dir)`` reads: the checked name and
    the resolved absolute folder (Fashion-MNIST's default folder when none is given;
    None for other datasets without one).
    """
    name = _check_name(name.strip())
    if not data_dir and name == "fashion-mnist":
        data_dir = DEFAULT_FASHION_MNIST_DIR
    return name, (str(Path(data_dir).expanduser().resolve()) if data_dir else None)


def is_loaded(name: str, data_dir: str | None = None) -> bool:
    """Whether this process holds the dataset in memory (loading it again is free)."""
    return source(name, data_dir) in _cache


def clear_cache() -> None:
    """Forget every dataset parsed so far in this process."""
    with _load_lock:
        _cache.clear()


def check_available(name: str, data_dir: str | None = None) -> None:
    """Check, without parsing anything, that ``load_dataset(name, data_dir)`` finds its files.

    Cheap enough to run before a run starts (it only stats files), so that a missing
    dataset is refused before any results directory or process exists.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the accepted ones).
    FileNotFoundError
        Naming every file looked for and how to install the dataset.

    ``hf:<name>`` datasets are not checked here (only the Hub or its cache can tell).
    """
    name, folder = source(name, data_dir)
    if name.startswith(HF_PREFIX):
        return
    if name == "cifar10":
        locate_cifar10_files(folder)
        return
    locate_idx_files(name, folder)
