"""Shared fixtures: small run configs built from the app's real defaults."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


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
