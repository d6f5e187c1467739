"""A site's own floors (protocol.site): refused before any data is touched, with the floor named."""

from __future__ import annotations

import pytest

from client.app import app as client_app
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys
from protocol.site import SiteFloors
from server.app import run_experiment


def _run(cfg):
    grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg)
    try:
        return run_experiment(grid, cfg, run_id=1)
    except RuntimeError:
        import json
        from pathlib import Path

        return json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())


def test_a_site_makes_no_more_releases_per_run_than_its_floor(run_config_factory):
    summary = _run(run_config_factory(num_server_rounds=3, **{"site.max-releases-per-run": 2}))
    for client in summary["clients"]:
        assert client["rounds_joined"] == [1, 2]
        (refusal,) = client["rejections"]
        assert refusal["round"] == 3 and refusal["reason"].startswith(keys.SITE_FLOOR)
        assert "max-releases-per-run" in refusal["reason"]


def test_too_little_noise_or_too_much_epsilon_in_one_release_is_refused_uncharged(run_config_factory):
    # sigma 0.6 per upload is below the floor: nothing trained, nothing charged
    summary = _run(run_config_factory(strategy="udp-fedavg", noise_multiplier=0.6, num_server_rounds=1,
                                      **{"site.min-noise-multiplier": 1.0}))
    assert all(c["epsilon_spent"] == 0 and "min-noise-multiplier" in c["rejections"][0]["reason"]
               for c in summary["clients"])
    # a DP-SGD run calibrated to spend every budget in one round: each release above a cap of eps = 0.5
    summary = _run(run_config_factory(num_server_rounds=1, **{"site.max-epsilon-per-release": 0.5}))
    assert all(c["epsilon_spent"] == 0 and "max-epsilon-per-release" in c["rejections"][0]["reason"]
               for c in summary["clients"])


@pytest.mark.parametrize(("key", "value"), [("min-sum-size", 0), ("max-epsilon-per-release", "abc"),
                                            ("max-releases-per-run", -1)])
def test_a_bad_floor_in_a_node_config_is_one_line_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"node-config '{key}'"):
        SiteFloors.from_node_config({key: value})


def test_the_default_floor_protects_a_sum_of_one():
    assert SiteFloors().min_sum_size == 2 and SiteFloors.from_node_config({}).refusal(
        charged_sigma=0.1, release_epsilon=100.0, releases_in_run=10_000) is None


@pytest.mark.parametrize("extra", [{}, {"partitioner": "dirichlet"}, {"partitioner": "shards"},
                                   {"max-examples-per-client": 50}, {"evaluation-split": "validation"}])
def test_the_handshake_counts_the_shard_it_would_train_on_without_building_it(extra):
    """The handshake's count (from the partition's indices) equals the length of the shard itself."""
    from client.model_task import count_local_examples, load_local_data
    from client.profile import resolve_profile
    from protocol.run_settings import RunSettings

    run = {"seed": 3, **extra}
    for pid in (0, 7):
        profile = resolve_profile({"partition-id": pid, "num-partitions": 10}, run)
        settings = RunSettings.of(run)
        assert count_local_examples(profile, settings) == len(load_local_data(profile, settings)[0])
