"""strategies.catalogue: one entry per strategy, read by validation, construction and help."""

from __future__ import annotations

import pytest

from privet.cli import build_parser
from protocol.keys import DP_MODES
from server.config import ConfigError, RunConfig
from server.registry import build_strategy
from strategies.base import PrivacyAwareFedAvg
from strategies.catalogue import CATALOGUE, SUM_ONLY_STRATEGIES


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_entry_builds_its_class_with_its_default_dp_mode(name):
    entry = CATALOGUE[name]
    assert issubclass(entry.cls, PrivacyAwareFedAvg) and entry.dp_mode in DP_MODES
    overrides = {"strategy": name}
    if entry.section == "gdpfed":
        overrides.update({"budget-distribution": "groups", "num-clients": 300,
                          "gdpfed.idp-sample-rates": [0.01, 0.02, 0.03]})
    if name == "fedavg":
        overrides["budget-distribution"] = "none"
    cfg = RunConfig.from_flower(overrides)
    assert cfg.resolved_dp_mode == entry.dp_mode
    if entry.params is not None:  # DP-FedC's parameters read its data set (tests/test_dpfedc.py builds it)
        return
    strategy = build_strategy(cfg)
    assert type(strategy) is entry.cls and strategy.dp_mode == entry.dp_mode
    if entry.section is not None:
        assert strategy.params == getattr(cfg, entry.section)


def test_secure_aggregation_is_offered_exactly_for_the_sum_only_strategies():
    for name, entry in CATALOGUE.items():
        overrides = {"strategy": name, "secure-aggregation": "secagg+", "dp-mode": "update", "noise-multiplier": 1.0}
        if entry.section == "gdpfed":
            overrides.update({"budget-distribution": "groups", "num-clients": 300, "noise-multiplier": 0.0,
                              "gdpfed.idp-sample-rates": [0.01, 0.02, 0.03]})
        if name in SUM_ONLY_STRATEGIES:
            RunConfig.from_flower(overrides)
        else:
            with pytest.raises(ConfigError, match="secure-aggregation"):
                RunConfig.from_flower(overrides)


def test_an_unknown_strategy_fails_at_start_naming_the_key_and_every_choice():
    with pytest.raises(ConfigError, match="strategy") as err:
        RunConfig.from_flower({"strategy": "fedprox"})
    assert all(name in str(err.value) for name in CATALOGUE)


def test_the_cli_help_lists_every_strategy():
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    assert all(f"  {name} " in run.description for name in CATALOGUE)
