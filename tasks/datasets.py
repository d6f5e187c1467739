"""Image-classification datasets as normalised in-memory numpy arrays.

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
variance with each dataset's standard constants (:data:`NORMALIZATION`); labels as int64.
Parsed datasets are cached per process (:func:`load_dataset` parses each one once), and
the cached arrays are read-only so that no caller can corrupt them for the others.
"""

from __future__ import annotations

import functools
import gzip
import logging
import math
import pickle
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

log = logging.getLogger(__name__)

DATASETS: Final = ("fashion-mnist", "mnist", "emnist", "cifar10")
"""Local datasets; any ``hf:<name>`` (:data:`HF_PREFIX`) is accepted as well."""

HF_PREFIX: Final = "hf:"

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

NORMALIZATION: Final[dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "emnist": ((0.1307,), (0.3081,)),  # MNIST constants, as in FedCEO's code
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
"""Per-channel (mean, std) of pixels scaled to [0, 1]."""

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

_HF_IMAGE_COLUMNS: Final = ("image", "img")
_HF_LABEL_COLUMNS: Final = ("label", "fine_label")

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


# --------------------------------------------------------------------------- validation split

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


# --------------------------------------------------------------------------- IDX files

_IDX_DTYPES: Final[dict[int, np.dtype[Any]]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    """File content, gunzipped when it starts with the gzip magic number."""
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def idx_read(path: str | Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzip-compressed or not.

    Parameters
    ----------
    path : str or Path
        The file. Compression is detected from the content, not the name.

    Returns
    -------
    np.ndarray
        The array with the dimensions given in the header, in native byte order.

    Raises
    ------
    ValueError
        If the header is not a valid IDX header or the size does not match it.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (the magic number must start with 0x0000)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise ValueError(f"{path}: unknown IDX type code 0x{code:02X}; allowed: {allowed}")
    dtype = _IDX_DTYPES[code]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions announced)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    count = math.prod(dims)
    if len(raw) - header != count * dtype.itemsize:
        raise ValueError(
            f"{path}: IDX header announces shape {dims} ({count * dtype.itemsize} bytes) "
            f"but {len(raw) - header} bytes follow"
        )
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=header)
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def idx_write(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file, gzip-compressed when ``path`` ends in ``.gz``.

    Useful for test fixtures in the MNIST on-disk format.

    Raises
    ------
    ValueError
        If the dtype has no IDX type code.
    """
    path = Path(path)
    array = np.asarray(array)
    codes = {dt.newbyteorder("="): code for code, dt in _IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        allowed = ", ".join(str(dt) for dt in codes)
        raise ValueError(f"idx_write: dtype {array.dtype} has no IDX code; allowed: {allowed}")
    code = codes[native]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(_IDX_DTYPES[code]).tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)


# ------------------------------------------------------------------------ normalisation


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


def _make_splits(
    name: str,
    num_classes: int,
    norm_key: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
) -> DatasetSplits:
    mean, std = NORMALIZATION[norm_key]

    def one(images: np.ndarray, labels: np.ndarray) -> ArrayDataset:
        x = normalize_uint8(images, mean, std)
        return _frozen(ArrayDataset(x, labels.astype(np.int64), num_classes, name))

    return DatasetSplits(train=one(*train), test=one(*test))


# ------------------------------------------------------------------------ file lookup


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


# ------------------------------------------------------------------------ loaders


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


def _load_idx_family(
    name: str,
    folders: Sequence[Path],
    files: Sequence[str],
    num_classes: int,
    norm_key: str,
    *,
    transpose: bool = False,
    label_offset: int = 0,
) -> DatasetSplits:
    paths = _locate(name, files, folders)
    tr_img, tr_lab, te_img, te_lab = (paths[f] for f in files)
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
    log.info("loaded %s from %s", name, tr_img.parent)
    return _make_splits(name, num_classes, norm_key, parts[0], parts[1])


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


def _load_cifar10(data_dir: str | None) -> DatasetSplits:
    folders = _data_folders(data_dir, [CIFAR10_SUBDIR])
    bases = (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH)
    found: dict[str, Path] = {}
    missing: dict[str, list[Path]] = {}
    for base in bases:  # the batches are never gzipped
        tried = [folder / base for folder in folders]
        hit = next((p for p in tried if p.is_file()), None)
        if hit is None:
            missing[base] = tried
        else:
            found[base] = hit
    if missing:
        raise _missing_files_error("cifar10", missing)
    train = _cifar_arrays([found[b] for b in CIFAR10_TRAIN_BATCHES])
    test = _cifar_arrays([found[CIFAR10_TEST_BATCH]])
    log.info("loaded cifar10 from %s", found[CIFAR10_TEST_BATCH].parent)
    return _make_splits("cifar10", 10, "cifar10", train, test)


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


def _load_hf(name: str, data_dir: str | None) -> DatasetSplits:
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

    def one(images: np.ndarray, labels: np.ndarray) -> ArrayDataset:
        x = normalize_uint8(images, mean, std)
        return _frozen(ArrayDataset(x, labels, n_cls, name))

    return DatasetSplits(train=one(tr_img, tr_lab), test=one(te_img, te_lab))


def _emnist_split(name: str) -> str:
    split = DEFAULT_EMNIST_SPLIT if name == "emnist" else name.removeprefix("emnist-")
    if split not in EMNIST_SPLITS:
        allowed = ", ".join(f"emnist-{s}" for s in EMNIST_SPLITS)
        raise ValueError(f"dataset: unknown EMNIST split in {name!r}; allowed: emnist, {allowed}")
    return split


_load_lock = threading.Lock()


#: Datasets parsed in this process, most recently used last (at most _CACHE_SIZE).
_cache: OrderedDict[tuple[str, str | None], DatasetSplits] = OrderedDict()
_CACHE_SIZE = 4


def _parse(name: str, data_dir: str | None) -> DatasetSplits:
    if name == "fashion-mnist":
        folders = _data_folders(data_dir, ["FashionMNIST/raw"])
        return _load_idx_family(name, folders, MNIST_FILES, 10, "fashion-mnist")
    if name == "mnist":
        folders = _data_folders(data_dir, ["MNIST/raw"])
        return _load_idx_family(name, folders, MNIST_FILES, 10, "mnist")
    if name.startswith("emnist"):
        split = _emnist_split(name)
        files = tuple(f"emnist-{split}-{f.replace('t10k', 'test')}" for f in MNIST_FILES)
        folders = _data_folders(data_dir, ["gzip", "EMNIST/raw"])
        return _load_idx_family(
            f"emnist-{split}",
            folders,
            files,
            EMNIST_SPLITS[split],
            "emnist",
            transpose=True,
            label_offset=1 if split == "letters" else 0,
        )
    if name == "cifar10":
        return _load_cifar10(data_dir)
    return _load_hf(name, data_dir)


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
        One of :data:`DATASETS`, ``emnist-<split>`` (see :data:`EMNIST_SPLITS`), or
        ``hf:<name>`` for a Hugging Face dataset.
    data_dir : str or None
        Folder with the dataset's files. ``None`` or ``""`` means the default folder
        (only Fashion-MNIST has one, :data:`DEFAULT_FASHION_MNIST_DIR`). For ``hf:``
        names it is the Hugging Face cache folder. Expected files:

        - fashion-mnist, mnist: :data:`MNIST_FILES` (each may end in ``.gz``), in
          ``data_dir`` or torchvision's ``data_dir/{FashionMNIST,MNIST}/raw``;
        - emnist-<split>: ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte``
          (``.gz`` optional), in ``data_dir``, ``data_dir/gzip`` (NIST's zip) or
          ``data_dir/EMNIST/raw``;
        - cifar10: ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, in
          ``data_dir`` or ``data_dir/cifar-10-batches-py``.

    Returns
    -------
    DatasetSplits
        Read-only arrays shared by every caller in the process; use
        :meth:`ArrayDataset.subset` or ``np.array(...)`` for a writable copy.

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
        folders = _data_folders(folder, [CIFAR10_SUBDIR])
        missing = {b: [f / b for f in folders] for b in (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH)
                   if not any((f / b).is_file() for f in folders)}
        if missing:
            raise _missing_files_error("cifar10", missing)
        return
    if name.startswith("emnist"):
        split = _emnist_split(name)
        files = tuple(f"emnist-{split}-{f.replace('t10k', 'test')}" for f in MNIST_FILES)
        _locate(f"emnist-{split}", files, _data_folders(folder, ["gzip", "EMNIST/raw"]))
        return
    sub = "FashionMNIST/raw" if name == "fashion-mnist" else "MNIST/raw"
    _locate(name, MNIST_FILES, _data_folders(folder, [sub]))
