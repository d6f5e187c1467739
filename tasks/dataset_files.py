"""The local datasets on disk: their names, the files each one needs, the folders searched for
them, and the error that names every path tried and how to get the files.

Only file names and ``stat`` calls: nothing here opens a file, so
:func:`tasks.datasets.check_available` can refuse a missing dataset before a run starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "CIFAR10_SUBDIR",
    "CIFAR10_TEST_BATCH",
    "CIFAR10_TRAIN_BATCHES",
    "DATASETS",
    "DEFAULT_EMNIST_SPLIT",
    "DEFAULT_FASHION_MNIST_DIR",
    "EMNIST_SPLITS",
    "MNIST_FILES",
    "emnist_split",
    "locate_cifar10_files",
    "locate_idx_files",
]

DATASETS: Final = ("fashion-mnist", "mnist", "emnist", "cifar10")
"""Local datasets; any ``hf:<name>`` (:data:`tasks.hf_datasets.HF_PREFIX`) is accepted as well."""

EMNIST_SPLITS: Final[dict[str, int]] = {
    "balanced": 47,
    "byclass": 62,
    "bymerge": 47,
    "digits": 10,
    "letters": 26,
    "mnist": 10,
}
"""EMNIST split -> number of classes (``letters`` labels are shifted from 1..26 to 0..25)."""

DEFAULT_EMNIST_SPLIT: Final = "letters"

DEFAULT_FASHION_MNIST_DIR: Final = "/usr/share/datasets/fashion-mnist"
"""Where ``apt-get install dataset-fashion-mnist`` puts the IDX files."""

MNIST_FILES: Final = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
"""Base names of the (Fashion-)MNIST IDX files; each may also end in ``.gz``."""

CIFAR10_TRAIN_BATCHES: Final = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH: Final = "test_batch"
CIFAR10_SUBDIR: Final = "cifar-10-batches-py"

_HINTS: Final[dict[str, str]] = {
    "fashion-mnist": (
        "Install them with `apt-get install dataset-fashion-mnist` (they go to "
        f"{DEFAULT_FASHION_MNIST_DIR}), or put the four files (gzip or not) in a folder "
        "and pass it with `--set data-dir=PATH`."
    ),
    "mnist": (
        "Download the four MNIST IDX files (http://yann.lecun.com/exdb/mnist/ or a "
        "mirror) into a folder and pass it with `--set data-dir=PATH`."
    ),
    "emnist": (
        "Download NIST's EMNIST `gzip.zip` (https://www.nist.gov/itl/products-and-services/"
        "emnist-dataset), unzip it into a folder and pass it with `--set data-dir=PATH`."
    ),
    "cifar10": (
        "Download cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html), "
        "extract it and pass the folder with `--set data-dir=PATH`."
    ),
}


def emnist_split(name: str) -> str:
    """The EMNIST split that ``emnist`` (:data:`DEFAULT_EMNIST_SPLIT`) or ``emnist-<split>`` names."""
    split = DEFAULT_EMNIST_SPLIT if name == "emnist" else name.removeprefix("emnist-")
    if split not in EMNIST_SPLITS:
        allowed = ", ".join(f"emnist-{s}" for s in EMNIST_SPLITS)
        raise ValueError(f"dataset: unknown EMNIST split in {name!r}; allowed: emnist, {allowed}")
    return split


def locate_idx_files(name: str, data_dir: str | None) -> tuple[str, list[Path]]:
    """The IDX files of ``fashion-mnist``, ``mnist`` or ``emnist[-<split>]`` under ``data_dir``.

    Returns
    -------
    family : str
        The dataset's full name (``emnist`` becomes ``emnist-letters``).
    paths : list of Path
        Train images, train labels, test images, test labels: each base name (``.gz`` or not)
        in ``data_dir``, else in torchvision's ``data_dir/{FashionMNIST,MNIST,EMNIST}/raw``
        or, for EMNIST, NIST's ``data_dir/gzip``.

    Raises
    ------
    FileNotFoundError
        Naming every path tried and how to get the files.
    """
    if name.startswith("emnist"):
        family = f"emnist-{emnist_split(name)}"
        bases = tuple(f"{family}-{f.replace('t10k', 'test')}" for f in MNIST_FILES)
        subdirs = ["gzip", "EMNIST/raw"]
    else:
        family, bases = name, MNIST_FILES
        subdirs = ["FashionMNIST/raw" if name == "fashion-mnist" else "MNIST/raw"]
    found = _locate(family, bases, _data_folders(data_dir, subdirs))
    return family, [found[base] for base in bases]


def locate_cifar10_files(data_dir: str | None) -> tuple[list[Path], Path]:
    """The five training batches and the test batch of CIFAR-10's python version.

    Each in ``data_dir`` or ``data_dir/cifar-10-batches-py``, under its exact name (the batches
    are never gzipped); FileNotFoundError naming every path tried otherwise.
    """
    folders = _data_folders(data_dir, [CIFAR10_SUBDIR])
    found: dict[str, Path] = {}
    missing: dict[str, list[Path]] = {}
    for base in (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH):
        tried = [folder / base for folder in folders]
        hit = next((p for p in tried if p.is_file()), None)
        if hit is None:
            missing[base] = tried
        else:
            found[base] = hit
    if missing:
        raise _missing_files_error("cifar10", missing)
    return [found[b] for b in CIFAR10_TRAIN_BATCHES], found[CIFAR10_TEST_BATCH]


def _find(base: str, folders: Sequence[Path]) -> tuple[Path | None, list[Path]]:
    """First existing ``folder/base`` or ``folder/base.gz``, and every path tried."""
    tried: list[Path] = []
    for folder in folders:
        for candidate in (folder / base, folder / f"{base}.gz"):
            tried.append(candidate)
            if candidate.is_file():
                return candidate, tried
    return None, tried


def _missing_files_error(name: str, missing: dict[str, list[Path]]) -> FileNotFoundError:
    """One error listing, for each missing base name, every path tried, then how to get the files."""
    lines = [f"dataset {name!r}: missing file(s):"]
    for base, tried in missing.items():
        where = ", ".join(str(p) for p in tried) or "nowhere (no default folder: give data_dir)"
        lines.append(f"  {base}: looked for {where}")
    family = "emnist" if name.startswith("emnist") else name
    lines.append(_HINTS[family])
    return FileNotFoundError("\n".join(lines))


def _locate(name: str, bases: Sequence[str], folders: Sequence[Path]) -> dict[str, Path]:
    """Paths of all ``bases``; FileNotFoundError naming every path tried otherwise."""
    found: dict[str, Path] = {}
    missing: dict[str, list[Path]] = {}
    for base in bases:
        path, tried = _find(base, folders)
        if path is None:
            missing[base] = tried
        else:
            found[base] = path
    if missing:
        raise _missing_files_error(name, missing)
    return found


def _data_folders(data_dir: str | None, subdirs: Sequence[str]) -> list[Path]:
    """Folders to search: ``data_dir`` itself, then ``data_dir/<subdir>`` for each subdir."""
    if not data_dir:
        return []
    base = Path(data_dir)
    return [base, *(base / subdir for subdir in subdirs)]
