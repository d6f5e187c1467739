"""PPSGD and CENTAUR: in-process runs, what leaves the client, personal state, evaluation."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict

from client.app import app as client_app
from client.personalization import (
    STATE_KEY_PREFIX,
    _train_additive,
    holdout_split,
    personalize_for_evaluation,
    training_size,
)
from client.training import LocalTrainingConfig, dpsgd_sample_rate, dpsgd_steps_per_round
from client.work import ModelWork, PersonalizedWork
from privacy.mechanisms import l2_norm
from privacy.randomness import SeededNoise
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys
from protocol.train_config import TrainConfig
from server.app import run_experiment
from server.config import RunConfig
from server.registry import build_strategy
from strategies.personalized import CENTAUR, PPSGD
from tasks.array_dataset import ArrayDataset
from tasks.models import build_model, get_weights, head_parameter_names, set_weights, train_plain, weight_names


def _capture_uploads(store):
    """A reply hook recording (request arrays, reply arrays) of every train message."""

    def hook(node, request, reply):
        if request.metadata.message_type == "train" and not reply.has_error():
            store.append((node, int(request.content[keys.CONFIG][keys.SERVER_ROUND]),
                          request.content[keys.ARRAYS].to_numpy_ndarrays(),
                          reply.content[keys.ARRAYS].to_numpy_ndarrays()))
        return reply

    return hook


def _run(cfg, hook=None):
    grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg, reply_hook=hook)
    summary = run_experiment(grid, cfg, run_id=1)
    rounds = [json.loads(line) for line in (Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()]
    return grid, summary, rounds


@pytest.mark.parametrize("dp_mode", ["auto", "dpsgd"])
@pytest.mark.parametrize(("strategy", "scheme"), [("ppsgd", "additive"), ("centaur", "head")])
def test_private_run_completes_within_budgets_and_reports_personal_accuracy(run_config_factory, strategy, scheme,
                                                                            dp_mode):
    """Budgets are calibrated by the clients (finite ε); in dpsgd mode the plan counts the
    80 % training split and CENTAUR's head pass, else the last round would be refused."""
    cfg = run_config_factory(strategy=strategy, dp_mode=dp_mode, model="mlp2", client_evaluation="on")
    uploads: list = []
    grid, summary, rounds = _run(cfg, _capture_uploads(uploads))
    assert summary["rounds_completed"] == 2
    assert summary["dp_mode"] == ("update" if dp_mode == "auto" else "dpsgd")
    for c in summary["clients"]:
        assert c["rounds_joined"] == [1, 2] and not c["rejections"]
        assert c["within_budget"] and 0 < c["epsilon_spent"] <= c["epsilon_budget"]
        # the ledger charged exactly the update mode's release, recomputed by the server
        assert c["epsilon_server_recomputed_this_run"] == pytest.approx(c["epsilon_spent"], rel=1e-6)
    # round 1 is evaluated on every client's held-out data; after the last round every
    # client has spent its budget (calibrated to the run) and answers no evaluation
    assert 0.0 <= rounds[1]["personalized_accuracy"] <= 1.0 and rounds[1]["personalized_clients"] == 3
    assert "personalized_accuracy" not in rounds[-1]
    assert all(c["exhausted"] for c in summary["clients"])
    assert summary["final_personalized_accuracy"] == rounds[1]["personalized_accuracy"]
    assert summary["best_personalized_accuracy"] == rounds[1]["personalized_accuracy"]
    # the personal part persists in every node's state, and is not an upload
    for ctx in grid.contexts.values():
        assert f"{STATE_KEY_PREFIX}.{scheme}" in ctx.state
    if strategy == "centaur":
        names = weight_names(build_model("mlp2", input_shape=(1, 28, 28), num_classes=10))
        head = [i for i, n in enumerate(names) if n in head_parameter_names(names)]
        assert head and len(uploads) == 6
        for _, _, sent, got in uploads:
            for i in head:  # nothing of the local head leaves the client
                np.testing.assert_array_equal(got[i], sent[i])
            assert not all(np.array_equal(g, s) for g, s in zip(got, sent, strict=True))  # the body moved
            for i in head:  # the server keeps the global head as it was
                np.testing.assert_array_equal(sent[i], uploads[0][2][i])
        assert {r for _, r, _, _ in uploads} == {1, 2}
        for ctx in grid.contexts.values():  # ... although the local heads did train
            local = ctx.state[f"{STATE_KEY_PREFIX}.head"].to_numpy_ndarrays()
            assert not np.array_equal(local[0], uploads[0][2][head[0]])


def test_non_private_ppsgd_personal_models_learn(run_config_factory):
    cfg = run_config_factory(strategy="ppsgd", dp_mode="none", budget_distribution="none", model="mlp2",
                             client_evaluation="on")
    _, summary, rounds = _run(cfg)
    assert rounds[-1]["personalized_accuracy"] > 0.5  # chance is 0.1
    assert all(c["guarantee"].startswith("none") for c in summary["clients"])


# ------------------------------------------------------------ the client functions
def _shard(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return ArrayDataset(rng.standard_normal((n, 1, 28, 28)).astype(np.float32),
                        rng.integers(0, 10, n).astype(np.int64), 10, "synthetic")


def _context():
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={"seed": 3})


def _config(scheme, **extra):
    """A decoded train config, as the client reads it (protocol.train_config)."""
    return TrainConfig.decode({keys.NUM_ROUNDS: 1, keys.LOCAL_EPOCHS: 2, keys.BATCH_SIZE: 16,
                               keys.LEARNING_RATE: 0.5, keys.PERSONALIZATION: scheme, keys.DP_MODE: keys.DP_UPDATE,
                               keys.NOISE_SHARES: 1, **extra})


LOCAL = LocalTrainingConfig(epochs=2, batch_size=16, learning_rate=0.5, momentum=0.0, seed=5)


def train_personalized(model, data, local, config, ctx, *, clip, noise_multiplier, partition_id, noise):
    """One personalized round as the client runs it: its mechanism over the personalized work.

    Returns the work's metrics and what the release charges; ``model`` ends holding the upload.
    """
    config = replace(config, clip=clip, noise_multiplier=noise_multiplier)
    mechanism = config.mechanism(num_examples=len(data), delta=1e-5)
    work = PersonalizedWork(ModelWork(model, data, local, "hooks"), config, ctx, partition_id)
    release = mechanism.release(noise_multiplier)
    upload = mechanism.run(work, release, noise)
    return upload.metrics, list(mechanism.settle(release, upload).charges)


def _model():
    torch.manual_seed(0)
    return build_model("mlp2", input_shape=(1, 28, 28), num_classes=10, seed=0)


@pytest.mark.parametrize("scheme", ["additive", "head"])
def test_upload_is_global_plus_clipped_shared_update(scheme):
    clip = 0.05  # small enough that clipping binds
    model, ctx, data = _model(), _context(), _shard()
    global_w = get_weights(model)
    metrics, steps = train_personalized(model, data, LOCAL, _config(scheme), ctx, clip=clip,
                                        noise_multiplier=0.0, partition_id=0, noise=SeededNoise(0))
    upload = get_weights(model)
    delta = [u - g for u, g in zip(upload, global_w, strict=True)]
    assert l2_norm(delta) <= clip * (1 + 1e-6)
    assert metrics[keys.CLIPPED] == 1.0 and metrics[keys.NUM_EXAMPLES] == 48  # 80% of 60
    assert steps == [(0.0, 1.0, 1)]  # one release, as in update mode (here σ = 0)
    personal = ctx.state[f"{STATE_KEY_PREFIX}.{scheme}"].to_numpy_ndarrays()
    assert l2_norm(personal) > 0
    if scheme == "additive":  # v_k moved, but the upload is not u + v_k
        assert len(personal) == len(upload)
    else:
        names = weight_names(model)
        for i, n in enumerate(names):
            if n in head_parameter_names(names):
                np.testing.assert_array_equal(upload[i], global_w[i])


def test_ledger_charge_is_the_per_upload_multiplier():
    model, ctx = _model(), _context()
    _, steps = train_personalized(model, _shard(), LOCAL, _config("additive", **{keys.NOISE_SHARES: 4}), ctx,
                                  clip=1.0, noise_multiplier=2.0, partition_id=0, noise=SeededNoise(0))
    assert steps == [(1.0, 1.0, 1)]  # σ/√m


def test_personal_state_carries_over_rounds_and_drives_evaluation():
    model, ctx, data = _model(), _context(), _shard()
    global_w = get_weights(model)
    train_personalized(model, data, LOCAL, _config("additive"), ctx, clip=10.0, noise_multiplier=0.0,
                       partition_id=0, noise=SeededNoise(0))
    v1 = ctx.state[f"{STATE_KEY_PREFIX}.additive"].to_numpy_ndarrays()
    # round 2 from the same global model: starts from v1, so it differs from a fresh client
    fresh_ctx = _context()
    for c in (ctx, fresh_ctx):
        m = _model()
        train_personalized(m, data, LOCAL, _config("additive"), c, clip=10.0, noise_multiplier=0.0,
                           partition_id=0, noise=SeededNoise(0))
    v2 = ctx.state[f"{STATE_KEY_PREFIX}.additive"].to_numpy_ndarrays()
    v_fresh = fresh_ctx.state[f"{STATE_KEY_PREFIX}.additive"].to_numpy_ndarrays()
    np.testing.assert_array_equal(v_fresh[0], v1[0])  # deterministic given the same start
    assert not np.array_equal(v2[0], v1[0])
    # evaluation: the personal model u + v_k on the 20% held out
    content = RecordDict({keys.CONFIG: _config("additive").encode()})
    evaluated, test = personalize_for_evaluation(content, ctx, _model(), data, 0)
    assert len(test) == 12
    for w, g, v in zip(get_weights(evaluated), global_w, v2, strict=True):
        np.testing.assert_allclose(w, g + v, rtol=1e-6, atol=1e-7)
    plain, same = personalize_for_evaluation(RecordDict({keys.CONFIG: ConfigRecord({})}), ctx, _model(), data, 0)
    assert same is data


def test_holdout_split_is_deterministic_and_disjoint():
    data = _shard(50)
    a_train, a_test = holdout_split(data, 1, 2)
    b_train, b_test = holdout_split(data, 1, 2)
    np.testing.assert_array_equal(a_test.x, b_test.x)
    assert len(a_test) == 10 and len(a_train) == 40
    with pytest.raises(ValueError, match=">= 2"):
        holdout_split(_shard(1), 1, 2)


def test_the_head_rule_and_bad_values():
    with pytest.raises(ValueError, match="head_epochs"):
        CENTAUR(head_epochs=0)
    with pytest.raises(ValueError, match="personal_lr_scale"):
        PPSGD(personal_lr_scale=-1.0)
    assert head_parameter_names(["conv1.weight", "fc3.weight", "fc3.bias"]) == ["fc3.weight", "fc3.bias"]
    assert head_parameter_names(["fc1.weight", "fc2.weight"]) == ["fc2.weight"]
    with pytest.raises(ValueError, match="'dp-mode' must be one of"):  # refused when the client decodes it
        _config("head", **{keys.DP_MODE: "sample"})
    with pytest.raises(ValueError, match="'head-epochs' must be an integer >= 1"):
        _config("head", **{keys.HEAD_EPOCHS: 0})


# -------------------------------------------------------------- dp-mode = "dpsgd"
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_ppsgd_joint_steps_equal_one_model_at_the_summed_rate(momentum):
    """The identity the dpsgd path rests on: SGD on (u at η, v at αη) of ℓ(u + v) moves
    u + v exactly as SGD on w at (1+α)η, and splits the move 1 : α."""
    alpha, cfg, data = 0.7, replace(LOCAL, momentum=momentum), _shard()
    model = _model()
    u0 = dict(zip(weight_names(model), get_weights(model), strict=True))
    rng = np.random.default_rng(1)
    v0 = {n: 0.01 * rng.standard_normal(a.shape).astype(a.dtype) for n, a in u0.items()}
    u, v, _ = _train_additive(model, data, cfg, v0, alpha)  # two parameter groups
    w_model = _model()
    set_weights(w_model, [u0[n] + v0[n] for n in u0])
    train_plain(w_model, data, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=(1 + alpha) * cfg.learning_rate,
                momentum=cfg.momentum, seed=cfg.seed)
    for n, w in zip(u0, get_weights(w_model), strict=True):
        moved = w - u0[n] - v0[n]
        np.testing.assert_allclose(u[n], u0[n] + moved / (1 + alpha), atol=2e-5)
        np.testing.assert_allclose(v[n], v0[n] + alpha * moved / (1 + alpha), atol=2e-5)


@pytest.mark.parametrize("scheme", ["additive", "head"])
def test_dpsgd_round_charges_the_dpsgd_steps_and_keeps_the_head_local(scheme):
    model, ctx, data = _model(), _context(), _shard()
    global_w = get_weights(model)
    config = _config(scheme, **{keys.DP_MODE: keys.DP_SGD, keys.LOCAL_EPOCHS: LOCAL.epochs, keys.HEAD_EPOCHS: 1})
    metrics, steps = train_personalized(model, data, LOCAL, config, ctx, clip=1.0, noise_multiplier=1.3,
                                        partition_id=0, noise=SeededNoise(0))
    n_train, passes = config.dpsgd_workload(len(data))
    assert n_train == training_size(len(data)) == 48
    assert passes == LOCAL.epochs + (1 if scheme == "head" else 0)
    assert _config("", **{keys.LOCAL_EPOCHS: 3}).dpsgd_workload(60) == (60, 3)  # no personalization
    # every step is Opacus DP-SGD at σ on the 80 % split: q = 1/⌈n/B⌉, ⌈n/B⌉ steps a pass
    assert {(s, q) for s, q, _ in steps} == {(1.3, dpsgd_sample_rate(n_train, LOCAL.batch_size))}
    assert sum(c for _, _, c in steps) == dpsgd_steps_per_round(n_train, LOCAL.batch_size, passes)
    assert metrics[keys.NUM_EXAMPLES] == n_train
    upload = get_weights(model)
    names = weight_names(model)
    head = head_parameter_names(names) if scheme == "head" else []
    for n, sent, got in zip(names, global_w, upload, strict=True):
        if n in head:
            np.testing.assert_array_equal(got, sent)  # nothing of the local head leaves
    assert any(not np.array_equal(g, s) for n, s, g in zip(names, global_w, upload, strict=True) if n not in head)
    personal = ctx.state[f"{STATE_KEY_PREFIX}.{scheme}"].to_numpy_ndarrays()
    assert l2_norm(personal) > 0


def test_registry_builds_both_with_update_mode(run_config_factory):
    for name, cls in (("ppsgd", PPSGD), ("centaur", CENTAUR)):
        cfg = RunConfig.from_flower(run_config_factory(strategy=name, dp_mode="auto"))
        assert cfg.resolved_dp_mode == "update"
        strategy = build_strategy(cfg)
        assert isinstance(strategy, cls) and strategy.fraction_evaluate == 1.0
        assert math.isfinite(strategy.personal_config().get(keys.PERSONAL_LR_SCALE, 1.0))
