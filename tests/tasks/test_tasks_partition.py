"""Tests for tasks.partition: flwr-datasets partitioners over label/index tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.array_dataset import ArrayDataset, DatasetSplits
from tasks.dataset_files import DEFAULT_FASHION_MNIST_DIR, MNIST_FILES
from tasks.datasets import load_dataset
from tasks.partition import PARTITIONERS, client_data, partition_indices

NUM_CLASSES = 10
PER_CLASS = 200


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """2,000 labels, 200 per class, in a shuffled order."""
    y = np.repeat(np.arange(NUM_CLASSES), PER_CLASS)
    return np.random.default_rng(7).permutation(y)


def _all_parts(labels: np.ndarray, n: int, **kw: object) -> list[np.ndarray]:
    return [partition_indices(labels, n, i, **kw) for i in range(n)]


def _assert_disjoint(parts: list[np.ndarray]) -> np.ndarray:
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "partitions overlap"
    return joined


def _label_entropy(labels: np.ndarray, idx: np.ndarray) -> float:
    p = np.bincount(labels[idx], minlength=NUM_CLASSES) / len(idx)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_iid_disjoint_covering_balanced(labels: np.ndarray) -> None:
    parts = _all_parts(labels, 7, method="iid", seed=3)
    joined = _assert_disjoint(parts)
    np.testing.assert_array_equal(np.sort(joined), np.arange(len(labels)))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    # pre-shuffled: every IID client sees every class, roughly uniformly
    for p in parts:
        counts = np.bincount(labels[p], minlength=NUM_CLASSES)
        assert counts.min() > 0.5 * len(p) / NUM_CLASSES
    assert all(p.dtype == np.int64 for p in parts)


def test_dirichlet_small_alpha_more_skewed(labels: np.ndarray) -> None:
    skewed = _all_parts(labels, 10, method="dirichlet", alpha=0.1, seed=1)
    flat = _all_parts(labels, 10, method="dirichlet", alpha=100.0, seed=1)
    for parts in (skewed, flat):
        joined = _assert_disjoint(parts)
        assert len(joined) == len(labels)  # Dirichlet assigns every example
        assert min(len(p) for p in parts) >= 10  # flwr's default min_partition_size
    h_skewed = np.mean([_label_entropy(labels, p) for p in skewed])
    h_flat = np.mean([_label_entropy(labels, p) for p in flat])
    assert h_skewed < h_flat - 0.5
    assert h_flat > 0.95 * np.log(NUM_CLASSES)


def test_shards_few_labels_per_client(labels: np.ndarray) -> None:
    parts = _all_parts(labels, 10, method="shards", shards_per_client=2, seed=5)
    joined = _assert_disjoint(parts)
    np.testing.assert_array_equal(np.sort(joined), np.arange(len(labels)))
    for p in parts:
        assert len(p) == 200
        assert len(np.unique(labels[p])) <= 2
    # 20 shards of 100: each lies inside one class, so a client sees at most 4 labels
    four = _all_parts(labels, 5, method="shards", shards_per_client=4, seed=5)
    _assert_disjoint(four)
    assert all(len(np.unique(labels[p])) <= 4 for p in four)
    assert any(len(np.unique(labels[p])) < NUM_CLASSES for p in four)


@pytest.mark.parametrize("method", PARTITIONERS)
def test_deterministic_for_a_seed(labels: np.ndarray, method: str) -> None:
    a = partition_indices(labels, 10, 4, method=method, seed=11)
    b = partition_indices(labels.copy(), 10, 4, method=method, seed=11)
    c = partition_indices(labels, 10, 4, method=method, seed=12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(np.sort(a), np.sort(c))


def test_validation_names_the_key(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="partition_id must be in \\[0, 10\\).*found 10"):
        partition_indices(labels, 10, 10)
    with pytest.raises(ValueError, match="partition_id.*found -1"):
        partition_indices(labels, 10, -1)
    with pytest.raises(ValueError, match="iid, dirichlet, shards.*'pathological'"):
        partition_indices(labels, 10, 0, method="pathological")
    with pytest.raises(ValueError, match="alpha must be.*> 0"):
        partition_indices(labels, 10, 0, method="dirichlet", alpha=0.0)
    with pytest.raises(ValueError, match="shards_per_client"):
        partition_indices(labels, 10, 0, method="shards", shards_per_client=0)
    with pytest.raises(ValueError, match="num_partitions must be in"):
        partition_indices(labels, 0, 0)
    with pytest.raises(ValueError, match="labels must be a 1-D integer array"):
        partition_indices(labels.astype(np.float32), 10, 0)


def test_impossible_dirichlet_reports_parameters() -> None:
    y = np.repeat(np.arange(2), 30)
    with (
        pytest.warns(UserWarning),
        pytest.raises(ValueError, match="dirichlet partitioning.*alpha=0.01"),
    ):
        partition_indices(y, 6, 0, method="dirichlet", alpha=0.01, seed=0)


def _toy_splits(labels: np.ndarray) -> DatasetSplits:
    x = np.arange(len(labels), dtype=np.float32).reshape(-1, 1, 1, 1)
    train = ArrayDataset(x, labels.astype(np.int64), NUM_CLASSES, "toy")
    return DatasetSplits(train=train, test=train)


def test_client_data_subset_and_truncation(labels: np.ndarray) -> None:
    splits = _toy_splits(labels)
    idx = partition_indices(labels, 4, 1, method="dirichlet", alpha=0.5, seed=9)
    data = client_data(splits, 1, 4, method="dirichlet", alpha=0.5, shards_per_client=2, seed=9)
    np.testing.assert_array_equal(data.x[:, 0, 0, 0].astype(np.int64), idx)
    np.testing.assert_array_equal(data.y, labels[idx])
    assert data.num_classes == NUM_CLASSES and data.x.flags.writeable
    small = client_data(splits, 1, 4, method="dirichlet", alpha=0.5, seed=9, max_examples=17)
    np.testing.assert_array_equal(small.x, data.x[:17])
    assert len(client_data(splits, 1, 4, max_examples=10_000)) == 500
    with pytest.raises(ValueError, match="max_examples"):
        client_data(splits, 1, 4, max_examples=-1)


@pytest.mark.skipif(
    not all((Path(DEFAULT_FASHION_MNIST_DIR) / f"{f}.gz").is_file() for f in MNIST_FILES),
    reason="apt-get install dataset-fashion-mnist",
)
def test_real_fashion_mnist_shards() -> None:
    splits = load_dataset("fashion-mnist")
    parts = [
        client_data(splits, i, 100, method="shards", shards_per_client=2, seed=42)
        for i in (0, 57, 99)
    ]
    for part in parts:
        assert len(part) == 600 and len(np.unique(part.y)) <= 2
        assert part.x.shape == (600, 1, 28, 28)


@pytest.mark.parametrize(("size", "n", "seed"), [(60_000, 6_000, 42), (1_003, 7, 3), (50, 50, 0)])
def test_iid_fast_path_equals_flowers_iid_partitioner(size: int, n: int, seed: int) -> None:
    """The direct iid slice is exactly Flower's IidPartitioner over the same seeded shuffle."""
    from tasks.partition import INDEX_COLUMN, _build_partitioner, _Key, labels_fingerprint

    labels = np.random.default_rng(seed).integers(0, 10, size).astype(np.int64)
    key = _Key(fingerprint=labels_fingerprint(labels), method="iid", num_partitions=n, alpha=0.0,
               shards_per_client=0, min_partition_size=0, seed=seed)
    flower = _build_partitioner(labels, key)
    for pid in sorted({0, 1, n // 2, n - 1}):
        expected = np.asarray(flower.load_partition(pid)[INDEX_COLUMN].to_numpy(), dtype=np.int64)
        np.testing.assert_array_equal(partition_indices(labels, n, pid, method="iid", seed=seed), expected)


@pytest.mark.parametrize("method", ["iid", "shards"])
def test_no_client_holds_a_validation_example(method):
    """Under ``evaluation-split = "validation"`` the clients partition the rest of the training
    split: the union of every partition misses the validation examples, which the server
    evaluates on (⌈n/6⌉ of them, the same for every run seed)."""
    from tasks.array_dataset import DatasetSplits
    from tasks.validation_split import evaluation_set, validation_mask

    n = 600
    rng = np.random.default_rng(3)
    x = np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1)  # each image holds its own index
    train = ArrayDataset(x, rng.integers(0, 10, n).astype(np.int64), 10, "indexed")
    splits = DatasetSplits(train, ArrayDataset(x[:10], train.y[:10], 10, "test"))
    held = set(np.flatnonzero(validation_mask(n)))
    assert len(held) == n // 6
    evaluated = evaluation_set(splits, "validation")
    assert {int(v) for v in evaluated.x.ravel()} == held and evaluated.name == "indexed-validation"
    assert evaluation_set(splits, "test") is splits.test
    for seed in (1, 2):
        held_by_clients = [int(v) for p in range(6) for v in client_data(
            splits, p, 6, method=method, seed=seed, shards_per_client=2, evaluation_split="validation").x.ravel()]
        assert len(held_by_clients) == len(set(held_by_clients))
        # IID hands out the whole pool; Flower's shards drop the remainder of n' / (6·2) shards
        assert n - len(held) - (0 if method == "iid" else 6 * 2) <= len(held_by_clients) <= n - len(held)
        assert not held & set(held_by_clients)


@pytest.mark.parametrize("method", ["iid", "dirichlet", "shards"])
def test_read_only_labels_hash_once_and_partition_as_a_writable_copy(labels: np.ndarray, method: str) -> None:
    """A shared read-only label array (a simulation's cached dataset) is fingerprinted once over every client's
    shard and its size (#38: each client round re-hashed a fresh copy of the 60,000 labels), and the shards
    are those of a writable copy of the same labels, which is hashed on every call."""
    from unittest import mock

    import tasks.partition as partition

    shared, copied = _toy_splits(labels), _toy_splits(labels.copy())
    shared.train.y.flags.writeable = False  # as tasks.datasets.load_dataset leaves its cached arrays
    assert not shared.train.y.flags.writeable and copied.train.y.flags.writeable
    kw = {"method": method, "alpha": 0.5, "shards_per_client": 2, "seed": 4}
    partition._cache.clear()
    with mock.patch.object(partition.hashlib, "blake2b", wraps=partition.hashlib.blake2b) as hashed:
        for pid in range(5):
            np.testing.assert_array_equal(client_data(shared, pid, 5, **kw).x, client_data(copied, pid, 5, **kw).x)
            assert partition.client_size(shared, pid, 5, **kw) == len(client_data(copied, pid, 5, **kw))
    assert hashed.call_count == 1 + 2 * 5  # the shared labels once; the copy at each of its 10 calls
