"""End-to-end runs of the real ServerApp logic and the real ClientApp on the in-process
Grid: privacy budgets, bad replies, drop-outs, exhaustion, durable ledgers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from client.app import app as client_app
from privet.inprocess import FIRST_NODE_ID, InProcessGrid, simulation_node_configs
from protocol import keys
from server.app import run_experiment


def _run(cfg, node_configs=None, hook=None, run_id=1):
    grid = InProcessGrid(client_app, node_configs or simulation_node_configs(cfg["num-clients"]), cfg,
                         run_id=run_id, reply_hook=hook)
    return run_experiment(grid, cfg, run_id=run_id)


def _run_incomplete(cfg, node_configs=None, run_id=1):
    """A run in which some round accepts no reply: it ends failed (Flower marks it so), and its
    summary.json says which rounds and why."""
    with pytest.raises(RuntimeError, match="incomplete"):
        _run(cfg, node_configs, run_id=run_id)
    return json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())


def _dp_accounting_epsilon(history, delta):
    """ε of a DP-SGD history under replace-one, with Google's dp_accounting PLD at a 10×
    finer discretisation than the ledger's (independent of Opacus and of our RDP bound)."""
    import dp_accounting
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import pld_privacy_accountant

    acct = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    for sigma, q, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        acct.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acct.get_epsilon(delta)


def test_dpsgd_run_spends_within_every_budget(run_config_factory):
    cfg = run_config_factory()
    grid = InProcessGrid(client_app, simulation_node_configs(3), cfg)
    summary = run_experiment(grid, cfg, run_id=1)
    assert summary["rounds_completed"] == 2
    assert summary["final_accuracy"] > 0.3  # chance is 0.1
    budgets = set()
    for c in summary["clients"]:
        budgets.add(c["epsilon_budget"])
        assert 0 < c["epsilon_spent"] <= c["epsilon_budget"]
        assert c["within_budget"] and len(c["rounds_joined"]) == 2
        # calibrated for the whole run: the budget is (almost) used up, not wasted
        assert c["epsilon_spent"] > 0.9 * c["epsilon_budget"]
        # the server's recomputation from reported parameters agrees with the client's ledger
        assert c["epsilon_server_recomputed_this_run"] == pytest.approx(c["epsilon_spent"], rel=1e-6)
    assert len(budgets) == 3, "budgets must differ between clients"


def test_client_epsilon_matches_independent_accountant(run_config_factory):
    cfg = run_config_factory(num_server_rounds=1)
    grid = InProcessGrid(client_app, simulation_node_configs(3), cfg)
    run_experiment(grid, cfg, run_id=1)
    from client.ledger_store import STATE_KEY
    from privacy.ledger import PrivacyLedger

    for ctx in grid.contexts.values():
        ledger = PrivacyLedger.from_json(str(ctx.state[STATE_KEY]["json"]))
        independent = _dp_accounting_epsilon(ledger.history, ledger.delta)
        assert independent <= ledger.spent() <= independent * 1.01  # an upper bound, and tight
        assert ledger.spent() <= ledger.epsilon_budget


def test_non_private_fedavg_learns(run_config_factory):
    cfg = run_config_factory(strategy="fedavg", budget_distribution="none")
    summary = _run(cfg)
    assert summary["final_accuracy"] > 0.6
    assert all(c["epsilon_spent"] is None for c in summary["clients"])  # ε = ∞, reported honestly
    assert all(c["guarantee"].startswith("none") for c in summary["clients"])


def test_finite_budget_client_refuses_non_private_training(run_config_factory):
    cfg = run_config_factory(strategy="fedavg", budget_distribution="none", num_server_rounds=1)
    nodes = simulation_node_configs(3)
    nodes[0]["epsilon"] = 2.0  # this operator declared a budget
    summary = _run(cfg, nodes)
    c0 = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert c0["rounds_joined"] == [] and c0["exhausted"]
    assert "refuses non-private" in c0["rejections"][0]["reason"]
    assert summary["rounds_completed"] == 1


def _tamper(kind):
    """A reply hook that corrupts node FIRST_NODE_ID's reply in round 1."""

    def hook(node, request, reply):
        if node != FIRST_NODE_ID or request.metadata.message_type != "train" or reply.has_error():
            return reply
        if int(request.content[keys.CONFIG][keys.SERVER_ROUND]) != 1:
            return reply
        arrays = reply.content[keys.ARRAYS].to_numpy_ndarrays()
        metrics = dict(reply.content[keys.METRICS])
        if kind == "nan":
            arrays[0] = np.full_like(arrays[0], np.nan)
        elif kind == "shape":
            arrays[0] = arrays[0][:-1]
        elif kind == "dtype":
            arrays[0] = arrays[0].astype(np.float64)
        elif kind == "missing-metric":
            metrics.pop(keys.EPSILON_SPENT)
        elif kind == "budget-claim":
            metrics[keys.EPSILON_BUDGET] = 1000.0
            metrics[keys.EPSILON_SPENT] = 500.0
        elif kind == "overspent":
            metrics[keys.EPSILON_SPENT] = metrics[keys.EPSILON_BUDGET] * 2
        elif kind == "two-arrays":
            content = RecordDict({keys.ARRAYS: ArrayRecord(arrays), "extra": ArrayRecord(arrays),
                                  keys.METRICS: MetricRecord(metrics), keys.META: ConfigRecord({})})
            return Message(content, reply_to=request)
        content = RecordDict({keys.ARRAYS: ArrayRecord(arrays), keys.METRICS: MetricRecord(metrics),
                              keys.META: reply.content[keys.META]})
        return Message(content, reply_to=request)

    return hook


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nan", "NaN or Inf"),
        ("shape", "has shape"),
        ("dtype", "has dtype"),
        ("missing-metric", "missing metric"),
        ("budget-claim", "contradicts the handshake"),
        ("overspent", "exceeds the claimed budget"),
        ("two-arrays", "exactly one ArrayRecord"),
    ],
)
def test_bad_reply_is_rejected_and_the_round_goes_on(run_config_factory, kind, reason):
    cfg = run_config_factory(num_server_rounds=1)
    summary = _run(cfg, hook=_tamper(kind))
    assert summary["rounds_completed"] == 1
    bad = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert bad["rounds_joined"] == []
    assert reason in bad["rejections"][0]["reason"]
    others = [c for c in summary["clients"] if c["client_id"] != "0"]
    assert all(c["rounds_joined"] == [1] for c in others)
    assert summary["final_accuracy"] is not None and math.isfinite(summary["final_accuracy"])


def test_dropped_client_is_reported_and_the_run_finishes(run_config_factory, tmp_path):
    cfg = run_config_factory()

    def drop_node_101_in_round_2(node, request, reply):
        if node == FIRST_NODE_ID + 1 and request.metadata.message_type == "train" \
                and int(request.content[keys.CONFIG][keys.SERVER_ROUND]) == 2:
            return None
        return reply

    summary = _run(cfg, hook=drop_node_101_in_round_2)
    assert summary["rounds_completed"] == 2
    assert summary["dropped"] == ["1"]
    c1 = next(c for c in summary["clients"] if c["client_id"] == "1")
    assert c1["rounds_joined"] == [1] and c1["dropped_rounds"] == [2]
    report = (tmp_path / "results" / "privacy_report.md").read_text()
    assert "dropped out" in report and "1" in report
    rounds = [json.loads(line) for line in (tmp_path / "results" / "rounds.jsonl").read_text().splitlines()]
    assert rounds[-1]["dropped"] == ["1"]


def test_exhausted_client_refuses_and_is_never_scheduled_again(run_config_factory):
    # fixed, weak noise: one round costs eps = 2.86 (PRV, replace-one) of 3, so round 2 would exceed it
    cfg = run_config_factory(num_server_rounds=4, budget_distribution="constant", epsilon=3.0,
                             noise_multiplier=1.2)
    summary = _run_incomplete(cfg)  # rounds 2-4 have nobody left to train
    for c in summary["clients"]:
        assert c["within_budget"] and c["epsilon_spent"] <= 3.0
        assert c["exhausted"]
        assert len(c["rounds_joined"]) < 4
        # refused once at most: after a refusal (or reaching the budget) it is not scheduled
        assert len(c["rejections"]) <= 1
        assert c["rounds_joined"] == [1]
    assert summary["rounds_completed"] == 1  # rounds 2-4 produced no model
    assert [f["round"] for f in summary["failed_rounds"]] == [2, 3, 4]


def test_ledger_survives_restarts_and_a_spent_budget_blocks_training(run_config_factory, tmp_path):
    nodes = [{"partition-id": i, "num-partitions": 3, "epsilon": 4.0, "delta": 1e-5,
              "ledger-path": str(tmp_path / f"ledger-{i}.json")} for i in range(3)]
    # each run may spend at most eps = 2 of a client's lifetime budget of 4
    first = _run(run_config_factory(num_server_rounds=1, run_epsilon=2.0, out_dir=str(tmp_path / "r1")),
                 nodes, run_id=1)
    spent1 = {c["client_id"]: c["epsilon_spent"] for c in first["clients"]}
    assert all(1.9 < s <= 2.0 for s in spent1.values())
    for i in range(3):
        assert json.loads((tmp_path / f"ledger-{i}.json").read_text())["history"]
    # a "restart": new contexts, new state; only the ledger files remain
    second = _run(run_config_factory(num_server_rounds=1, run_epsilon=2.0, out_dir=str(tmp_path / "r2")),
                  nodes, run_id=2)
    for c in second["clients"]:
        assert c["epsilon_spent_before_run"] == pytest.approx(spent1[c["client_id"]])
        assert spent1[c["client_id"]] < c["epsilon_spent"] <= 4.0
    # both runs used the whole budget between them: a third run trains nobody
    third = _run_incomplete(run_config_factory(num_server_rounds=1, run_epsilon=2.0, out_dir=str(tmp_path / "r3")),
                            nodes, run_id=3)
    assert all(c["rounds_joined"] == [] for c in third["clients"])
    assert all(c["exhausted"] for c in third["clients"])


def test_round_rows_hold_the_sampled_clients_and_statistics_over_everyone(run_config_factory):
    """Round rows stay O(sampled): the sampled clients' ε and max/mean/count over all clients."""
    cfg = run_config_factory(num_clients=12, fraction_train=0.25, min_train_clients=3, num_server_rounds=2,
                             max_examples_per_client=64)
    summary = _run(cfg)
    rows = [json.loads(x) for x in (Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()][1:]
    spent_now: dict[str, float] = {c["client_id"]: 0.0 for c in summary["clients"]}
    for row in rows:
        assert sorted(row["epsilon_spent"]) == sorted(row["sampled"]) and len(row["sampled"]) == 3
        spent_now.update(row["epsilon_spent"])
        assert row["num_registered"] == 12
        assert row["epsilon_spent_max"] == pytest.approx(max(spent_now.values()))
        assert row["epsilon_spent_mean"] == pytest.approx(sum(spent_now.values()) / 12)
    assert spent_now == pytest.approx({c["client_id"]: c["epsilon_spent"] for c in summary["clients"]})


def test_local_steps_are_what_the_ledger_charges_and_dp_accounting_agrees(run_config_factory):
    """``local-steps`` = τ = 3 at n = 256, B = 32 (q = 1/8; an epoch would be 8 steps): every
    client's ledger holds exactly 3 steps (σ, 1/8) per round joined, the server's recomputation
    agrees, and Google's dp_accounting bounds the same ε."""
    from client.ledger_store import STATE_KEY
    from privacy.ledger import PrivacyLedger

    cfg = run_config_factory(local_steps=3, noise_multiplier=1.0, budget_distribution="constant", epsilon=50.0)
    grid = InProcessGrid(client_app, simulation_node_configs(3), cfg)
    summary = run_experiment(grid, cfg, run_id=1)
    for c in summary["clients"]:
        assert c["epsilon_server_recomputed_this_run"] == pytest.approx(c["epsilon_spent"], rel=1e-6)
    for ctx in grid.contexts.values():
        ledger = PrivacyLedger.from_json(str(ctx.state[STATE_KEY]["json"]))
        assert {(s, q) for s, q, _ in ledger.history} == {(1.0, 1 / 8)}
        assert sum(count for _, _, count in ledger.history) == 3 * 2  # 2 rounds of τ = 3 (merged)
        independent = _dp_accounting_epsilon(ledger.history, ledger.delta)
        assert independent <= ledger.spent() <= independent * 1.01


def test_validation_runs_evaluate_on_the_validation_split(run_config_factory):
    cfg = run_config_factory(evaluation_split="validation", num_server_rounds=1)
    summary = run_experiment(InProcessGrid(client_app, simulation_node_configs(3), cfg), cfg, run_id=1)
    assert summary["evaluation_split"] == "validation"
    report = (Path(cfg["out-dir"]) / "privacy_report.md").read_text()
    assert "Final validation accuracy" in report


def test_pfa_closed_form_adds_more_noise_and_charges_the_true_epsilon(run_config_factory):
    """At ε = 0.3 the authors' σ is above the accountant's: each client then spends less than
    its budget, and exactly what its ledger's σ costs (the server recomputes the same ε)."""
    spent = {}
    for calibration in ("accountant", "pfa-closed-form"):
        cfg = run_config_factory(calibration=calibration, budget_distribution="constant", epsilon=0.3,
                                 out_dir=str(Path(run_config_factory()["out-dir"]) / calibration))
        summary = run_experiment(InProcessGrid(client_app, simulation_node_configs(3), cfg), cfg, run_id=1)
        for c in summary["clients"]:
            assert c["within_budget"] and c["epsilon_server_recomputed_this_run"] == pytest.approx(
                c["epsilon_spent"], rel=1e-6)
        spent[calibration] = max(c["epsilon_spent"] for c in summary["clients"])
    assert spent["accountant"] > 0.9 * 0.3
    assert spent["pfa-closed-form"] < 0.5 * spent["accountant"]


def test_the_saved_model_is_the_one_whose_accuracy_the_run_reports(run_config_factory):
    """``model.npz`` loaded into a fresh model and evaluated here gives the final accuracy the
    run reported; ``checkpoint-rounds`` adds the models after those rounds (0: the initial one)."""
    from tasks.datasets import load_dataset
    from tasks.models import build_model, evaluate, set_weights, weight_names

    cfg = run_config_factory(checkpoint_rounds="0, 1")
    summary = run_experiment(InProcessGrid(client_app, simulation_node_configs(3), cfg), cfg, run_id=1)
    out = Path(cfg["out-dir"])
    assert sorted(p.name for p in out.glob("model*.npz")) == ["model-round-0000.npz", "model-round-0001.npz",
                                                                 "model.npz"]
    splits = load_dataset("fashion-mnist")
    model = build_model("logreg", input_shape=tuple(splits.train.x.shape[1:]), num_classes=10)
    accuracies = []
    for name in ("model-round-0000.npz", "model.npz"):
        with np.load(out / name) as saved:
            assert list(saved.keys()) == weight_names(model)
            set_weights(model, [saved[k] for k in weight_names(model)])
        accuracies.append(evaluate(model, splits.test)[1])
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert accuracies == pytest.approx([rounds[0]["accuracy"], summary["final_accuracy"]], abs=1e-9)
