"""Split a training set across clients with Flower's ``flwr-datasets`` partitioners.

The partitioners run on a small in-memory ``datasets.Dataset`` with two columns, the
label and the row's index into the training set, never the pixels. A partition is the
``index`` column of what the partitioner returns. As ``FederatedDataset`` does, the rows
are shuffled with the seed before partitioning (Flower's ``IidPartitioner`` cuts
contiguous blocks, so this is what makes it IID).

Methods (:data:`PARTITIONERS`):

- ``iid``: ``IidPartitioner``, equal sizes (within one), all data used.
- ``dirichlet``: ``DirichletPartitioner(partition_by="label", alpha)``; per class, the
  shares of the clients are drawn from Dir(alpha). Small alpha means skewed labels.
- ``shards``: ``ShardPartitioner(partition_by="label", num_shards_per_partition)``, the
  McMahan et al. (2017) split used by FedCEO and PFA: sort by label, cut into equal
  shards, give each client ``shards_per_client`` random shards.

Each partitioner is built once per process and parameter set, then reused.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from tasks.array_dataset import ArrayDataset, DatasetSplits
from tasks.validation_split import training_pool

log = logging.getLogger(__name__)

PARTITIONERS: Final = ("iid", "dirichlet", "shards")

LABEL_COLUMN: Final = "label"
INDEX_COLUMN: Final = "index"

_lock = threading.Lock()


def _validate(
    num_examples: int,
    num_partitions: int,
    partition_id: int,
    method: str,
    alpha: float,
    shards_per_client: int,
    min_partition_size: int,
) -> None:
    if method not in PARTITIONERS:
        raise ValueError(
            f"partitioner method must be one of {', '.join(PARTITIONERS)}; found {method!r}"
        )
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int | np.integer):
        raise ValueError(f"num_partitions must be an int; found {num_partitions!r}")
    if not 1 <= num_partitions <= num_examples:
        raise ValueError(
            f"num_partitions must be in [1, {num_examples}] (the number of examples); "
            f"found {num_partitions}"
        )
    if isinstance(partition_id, bool) or not isinstance(partition_id, int | np.integer):
        raise ValueError(f"partition_id must be an int; found {partition_id!r}")
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition_id must be in [0, {num_partitions}) (num_partitions={num_partitions}); "
            f"found {partition_id}"
        )
    if method == "dirichlet":
        if isinstance(alpha, bool) or not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0; found {alpha!r}")
        if min_partition_size < 0:
            raise ValueError(f"min_partition_size must be >= 0; found {min_partition_size}")
    if method == "shards":
        if isinstance(shards_per_client, bool) or shards_per_client < 1:
            raise ValueError(f"shards_per_client must be an int >= 1; found {shards_per_client!r}")
        if num_partitions * shards_per_client > num_examples:
            raise ValueError(
                f"num_partitions * shards_per_client = {num_partitions * shards_per_client} "
                f"shards cannot be cut from {num_examples} examples"
            )


def labels_fingerprint(labels: np.ndarray) -> str:
    """Hash a label vector's content (the partitioner cache key).

    A read-only array (the shared, cached dataset's labels, which every client of a
    simulation passes) is hashed once and remembered for as long as it lives; writable
    arrays are hashed on every call, since their content may change.
    """
    known = _fingerprints.get(id(labels))
    if known is not None and known[0]() is labels and not labels.flags.writeable:
        return known[1]
    arr = np.ascontiguousarray(labels, dtype=np.int64)
    digest = hashlib.blake2b(arr.tobytes(), digest_size=16).hexdigest() + f"-{len(arr)}"
    if not labels.flags.writeable:
        _fingerprints[id(labels)] = (weakref.ref(labels), digest)
        if len(_fingerprints) > _CACHE_SIZE:
            _fingerprints.pop(next(iter(_fingerprints)))
    return digest


#: id(array) -> (weak reference, digest) of read-only label arrays already hashed.
_fingerprints: dict[int, tuple[weakref.ref[np.ndarray], str]] = {}


@dataclass(frozen=True)
class _Key:
    """Everything a partition depends on (parameters a method ignores are zeroed)."""

    fingerprint: str
    method: str
    num_partitions: int
    alpha: float
    shards_per_client: int
    min_partition_size: int
    seed: int


def _new_partitioner(key: _Key) -> Any:
    """Create the flwr-datasets partitioner for ``key`` (no dataset assigned yet)."""
    # flwr_datasets pulls in matplotlib and seaborn (~5 s): import it only when needed.
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        ShardPartitioner,
    )

    if key.method == "iid":
        return IidPartitioner(num_partitions=key.num_partitions)
    if key.method == "dirichlet":
        return DirichletPartitioner(
            num_partitions=key.num_partitions,
            partition_by=LABEL_COLUMN,
            alpha=key.alpha,
            min_partition_size=key.min_partition_size,
            seed=key.seed,
        )
    return ShardPartitioner(
        num_partitions=key.num_partitions,
        partition_by=LABEL_COLUMN,
        num_shards_per_partition=key.shards_per_client,
        seed=key.seed,
    )


def _build_partitioner(labels: np.ndarray, key: _Key) -> Any:
    """Create a partitioner over a seeded shuffle of ``(label, index)`` rows."""
    from datasets import Dataset

    order = np.random.default_rng(key.seed).permutation(len(labels))
    table = Dataset.from_dict({LABEL_COLUMN: labels[order], INDEX_COLUMN: order})
    # The arrow format makes ``table[column]`` a pyarrow array: the partitioners'
    # ``np.array(dataset[label])`` then takes microseconds instead of seconds.
    table = table.with_format("arrow")
    partitioner = _new_partitioner(key)
    partitioner.dataset = table
    log.debug("built %s partitioner, %d partitions", key.method, key.num_partitions)
    return partitioner


# Partitioners hold labels and indices only (no pixels): a few MB for 60k rows.
_CACHE_SIZE: Final = 8
_cache: OrderedDict[_Key, Any] = OrderedDict()


def _iid_shard(labels: np.ndarray, key: _Key, partition_id: int) -> np.ndarray:
    """Flower's ``IidPartitioner`` on the seeded shuffle, computed directly.

    ``IidPartitioner.load_partition(i)`` is ``Dataset.shard(n, i, contiguous=True)``: rows
    [div·i + min(i, mod), … + div + (i < mod)) with div, mod = divmod(N, n). The same slice of
    the cached permutation costs microseconds instead of milliseconds per client, which the
    budget handshake of thousands of clients pays once per client (tested equal).
    """
    with _lock:
        order = _cache.get(key)
        if order is None:
            order = _cache[key] = np.random.default_rng(key.seed).permutation(len(labels))
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        _cache.move_to_end(key)
    div, mod = divmod(len(labels), key.num_partitions)
    start = div * partition_id + min(partition_id, mod)
    return np.asarray(order[start:start + div + (1 if partition_id < mod else 0)], dtype=np.int64)


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    partition_id: int,
    *,
    method: str = "iid",
    alpha: float = 0.5,
    shards_per_client: int = 2,
    seed: int = 42,
    min_partition_size: int = 10,
) -> np.ndarray:
    """Return the indices into the training set of one client's partition.

    Parameters
    ----------
    labels : np.ndarray
        Integer labels of the whole training set, shape ``(N,)``.
    num_partitions : int
        Number of clients, in ``[1, N]``.
    partition_id : int
        This client, in ``[0, num_partitions)``.
    method : str
        One of :data:`PARTITIONERS`.
    alpha : float
        Dirichlet concentration (``dirichlet`` only), > 0.
    shards_per_client : int
        Shards per client (``shards`` only), >= 1.
    seed : int
        Seeds the pre-shuffle and the partitioner: equal seeds give equal partitions.
    min_partition_size : int
        ``dirichlet`` only: Flower redraws (up to 10 times) until every client has at
        least this many examples, then fails.

    Returns
    -------
    np.ndarray
        int64 indices, in a seeded random order. Partitions of one call family are
        disjoint; ``iid`` covers the whole set, ``shards`` all but the remainder of
        ``N / (num_partitions * shards_per_client)``.

    Raises
    ------
    ValueError
        For an unknown method or out-of-range parameter (the message names it).
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array; found {labels.dtype} {labels.shape}")
    _validate(
        len(labels),
        num_partitions,
        partition_id,
        method,
        alpha,
        shards_per_client,
        min_partition_size,
    )
    labels64 = np.ascontiguousarray(labels, dtype=np.int64)
    key = _Key(
        fingerprint=labels_fingerprint(labels),
        method=method,
        num_partitions=int(num_partitions),
        alpha=float(alpha) if method == "dirichlet" else 0.0,
        shards_per_client=int(shards_per_client) if method == "shards" else 0,
        min_partition_size=int(min_partition_size) if method == "dirichlet" else 0,
        seed=int(seed),
    )
    if method == "iid":
        return _iid_shard(labels64, key, int(partition_id))
    with _lock:
        partitioner = _cache.get(key)
        if partitioner is None:
            partitioner = _cache[key] = _build_partitioner(labels64, key)
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        _cache.move_to_end(key)
        try:
            with warnings.catch_warnings():
                # pyarrow >= 25 deprecates an option that datasets' sort still passes
                warnings.filterwarnings("ignore", "Specifying null_placement", FutureWarning)
                part = partitioner.load_partition(int(partition_id))
        except ValueError as exc:
            del _cache[key]  # its RNG has moved on: a retry must start afresh
            raise ValueError(
                f"{method} partitioning into {num_partitions} partitions failed "
                f"(alpha={alpha}, shards_per_client={shards_per_client}, "
                f"min_partition_size={min_partition_size}): {exc}"
            ) from exc
    return np.asarray(part[INDEX_COLUMN].to_numpy(), dtype=np.int64)


def _pool_labels(splits: DatasetSplits, pool: np.ndarray) -> np.ndarray:
    """The labels of the pool: the training labels themselves when the pool is all of them (the shared,
    read-only array, whose fingerprint :func:`labels_fingerprint` remembers), else a copy (hashed per call).
    """
    if len(pool) == len(splits.train.y):  # training_pool's "test": every index, in order
        return splits.train.y
    picked: np.ndarray = splits.train.y[pool]
    return picked


def client_data(
    splits: DatasetSplits,
    partition_id: int,
    num_partitions: int,
    *,
    method: str = "iid",
    alpha: float = 0.5,
    shards_per_client: int = 2,
    seed: int = 42,
    max_examples: int = 0,
    evaluation_split: str = "test",
) -> ArrayDataset:
    """One client's training data (a writable copy).

    Parameters
    ----------
    splits : DatasetSplits
        The dataset; only ``splits.train`` is partitioned.
    partition_id, num_partitions, method, alpha, shards_per_client, seed
        See :func:`partition_indices`.
    max_examples : int
        If > 0, keep only the first ``max_examples`` of the partition (its order is
        already a seeded shuffle, so this is a deterministic random subset).
    evaluation_split : str
        ``"validation"`` partitions only the training examples outside the validation
        split (:func:`tasks.validation_split.training_pool`); ``"test"``: all of them.

    Returns
    -------
    ArrayDataset
        The client's examples, with the dataset's ``num_classes``.
    """
    if isinstance(max_examples, bool) or max_examples < 0:
        raise ValueError(f"max_examples must be an int >= 0 (0 = no limit); found {max_examples!r}")
    pool = training_pool(splits, evaluation_split)
    indices = partition_indices(
        _pool_labels(splits, pool),
        num_partitions,
        partition_id,
        method=method,
        alpha=alpha,
        shards_per_client=shards_per_client,
        seed=seed,
    )
    if max_examples > 0:
        indices = indices[:max_examples]
    return splits.train.subset(pool[indices])


def client_size(splits: DatasetSplits, partition_id: int, num_partitions: int, *, method: str = "iid",
                alpha: float = 0.5, shards_per_client: int = 2, seed: int = 42, max_examples: int = 0,
                evaluation_split: str = "test") -> int:
    """``len(client_data(...))`` without copying the examples (the budget handshake's count)."""
    pool = training_pool(splits, evaluation_split)
    size = len(partition_indices(_pool_labels(splits, pool), num_partitions, partition_id, method=method, alpha=alpha,
                                 shards_per_client=shards_per_client, seed=seed))
    return min(size, max_examples) if max_examples > 0 else size


def clear_cache() -> None:
    """Forget every partitioner built so far in this process."""
    with _lock:
        _cache.clear()


#: Share of a personalized client's shard held out as its local test data (PPSGD / CENTAUR).
HOLDOUT_FRACTION = 0.2


def training_size(num_examples: int) -> int:
    """How many of a shard's ``num_examples`` a personalized client trains on (the 80 %).

    Client and server both use it: the server checks the count a reply claims.

    Raises
    ------
    ValueError
        If the shard has fewer than 2 examples.
    """
    n = int(num_examples)
    if n < 2:
        raise ValueError(f"personalization needs >= 2 local examples for a held-out split; found {n}")
    return n - min(n - 1, max(1, int(round(HOLDOUT_FRACTION * n))))
