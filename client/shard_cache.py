"""A node-local disk cache of the client's training shard.

In a deployment every ClientApp message runs in a fresh process, so without a cache each
message parses the whole dataset (Fashion-MNIST: ~1-2 s on an idle core) and imports
``flwr_datasets`` to partition it (several seconds more), only to keep one shard. The
first message of a node writes its shard to ``<cache dir>/<key>.npz``; later messages load
that file (tens of milliseconds). A process that already holds the dataset in memory (a
simulation worker, the in-process grid) skips the disk altogether.

The key is a SHA-256 of everything the shard depends on: the dataset name and folder,
a fingerprint of the folder's files (name, size, mtime), the partitioning keys of the run
config, and the partition id and count. A change to any of them is a different file, so a
stale shard is never read. Writes are atomic (:func:`privacy.private_file.write_private_file`); a file
that cannot be read is ignored and rewritten. Arrays are stored without pickling.

The cache holds raw training data: it stays on the node, in a folder only the node's user
can read (mode 0700), like the data it was read from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from privacy.private_file import write_private_file
from tasks.array_dataset import ArrayDataset

log = logging.getLogger(__name__)

__all__ = ["ENV_CACHE_DIR", "OFF", "cached_shard", "default_cache_dir", "shard_key"]

#: ``shard-cache`` node-config value that turns the cache off.
OFF = "off"
_FORMAT = 1  # bump when the file layout changes


#: Environment variable that overrides the default cache folder.
ENV_CACHE_DIR = "PRIVET_SHARD_CACHE"


def default_cache_dir() -> Path:
    """``$PRIVET_SHARD_CACHE``, else ``<system temp dir>/privet-shards-<uid>``: node-local,
    per user.
    """
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"privet-shards-{uid}"


def _fingerprint(dataset: str, folder: str | None) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of the files under ``folder`` (empty if none).

    Not for ``hf:`` datasets: their folder is a Hugging Face cache root (possibly many
    datasets and thousands of files, walked on every message otherwise), and the name
    identifies the dataset.
    """
    if dataset.startswith("hf:") or not folder or not Path(folder).is_dir():
        return []
    root = Path(folder)
    return sorted(
        (str(p.relative_to(root)), st.st_size, st.st_mtime_ns)
        for p in root.rglob("*") if p.is_file() and (st := p.stat())
    )


def shard_key(dataset: str, data_dir: str | None, partitioning: Mapping[str, Any], partition_id: int,
              num_partitions: int) -> str:
    """The hex SHA-256 naming one shard's cache file (see the module docstring)."""
    identity = {
        "format": _FORMAT,
        "dataset": dataset,
        "data-dir": str(Path(data_dir).expanduser().resolve()) if data_dir else "",
        "files": _fingerprint(dataset, data_dir),
        "partitioning": {k: partitioning[k] for k in sorted(partitioning)},
        "partition": [int(partition_id), int(num_partitions)],
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def _read(path: Path) -> tuple[ArrayDataset, int] | None:
    try:
        with np.load(path, allow_pickle=False) as f:
            data = ArrayDataset(f["x"], f["y"], int(f["num_classes"]), str(f["name"]))
            return data, int(f["dataset_classes"])
    except FileNotFoundError:
        return None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        log.warning("shard cache %s is unreadable (%s); rebuilding it", path, exc)
        return None


def _write(path: Path, data: ArrayDataset, dataset_classes: int) -> None:
    write_private_file(path, lambda fh: np.savez(fh, x=data.x, y=data.y, num_classes=data.num_classes,
                                                 name=data.name, dataset_classes=dataset_classes),
                       folder_mode=0o700)


def cached_shard(
    cache_dir: str | Path | None,
    key: str,
    build: Callable[[], tuple[ArrayDataset, int]],
) -> tuple[ArrayDataset, int]:
    """``build()``'s (shard, dataset class count), from ``<cache_dir>/<key>.npz`` if there.

    ``cache_dir`` None means :func:`default_cache_dir`; ``"off"`` calls ``build()`` every
    time. A cache that cannot be written (read-only disk, full disk) is logged and
    skipped: the shard is still returned.
    """
    if str(cache_dir) == OFF:
        return build()
    path = Path(cache_dir or default_cache_dir()) / f"{key}.npz"
    hit = _read(path)
    if hit is not None:
        return hit
    data, classes = build()
    try:
        _write(path, data, classes)
    except OSError as exc:
        log.warning("cannot write the shard cache %s (%s); continuing without it", path, exc)
    return data, classes
