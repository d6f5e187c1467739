"""The typed wire records (protocol/): encode/decode are inverse, every malformed value is named,
and the real ClientApp answers a malformed train config with a config error before spending."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord

from client import app as client_module
from client.ledger_store import STATE_KEY
from protocol import keys
from protocol.budget_query import BudgetQuery
from protocol.dpfedc import DPFedCRound
from protocol.errors import ERROR_CONFIG
from protocol.keys import DP_MODES
from protocol.train_config import TrainConfig
from tests.system.test_threat_model import _context, _global_arrays, _message


def _random_train_config(rng: np.random.Generator) -> TrainConfig:
    grouped = bool(rng.integers(2))
    return TrainConfig(
        num_rounds=int(rng.integers(1, 200)), dp_mode=str(rng.choice(list(DP_MODES))),
        local_epochs=int(rng.integers(1, 9)), batch_size=int(rng.integers(1, 512)),
        learning_rate=float(rng.uniform(1e-4, 1)), clip=float(rng.uniform(0.01, 10)),
        noise_multiplier=float(rng.choice([0.0, rng.uniform(0.1, 5)])), noise_shares=int(rng.integers(1, 50)),
        momentum=float(rng.uniform(0, 0.99)), target_epsilon=float(rng.choice([0.0, rng.uniform(0.1, 9)])),
        seed=int(rng.integers(-2**62, 2**62)), server_round=int(rng.integers(0, 100)),
        budget_reference=str(rng.choice(["", *keys.BUDGET_REFERENCES])),
        personalization=str(rng.choice(["", *keys.PERSONALIZATION_SCHEMES])), head_epochs=int(rng.integers(1, 4)),
        personal_lr_scale=float(rng.uniform(0, 3)), group_sample_rate=float(rng.uniform(0.001, 1)) if grouped else 0.0,
        group_index=int(rng.integers(1, 4)) if grouped else 0,
        upload_format=str(rng.choice([keys.UPLOAD_FULL, keys.UPLOAD_COORDINATES])),
    )


def test_a_train_config_survives_the_wire_unchanged():
    rng = np.random.default_rng(11)
    for _ in range(200):
        cfg = _random_train_config(rng)
        assert TrainConfig.decode(ConfigRecord(dict(cfg.encode()))) == cfg


@pytest.mark.parametrize(("key", "value", "message"), [
    (keys.DP_MODE, "sample", "'dp-mode' must be one of"),
    (keys.NUM_ROUNDS, 0, "'num-rounds' must be an integer >= 1"),
    (keys.BATCH_SIZE, 2.5, "'batch-size' must be an integer"),
    (keys.NOISE_SHARES, True, "'noise-shares' must be a number"),
    (keys.CLIP, math.inf, "'clip' must be a finite number > 0"),
    (keys.NOISE_MULTIPLIER, -1.0, "'noise-multiplier' must be a finite number >= 0"),
    (keys.LEARNING_RATE, "0.1", "'learning-rate' must be a number"),
    (keys.MOMENTUM, 1.0, "'momentum' must be in"),
    (keys.GROUP_SAMPLE_RATE, 1.5, f"'{keys.GROUP_SAMPLE_RATE}' must be in"),
    (keys.BUDGET_REFERENCE, "everyone", "'budget-reference' must be one of"),
    (keys.UPLOAD_FORMAT, "zip", "'upload-format' must be one of"),
    (keys.ACCOUNTANT, "gdp", "'accountant' must be one of"),
])
def test_each_malformed_value_is_refused_by_its_key(key, value, message):
    record = dict(TrainConfig(num_rounds=2, dp_mode="update", local_epochs=1, batch_size=8,
                              learning_rate=0.1).encode())
    with pytest.raises(ValueError, match=message):
        TrainConfig.decode({**record, key: value})


def test_a_missing_required_key_is_named():
    record = dict(TrainConfig(num_rounds=2, dp_mode="dpsgd", local_epochs=1, batch_size=8, learning_rate=0.1).encode())
    del record[keys.LEARNING_RATE]
    with pytest.raises(ValueError, match="no 'learning-rate'"):
        TrainConfig.decode(record)


def test_the_budget_query_and_the_clustering_section_round_trip():
    for query in (BudgetQuery(), BudgetQuery("rdp", "maximum"), BudgetQuery(task=keys.TASK_CLUSTERING)):
        assert BudgetQuery.decode(query.encode()) == query
    with pytest.raises(ValueError, match=f"'{keys.TASK}' must be one of"):
        BudgetQuery.decode({keys.TASK: "regression"})
    section = DPFedCRound(k=10, rho=1e-3, mu_h=1e-6, q1=10, q2=0, q_hat=7, calibration="paper",
                          epsilon_bar=20.0, grad_clip=1.5, client_rate=0.1, planned_rounds=30)
    assert DPFedCRound.decode(section.encode()) == section
    with pytest.raises(ValueError, match=f"'{keys.DPFEDC_CALIBRATION}' must be one of"):
        DPFedCRound.decode({**section.encode(), keys.DPFEDC_CALIBRATION: "loose"})


@pytest.mark.parametrize(("key", "value"), [(keys.NOISE_SHARES, 1.5), (keys.DP_MODE, "sample"),
                                            (keys.NUM_ROUNDS, -1), (keys.CLIP, float("nan"))])
def test_the_client_answers_a_malformed_train_config_with_a_config_error_before_spending(
        run_config_factory, key, value):
    cfg = run_config_factory(strategy="udp-fedavg", budget_distribution="constant", epsilon=5.0,
                             noise_multiplier=1.0, max_examples_per_client=32)
    msg = _message(cfg, _global_arrays(cfg))
    msg.content[keys.CONFIG][key] = value
    ctx = _context(cfg)
    reply = client_module.app(msg, ctx)
    assert reply.has_error() and reply.error.code == ERROR_CONFIG, reply
    assert f"'{key}'" in reply.error.reason
    assert STATE_KEY not in ctx.state  # no ledger written: nothing was spent
