"""Bad configuration fails at the edge, with a message naming the key and what is allowed."""

from __future__ import annotations

import pytest

from privet.cli import CliError, app_defaults, load_experiment, main, parse_assignment
from server.config import STRATEGIES, ConfigError, RunConfig


def test_the_embedded_default_is_valid_and_heterogeneous():
    cfg = RunConfig.from_flower(app_defaults())
    assert cfg.strategy in STRATEGIES
    assert cfg.dataset == "fashion-mnist" and cfg.num_clients >= 10
    assert cfg.resolved_dp_mode == "dpsgd" and cfg.budget_distribution != "constant"


@pytest.mark.parametrize(
    ("key", "value", "must_mention"),
    [
        ("strategy", "fedsgd", ["'strategy'", "fedavg-hdp", "udp-fedavg"]),
        ("partitioner", "zipf", ["'partitioner'", "dirichlet", "shards"]),
        ("model", "resnet", ["'model'", "lenet5"]),
        ("dp-mode", "central", ["'dp-mode'", "dpsgd", "update"]),
        ("accountant", "gdp", ["'accountant'", "rdp", "prv"]),
        ("budget-distribution", "zipf", ["'budget-distribution'", "mixgauss1"]),
        ("budget-components", "fixed", ["'budget-components'", "drawn", "exact"]),
        ("evaluation-split", "train", ["'evaluation-split'", "test", "validation"]),
        ("calibration", "closed-form", ["'calibration'", "accountant", "pfa-closed-form"]),
        ("local-steps", -1, ["'local-steps'", "greater than or equal to 0"]),
        ("checkpoint-rounds", "ten", ["'checkpoint-rounds'"]),
        ("checkpoint-rounds", "1.5", ["'checkpoint-rounds'", "round numbers"]),
        ("dataset", "imagenet", ["'dataset'", "fashion-mnist", "hf:"]),
        ("num-server-rounds", 0, ["'num-server-rounds'", "greater than or equal to 1"]),
        ("fraction-train", 1.5, ["'fraction-train'", "less than or equal to 1"]),
        ("delta", 1.0, ["'delta'", "less than 1"]),
        ("clip", -1.0, ["'clip'", "greater than 0"]),
        ("epsilon-min", 20.0, ["'epsilon-min'", "'epsilon-max'"]),
    ],
)
def test_invalid_values_name_the_key_and_the_allowed_values(key, value, must_mention):
    raw = {**app_defaults(), key: value}
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower(raw)
    for text in must_mention:
        assert text in str(err.value)


def test_unknown_key_is_rejected_with_the_allowed_keys():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**app_defaults(), "num-rounds": 3})
    assert "'num-rounds'" in str(err.value) and "num-server-rounds" in str(err.value)


def test_non_private_mode_needs_clients_without_a_budget():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**app_defaults(), "dp-mode": "none", "budget-distribution": "uniform"})
    assert "budget-distribution" in str(err.value)


def test_cli_overrides_are_typed_and_checked(tmp_path):
    assert parse_assignment("learning-rate=0.1") == ("learning-rate", 0.1)
    assert parse_assignment("strategy=fedavg") == ("strategy", "fedavg")
    with pytest.raises(CliError, match="unknown config key"):
        load_experiment(None, ["nonsense=1"], None)
    with pytest.raises(CliError, match="'num-server-rounds' must be an integer"):
        load_experiment(None, ["num-server-rounds=two"], None)
    exp = tmp_path / "exp.toml"
    exp.write_text('strategy = "minimum"\nnum-server-rounds = 7\n')
    merged = load_experiment(str(exp), ["num-server-rounds=9"], str(tmp_path / "out"))
    assert merged["strategy"] == "minimum" and merged["num-server-rounds"] == 9
    assert merged["out-dir"] == str((tmp_path / "out").resolve())


def test_cli_reports_errors_without_a_traceback(capsys, tmp_path):
    assert main(["run", "--set", "partitioner=zipf"]) == 2
    assert "'partitioner'" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "not a privet results directory" in capsys.readouterr().err


def test_a_misspelt_key_gets_a_did_you_mean_in_one_line():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**app_defaults(), "pfa.kk": 1})
    assert str(err.value) == "invalid run config: 'pfa.kk': unknown key; did you mean 'pfa.k'?"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**app_defaults(), "num-server-round": 3})
    assert "did you mean 'num-server-rounds'?" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_key_without_a_close_one_lists_its_sections_keys_or_points_to_the_help():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**app_defaults(), "pfa.zzzzzz": 1})
    assert "pfa.k," in str(err.value) and "num-server-rounds" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**app_defaults(), "zzzzzz": 1})
    assert "privet run --help" in str(err.value) and "num-server-rounds" not in str(err.value)


@pytest.mark.parametrize("strategy", ["ppsgd", "centaur"])
def test_local_steps_is_refused_where_clients_train_in_whole_passes(strategy):
    with pytest.raises(ConfigError, match="'local-steps' must be 0 for '" + strategy):
        RunConfig.from_flower({**app_defaults(), "strategy": strategy, "local-steps": 100,
                               "budget-distribution": "constant"})
    assert RunConfig.from_flower({**app_defaults(), "strategy": "pfa", "local-steps": 100}).local_steps == 100


@pytest.mark.parametrize(("overrides", "must_mention"), [
    ({"strategy": "dpfedc", "local-steps": 5, "budget-distribution": "constant", "dp-mode": "update"},
     "'local-steps' must be 0 for 'dpfedc'"),
    ({"strategy": "pfa", "calibration": "pfa-closed-form", "noise-multiplier": 1.0}, "'calibration'"),
    ({"strategy": "udp-fedavg", "calibration": "pfa-closed-form"}, "needs 'dp-mode' = 'dpsgd'"),
    ({"checkpoint-rounds": "2, 9", "num-server-rounds": 3}, "'checkpoint-rounds' [9]"),
])
def test_knobs_that_would_do_nothing_are_refused_naming_the_key(overrides, must_mention):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_flower({**app_defaults(), **overrides})
    assert must_mention in str(err.value)
