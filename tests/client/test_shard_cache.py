"""The node-local shard cache: hits skip the dataset, keys change with what the shard depends on."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import client.model_task as model_task
from client.profile import resolve_profile
from client.shard_cache import OFF, cached_shard, shard_key
from protocol.run_settings import RunSettings
from tasks import datasets
from tasks.array_dataset import ArrayDataset
from tasks.datasets import load_dataset
from tasks.partition import client_data


def _shard(seed=0, n=20):
    rng = np.random.default_rng(seed)
    return ArrayDataset(rng.standard_normal((n, 1, 4, 4)).astype(np.float32),
                        rng.integers(0, 10, n).astype(np.int64), 10, "synthetic")


class _Builder:
    def __init__(self, data):
        self.data, self.calls = data, 0

    def __call__(self):
        self.calls += 1
        return self.data, 10


def test_second_call_reads_the_file_and_never_builds(tmp_path):
    build = _Builder(_shard())
    first = cached_shard(tmp_path, "k", build)
    second = cached_shard(tmp_path, "k", build)
    assert build.calls == 1 and (tmp_path / "k.npz").is_file()
    for data, classes in (first, second):
        np.testing.assert_array_equal(data.x, build.data.x)
        np.testing.assert_array_equal(data.y, build.data.y)
        assert (data.num_classes, data.name, classes) == (10, "synthetic", 10)


def test_off_never_touches_the_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build = _Builder(_shard())
    cached_shard(OFF, "k", build)
    cached_shard(OFF, "k", build)
    assert build.calls == 2 and not list(tmp_path.iterdir())


def test_a_corrupt_file_is_rebuilt_and_an_unwritable_cache_is_skipped(tmp_path, caplog):
    (tmp_path / "k.npz").write_bytes(b"not a zip")
    build = _Builder(_shard())
    with caplog.at_level(logging.WARNING):
        data, _ = cached_shard(tmp_path, "k", build)
    assert build.calls == 1 and "unreadable" in caplog.text
    np.testing.assert_array_equal(cached_shard(tmp_path, "k", build)[0].x, data.x)
    assert build.calls == 1  # the rebuilt file is good
    blocker = tmp_path / "a-file"  # a cache "folder" that is a file: mkdir fails, even as root
    blocker.write_text("")
    data, _ = cached_shard(blocker, "k", build)
    assert build.calls == 2 and "cannot write" in caplog.text
    np.testing.assert_array_equal(data.x, build.data.x)


def test_the_key_changes_with_everything_the_shard_depends_on(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.gz").write_bytes(b"abc")
    part = {"method": "iid", "seed": 1}
    base = shard_key("mnist", str(folder), part, 0, 10)
    assert base == shard_key("mnist", str(folder), dict(part), 0, 10)
    variants = {
        shard_key("fashion-mnist", str(folder), part, 0, 10),
        shard_key("mnist", str(folder), {**part, "seed": 2}, 0, 10),
        shard_key("mnist", str(folder), part, 1, 10),
        shard_key("mnist", str(folder), part, 0, 11),
        shard_key("mnist", None, part, 0, 10),
    }
    (folder / "train.gz").write_bytes(b"abcd")  # the data changed on disk
    variants.add(shard_key("mnist", str(folder), part, 0, 10))
    assert base not in variants and len(variants) == 6


def test_client_loads_the_same_shard_from_the_cache_as_from_the_dataset(tmp_path, monkeypatch):
    """A fresh process (nothing in memory) writes the shard; the next one reads it
    without opening the dataset; both equal the shard computed directly."""
    run_config = {"dataset": "fashion-mnist", "data-dir": "", "partitioner": "iid", "dirichlet-alpha": 0.5,
                  "shards-per-client": 2, "seed": 4, "max-examples-per-client": 128}
    profile = resolve_profile({"partition-id": 3, "num-partitions": 8, "epsilon": 1.0,
                               "shard-cache": str(tmp_path)}, run_config)
    direct = client_data(load_dataset("fashion-mnist"), 3, 8, method="iid", alpha=0.5, shards_per_client=2,
                         seed=4, max_examples=128)
    datasets.clear_cache()  # as in a new ClientApp process
    written, classes = model_task.load_local_data(profile, RunSettings.of(run_config))
    assert len(list(tmp_path.glob("*.npz"))) == 1
    datasets.clear_cache()

    def no_dataset(*_a, **_k):
        raise AssertionError("the dataset must not be opened on a cache hit")

    monkeypatch.setattr(model_task, "load_dataset", no_dataset)
    read, classes_again = model_task.load_local_data(profile, RunSettings.of(run_config))
    assert classes == classes_again == 10
    for got in (written, read):
        np.testing.assert_array_equal(got.x, direct.x)
        np.testing.assert_array_equal(got.y, direct.y)


def test_a_process_holding_the_dataset_skips_the_disk(tmp_path):
    run_config = {"dataset": "fashion-mnist", "data-dir": "", "partitioner": "iid", "dirichlet-alpha": 0.5,
                  "shards-per-client": 2, "seed": 4, "max-examples-per-client": 64}
    profile = resolve_profile({"partition-id": 0, "num-partitions": 8, "epsilon": 1.0,
                               "shard-cache": str(tmp_path)}, run_config)
    load_dataset("fashion-mnist")
    data, _ = model_task.load_local_data(profile, RunSettings.of(run_config))
    assert len(data) == 64 and not list(tmp_path.iterdir())


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    yield
    datasets.clear_cache()
