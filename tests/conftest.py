"""Shared fixtures: small run configs built from the app's real defaults."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs several workers on this machine's few cores: one torch/BLAS thread each
    # (two spinning OpenMP threads per worker would only steal each other's cores).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

#: The cost tiers (pyproject's markers): ``slow`` is set on the test, ``system`` where a test runs
#: whole experiments (in tests/system/, or through ``run_config_factory``) or says so; the rest is
#: ``unit``. Run one tier with ``-m unit``, ``-m system``, ``-m slow``; ``-m "not slow"`` is the fast tier.
TIERS = ("slow", "system", "unit")


def _tier(item: pytest.Item) -> str:
    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return tier
    if "tests/system/" in item.path.as_posix() or "run_config_factory" in getattr(item, "fixturenames", ()):
        return "system"
    return "unit"


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n`` (pytest-xdist), hand each worker one test at a time, in the order below.

    xdist's ``load`` scheduler otherwise sends each worker a consecutive chunk of about a quarter
    of its share first, so every slow test (sorted first) lands on the first worker and they run
    one after another while the other worker does the rest. One at a time, both workers take
    slow tests until none is left. An explicit ``--maxschedchunk`` wins.
    """
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "maxschedchunk", 1) is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier, and start the costly ones first.

    Slow tests first, then system, then unit (stable within a tier): with ``-n`` (pytest-xdist)
    the minutes-long deployments start at once and the short tests fill the workers around them,
    instead of one long test starting last and running alone.
    """
    for item in items:
        tier = _tier(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)
        item.stash[_TIER] = TIERS.index(tier)
    items.sort(key=lambda item: item.stash[_TIER])


_TIER = pytest.StashKey[int]()


@pytest.fixture(autouse=True, scope="session")
def _shard_cache_in_a_temp_dir(tmp_path_factory):
    """Client shard caches written by the tests (and the processes they start) go to a
    pytest temp folder, not the system's."""
    os.environ["PRIVET_SHARD_CACHE"] = str(tmp_path_factory.mktemp("shard-cache"))


def small_run_config(tmp_path, **overrides: Any) -> dict[str, Any]:
    """The pyproject defaults, shrunk to a few-second run, with ``overrides`` applied
    (underscores in names become dashes)."""
    from privet.cli import app_defaults

    cfg = app_defaults()
    cfg.update({
        "num-clients": 3,
        "num-server-rounds": 2,
        "max-examples-per-client": 256,
        "model": "logreg",
        "batch-size": 32,
        "learning-rate": 0.1,
        "momentum": 0.0,
        "out-dir": str(tmp_path / "results"),
        "min-train-clients": 1,
    })
    cfg.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return cfg


@pytest.fixture
def run_config_factory(tmp_path):
    return lambda **kw: small_run_config(tmp_path, **kw)
