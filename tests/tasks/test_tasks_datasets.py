"""Tests for tasks.datasets: IDX reader, local loaders, errors, normalisation, cache."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from tasks.array_dataset import ArrayDataset
from tasks.dataset_files import CIFAR10_SUBDIR, DEFAULT_FASHION_MNIST_DIR, MNIST_FILES
from tasks.datasets import load_dataset
from tasks.hf_datasets import hf_split_arrays
from tasks.idx import idx_read, idx_write
from tasks.normalization import NORMALIZATION

HAVE_FMNIST = all((Path(DEFAULT_FASHION_MNIST_DIR) / f"{f}.gz").is_file() for f in MNIST_FILES)
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="apt-get install dataset-fashion-mnist")


# ------------------------------------------------------------------------ IDX


def test_idx_read_hand_written_header(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 2, 3, 4) + array.tobytes()
    (tmp_path / "plain").write_bytes(raw)
    (tmp_path / "packed.gz").write_bytes(gzip.compress(raw))
    for name in ("plain", "packed.gz"):
        out = idx_read(tmp_path / name)
        assert out.dtype == np.uint8 and out.shape == (2, 3, 4)
        np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path: Path, dtype: type, suffix: str) -> None:
    array = (np.arange(60).reshape(3, 4, 5) - 7).astype(dtype)
    path = tmp_path / f"a-idx{suffix}"
    idx_write(path, array)
    raw = path.read_bytes()
    raw = gzip.decompress(raw) if suffix else raw
    assert raw[:2] == b"\x00\x00" and raw[3] == 3
    assert struct.unpack(">3I", raw[4:16]) == (3, 4, 5)
    out = idx_read(path)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, array)


def test_idx_read_rejects_bad_files(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01" + struct.pack(">I", 3) + b"abc")
    with pytest.raises(ValueError, match="magic"):
        idx_read(tmp_path / "bad")
    (tmp_path / "short").write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"abc")
    with pytest.raises(ValueError, match="announces shape"):
        idx_read(tmp_path / "short")
    (tmp_path / "code").write_bytes(b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"a")
    with pytest.raises(ValueError, match="0x07"):
        idx_read(tmp_path / "code")
    with pytest.raises(ValueError, match="has no IDX code"):
        idx_write(tmp_path / "x", np.zeros(3, dtype=np.complex64))


# ------------------------------------------------------------------------ fixtures


def _write_mnist_like(
    folder: Path,
    prefix: str = "",
    test_name: str = "t10k",
    gz: bool = True,
    n_train: int = 20,
    n_test: int = 10,
    label_offset: int = 0,
) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {
        "train-images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels": (np.arange(n_train) % 10 + label_offset).astype(np.uint8),
        f"{test_name}-images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        f"{test_name}-labels": (np.arange(n_test) % 10 + label_offset).astype(np.uint8),
    }
    suffix = ".gz" if gz else ""
    for key, arr in arrays.items():
        kind = "idx3" if "images" in key else "idx1"
        idx_write(folder / f"{prefix}{key}-{kind}-ubyte{suffix}", arr)
    return arrays


def test_mnist_layouts_from_data_dir(tmp_path: Path) -> None:
    arrays = _write_mnist_like(tmp_path / "flat", gz=False)
    splits = load_dataset("mnist", str(tmp_path / "flat"))
    assert splits.train.x.shape == (20, 1, 28, 28) and splits.test.x.shape == (10, 1, 28, 28)
    assert splits.train.x.dtype == np.float32 and splits.train.y.dtype == np.int64
    mean, std = NORMALIZATION["mnist"]
    expected = (arrays["train-images"] / 255.0 - mean[0]) / std[0]
    np.testing.assert_allclose(splits.train.x[:, 0], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(splits.train.y, arrays["train-labels"])
    assert splits.train.num_classes == 10 and splits.train.name == "mnist"
    # torchvision's layout, gzipped, under the fashion-mnist name
    _write_mnist_like(tmp_path / "tv" / "FashionMNIST" / "raw", gz=True)
    fm = load_dataset("fashion-mnist", str(tmp_path / "tv"))
    assert len(fm.train) == 20 and len(fm.test) == 10


def test_emnist_letters_transposed_and_shifted(tmp_path: Path) -> None:
    arrays = _write_mnist_like(
        tmp_path / "gzip", prefix="emnist-letters-", test_name="test", label_offset=1
    )
    splits = load_dataset("emnist", str(tmp_path))
    assert splits.train.name == "emnist-letters" and splits.train.num_classes == 26
    np.testing.assert_array_equal(splits.train.y, arrays["train-labels"].astype(np.int64) - 1)
    mean, std = NORMALIZATION["emnist"]
    expected = (arrays["train-images"].transpose(0, 2, 1) / 255.0 - mean[0]) / std[0]
    np.testing.assert_allclose(splits.train.x[:, 0], expected, rtol=1e-5, atol=1e-5)


def _write_cifar(folder: Path, per_batch: int = 4) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for b, name in enumerate(names):
        img = np.zeros((per_batch, 3, 32, 32), dtype=np.uint8)
        img[:, 0] = 255  # red
        img[:, 2] = 51  # some blue
        img[:, 1, 0, 0] = b  # marks the batch
        batch = {
            b"data": img.reshape(per_batch, -1),
            b"labels": [b % 10] * per_batch,
            b"batch_label": name.encode(),
        }
        with (folder / name).open("wb") as f:
            pickle.dump(batch, f)


@pytest.mark.parametrize("nested", [False, True])
def test_cifar10_python_batches(tmp_path: Path, nested: bool) -> None:
    _write_cifar(tmp_path / CIFAR10_SUBDIR if nested else tmp_path)
    splits = load_dataset("cifar10", str(tmp_path))
    assert splits.train.x.shape == (20, 3, 32, 32) and splits.test.x.shape == (4, 3, 32, 32)
    assert splits.train.num_classes == 10
    np.testing.assert_array_equal(splits.train.y, np.repeat(np.arange(5), 4))
    mean, std = NORMALIZATION["cifar10"]
    x = splits.train.x
    assert np.allclose(x[:, 0], (1.0 - mean[0]) / std[0])
    assert np.allclose(x[:, 2], (0.2 - mean[2]) / std[2])
    np.testing.assert_allclose(
        x[::4, 1, 0, 0], (np.arange(5) / 255.0 - mean[1]) / std[1], rtol=1e-5, atol=1e-5
    )


# ------------------------------------------------------------------------ errors


def test_missing_fashion_mnist_names_files_and_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("fashion-mnist", str(tmp_path))
    msg = str(info.value)
    for name in MNIST_FILES:
        assert str(tmp_path / name) in msg and str(tmp_path / f"{name}.gz") in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "data-dir" in msg


def test_missing_cifar_and_mnist(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_batch_1.*\n(.*\n)*.*test_batch"):
        load_dataset("cifar10", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte.*no default folder"):
        load_dataset("mnist")
    (tmp_path / "partial").mkdir()
    idx_write(tmp_path / "partial" / "train-images-idx3-ubyte", np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("mnist", str(tmp_path / "partial"))
    assert "train-labels-idx1-ubyte" in str(info.value)
    assert "train-images-idx3-ubyte:" not in str(info.value)


def test_unknown_dataset_lists_allowed() -> None:
    with pytest.raises(ValueError, match="fashion-mnist, mnist, emnist, cifar10.*'imagenet'"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="emnist"):
        load_dataset("emnist-nope")


def test_array_dataset_validates() -> None:
    with pytest.raises(ValueError, match="N x C x H x W"):
        ArrayDataset(np.zeros((2, 4), np.float32), np.zeros(2, np.int64), 2, "t")
    with pytest.raises(ValueError, match="float32"):
        ArrayDataset(np.zeros((2, 1, 2, 2)), np.zeros(2, np.int64), 2, "t")
    with pytest.raises(ValueError, match="shape"):
        ArrayDataset(np.zeros((2, 1, 2, 2), np.float32), np.zeros(3, np.int64), 2, "t")


# ------------------------------------------------------------------------ Hugging Face


def test_hf_split_conversion_in_memory() -> None:
    from datasets import ClassLabel, Dataset, Features, Image

    rng = np.random.default_rng(1)
    gray = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    ds = Dataset.from_dict(
        {"image": list(gray), "label": [0, 1, 2, 1, 0]},
        features=Features({"image": Image(), "label": ClassLabel(num_classes=4)}),
    )
    images, labels, n_cls = hf_split_arrays(ds, "hf:test")
    assert images.shape == (5, 1, 28, 28) and n_cls == 4 and labels.dtype == np.int64
    np.testing.assert_array_equal(images[:, 0], gray)
    rgb = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    ds = Dataset.from_dict(
        {"img": list(rgb), "fine_label": [5, 1, 2]},
        features=Features({"img": Image(), "fine_label": ClassLabel(num_classes=9)}),
    )
    images, labels, _ = hf_split_arrays(ds, "hf:rgb")
    np.testing.assert_array_equal(images, rgb.transpose(0, 3, 1, 2))
    with pytest.raises(ValueError, match="no label column.*label, fine_label"):
        hf_split_arrays(ds.rename_column("fine_label", "y"), "hf:rgb")


def test_hf_offline_gives_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConnectionError, match="offline.*fashion-mnist"):
        load_dataset("hf:nobody/no-such-dataset", str(tmp_path))


# ------------------------------------------------------------------------ real data


@needs_fmnist
def test_real_fashion_mnist() -> None:
    splits = load_dataset("fashion-mnist")
    train, test = splits.train, splits.test
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert train.num_classes == test.num_classes == 10 and train.input_shape == (1, 28, 28)
    np.testing.assert_array_equal(np.bincount(train.y), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(test.y), np.full(10, 1000))
    assert abs(float(train.x.mean())) < 0.01 and abs(float(train.x.std()) - 1.0) < 0.01
    # cached, shared and read-only; the default folder and "" are the same entry
    assert load_dataset("fashion-mnist", "") is splits
    assert load_dataset("fashion-mnist", DEFAULT_FASHION_MNIST_DIR) is splits
    assert not train.x.flags.writeable and not train.y.flags.writeable
    sub = train.subset([3, 1])
    assert sub.x.flags.writeable and sub.y.tolist() == train.y[[3, 1]].tolist()
