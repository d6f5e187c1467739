"""DP-SGD as accounted: every planned step is taken and charged, empty Poisson batches too.

The ledger charges ``epochs × ⌈n/B⌉`` steps at q = 1/⌈n/B⌉; these tests check that the
training loop does exactly that in every per-sample-gradient mode, that its batches are
Poisson with rate q, and the smaller accounting fixes (CENTAUR's step count, calibration
that uses small budgets fully, ledgers kept across simulated runs).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from client.training import LocalTrainingConfig, poisson_batches, train_dpsgd
from client.work import ModelWork, PersonalizedWork
from privacy.accountants import epsilon_of
from privacy.calibration import noise_multiplier_for
from privacy.mechanisms import DPSGD
from privacy.randomness import OSEntropyNoise
from protocol import keys
from protocol.train_config import TrainConfig
from tasks.array_dataset import ArrayDataset
from tasks.models import build_model, get_weights


class NeverSampled(OSEntropyNoise):
    """A source whose coin flips never pick an example: every Poisson batch is empty."""

    def uniform(self, size: int) -> np.ndarray:
        return np.ones(size)


def _data(n: int = 16) -> ArrayDataset:
    rng = np.random.default_rng(0)
    return ArrayDataset(rng.standard_normal((n, 1, 28, 28)).astype(np.float32),
                        rng.integers(0, 10, n).astype(np.int64), 10, "synthetic")


@pytest.mark.parametrize("mode", ["ghost", "hooks", "functorch", "linear", "bk"])
def test_empty_batches_are_noise_only_steps_and_are_charged(mode):
    torch.manual_seed(0)
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    before = [w.copy() for w in get_weights(model)]
    cfg = LocalTrainingConfig(epochs=2, batch_size=4, learning_rate=0.1, momentum=0.0, seed=1)
    metrics, steps = train_dpsgd(model, _data(16), cfg, clip=1.0, noise_multiplier=1.0, noise=NeverSampled(),
                                 grad_sample_mode=mode)
    assert steps == [(1.0, 0.25, 8)] and metrics["local-steps"] == 8.0  # 2 epochs × ⌈16/4⌉
    moved = sum(float(np.abs(a - b).sum()) for a, b in zip(get_weights(model), before, strict=True))
    assert moved > 0  # no example was used, yet every step released (and applied) noise


class AlwaysSampled(OSEntropyNoise):
    """A source whose coin flips pick every example: every Poisson batch is the whole dataset."""

    def uniform(self, size: int) -> np.ndarray:
        return np.zeros(size)


@pytest.mark.parametrize("mode", ["ghost", "hooks", "functorch", "linear", "bk"])
@pytest.mark.parametrize("n, batch", [(196, 4), (392, 4), (16, 4), (30, 4)])
def test_the_noisy_sum_is_divided_by_the_expected_batch_n_q(mode, n, batch):
    """One step without noise or clipping on a batch holding all n examples moves the weights by
    lr · Σᵢ gᵢ / ⌊n·q⌋ at q = 1/⌈n/B⌉; for n = 196, B = 4 that is 4 (float rounding made
    ``int(196 · (1/49))`` 3 and the step 4/3 too large)."""
    data = _data(n)
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    reference = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(data.x)), torch.from_numpy(data.y),
                                             reduction="sum")
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    expected = n // -(-n // batch)  # ⌊n / ⌈n/B⌉⌋
    before = [w.copy() for w in get_weights(model)]
    cfg = LocalTrainingConfig(epochs=1, batch_size=batch, learning_rate=1.0, momentum=0.0, seed=1, steps=1)
    train_dpsgd(model, data, cfg, clip=1e9, noise_multiplier=0.0, noise=AlwaysSampled(), grad_sample_mode=mode)
    for w0, w1, g in zip(before, get_weights(model), grads, strict=True):
        np.testing.assert_allclose(w0 - w1, g.numpy() / expected, rtol=1e-4, atol=1e-6)


def test_poisson_batches_include_each_example_with_rate_q():
    n, q, steps = 2_000, 0.05, 400
    sizes = np.array([len(b) for b in poisson_batches(n, q, steps, OSEntropyNoise())])
    assert len(sizes) == steps
    assert abs(sizes.mean() - q * n) < 4 * np.sqrt(q * (1 - q) * n / steps)  # 4 standard errors


def test_centaur_with_a_one_layer_model_counts_its_steps_once():
    """logreg is all head: CENTAUR trains only the head, and charges and reports those steps once."""
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    config = TrainConfig(num_rounds=1, dp_mode=keys.DP_SGD, local_epochs=1, batch_size=8, learning_rate=0.1,
                         personalization="head", head_epochs=1)
    data = _data(40)
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={"seed": 3})
    cfg = LocalTrainingConfig(epochs=1, batch_size=8, learning_rate=0.1, momentum=0.0, seed=1)
    mechanism = replace(config, noise_multiplier=1.0).mechanism(num_examples=len(data), delta=1e-5)
    release = mechanism.release(1.0)
    upload = mechanism.run(PersonalizedWork(ModelWork(model, data, cfg, "hooks"), config, ctx, 0), release,
                           OSEntropyNoise())
    metrics, steps = upload.metrics, mechanism.settle(release, upload).charges
    charged = sum(n for _, _, n in steps)
    n_train, _ = config.dpsgd_workload(len(data))
    assert charged == metrics[keys.LOCAL_STEPS] == -(-n_train // 8)  # the head pass only, once


@pytest.mark.parametrize("target", [0.1, 1.0, 8.0])
def test_calibration_uses_a_small_budget_as_fully_as_a_large_one(target):
    sigma = noise_multiplier_for(target, 1e-5, 0.02, 200, accountant="prv")
    spent = epsilon_of([(sigma, 0.02, 200)], 1e-5, "prv")
    assert target * (1 - 2e-3) <= spent <= target


def test_simulated_ledgers_carry_over_runs_with_ledger_dir(run_config_factory, tmp_path):
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    def run(run_id):
        cfg = run_config_factory(num_server_rounds=1, run_epsilon=1.0, ledger_dir=str(tmp_path / "ledgers"),
                                 out_dir=str(tmp_path / f"r{run_id}"))
        grid = InProcessGrid(client_app, simulation_node_configs(3), cfg, run_id=run_id)
        return run_experiment(grid, cfg, run_id=run_id)

    first = run(1)
    second = run(2)
    assert sorted(p.name for p in (tmp_path / "ledgers").glob("*.json")) == [f"client-{i}.json" for i in range(3)]
    for a, b in zip(first["clients"], second["clients"], strict=True):
        assert b["epsilon_spent_before_run"] == pytest.approx(a["epsilon_spent"]) and a["epsilon_spent"] > 0
        assert b["epsilon_spent"] > a["epsilon_spent"]


def test_a_deployed_node_without_a_ledger_path_is_warned(run_config_factory, caplog):
    from client.ledger_store import load_ledger
    from client.profile import resolve_profile

    profile = resolve_profile({"partition-id": 0, "num-partitions": 2, "epsilon": 2.0}, run_config_factory())
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with caplog.at_level(logging.WARNING, logger="privet.client"):
        load_ledger(profile, context, "prv")
    assert "starts again at zero" in caplog.text


def test_the_charged_plan_is_what_trains_where_opacus_and_the_plan_used_to_differ():
    """⌈n/B⌉ = 93 (n = 371, B = 4): Opacus' own loader stepped int(1/(1/93)) times; the
    plan, the steps taken and the charge now agree by construction."""
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    cfg = LocalTrainingConfig(epochs=1, batch_size=4, learning_rate=0.1, momentum=0.0, seed=1)
    metrics, steps = train_dpsgd(model, _data(371), cfg, clip=1.0, noise_multiplier=1.0, noise=OSEntropyNoise(),
                                 grad_sample_mode="hooks")
    assert steps == [(1.0, 1 / 93, 93)] and metrics["local-steps"] == 93.0


@pytest.mark.parametrize("tau", [1, 5, 13])
def test_local_steps_takes_and_charges_exactly_tau_steps_at_the_same_q(tau):
    """τ = ``local-steps`` replaces E·⌈n/B⌉ (here 2·4 = 8): τ steps are taken, at q = 1/⌈n/B⌉."""
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    cfg = LocalTrainingConfig(epochs=2, batch_size=4, learning_rate=0.1, momentum=0.0, seed=1, steps=tau)
    metrics, steps = train_dpsgd(model, _data(16), cfg, clip=1.0, noise_multiplier=1.0, noise=OSEntropyNoise(),
                                 grad_sample_mode="hooks")
    assert steps == [(1.0, 0.25, tau)] and metrics["local-steps"] == float(tau)
    planned = DPSGD(1.0, 1.0, None, num_examples=16, batch_size=4, epochs=2, local_steps=tau).workload
    assert planned == (0.25, tau)


@pytest.mark.parametrize(("tau", "n", "batch"), [(1, 16, 4), (5, 16, 4), (9, 10, 3)])
def test_plain_local_steps_stop_mid_pass_and_walk_on_across_passes(tau, n, batch):
    from tasks.models import train_plain

    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    metrics = train_plain(model, _data(n), epochs=7, batch_size=batch, lr=0.1, momentum=0.0, seed=1, steps=tau)
    assert metrics["local-steps"] == tau
