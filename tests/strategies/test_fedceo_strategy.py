"""FedCEO as a Flower strategy (``strategies/fedceo.py``).

Strategy-level tests drive the real ``configure_train`` / ``aggregate_train`` with a fake
grid that answers the budget handshake and replies built by hand; expected models come
from an independent numpy T-tSVD (full FFT, one SVD per slice in a loop, client models
stacked as (out, rest, K) rather than the module's (rest, out, K)). The end-to-end tests
run the real ServerApp logic and ClientApp on the in-process grid.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from protocol import keys
from strategies.fedceo import DIAG_CLIENTS, DIAG_SMOOTHED, DIAG_THRESHOLD, FedCEO, FedCEOConfig
from tests.fakes import BudgetGrid, train_reply

NAMES = ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]
SHAPES = [(3, 2, 2, 2), (3,), (4, 5), (4,)]
NODES = [100, 101, 102, 103]
EXAMPLES = {n: 50 * (1 + i) for i, n in enumerate(NODES)}  # declared at the handshake




# ------------------------------------------------------------------ independent oracles
def _svt(m: np.ndarray, thr: float) -> np.ndarray:
    u, s, vh = np.linalg.svd(m, full_matrices=False)
    return (u * np.maximum(s - thr, 0.0)) @ vh


def oracle_smooth(models: list[list[np.ndarray]], thr: float) -> list[list[np.ndarray]]:
    """T-tSVD per array: stack (out, rest, K), full FFT, loop of slice SVTs, inverse FFT."""
    out = [[None] * len(models[0]) for _ in models]
    for i, shape in enumerate(np.shape(p) for p in models[0]):
        rows = shape[0]
        tensor = np.stack([np.asarray(m[i], np.float64).reshape(rows, -1) for m in models], axis=2)
        spectrum = np.fft.fft(tensor, axis=2)
        for k in range(len(models)):
            spectrum[:, :, k] = _svt(spectrum[:, :, k], thr)
        smoothed = np.fft.ifft(spectrum, axis=2).real
        for k in range(len(models)):
            out[k][i] = smoothed[:, :, k].reshape(shape)
    return out


def oracle_global(models: list[list[np.ndarray]], thr: float) -> list[np.ndarray]:
    """Prop. 3.2 generalised: SVT of the plain average at thr/K, per array."""
    result = []
    for i, shape in enumerate(np.shape(p) for p in models[0]):
        avg = np.mean([np.asarray(m[i], np.float64) for m in models], axis=0)
        result.append(_svt(avg.reshape(shape[0], -1), thr / len(models)).reshape(shape))
    return result


# ------------------------------------------------------------------------ fake rounds
def _record(arrays) -> ArrayRecord:
    return ArrayRecord({n: Array(np.asarray(a)) for n, a in zip(NAMES, arrays, strict=True)})


def _round(strategy, server_round, global_model, uploads):
    """configure_train for all NODES, replies from ``uploads`` (node -> arrays) only."""
    messages = list(strategy.configure_train(server_round, _record(global_model), ConfigRecord({}),
                                             BudgetGrid({n: 10.0 for n in NODES}, EXAMPLES)))
    sent = {m.metadata.dst_node_id: m.content[keys.ARRAYS].to_numpy_ndarrays() for m in messages}
    replies = [train_reply(m, uploads[m.metadata.dst_node_id], num_examples=EXAMPLES[m.metadata.dst_node_id])
               for m in messages if m.metadata.dst_node_id in uploads]
    record, _ = strategy.aggregate_train(server_round, replies)
    return sent, (record.to_numpy_ndarrays() if record is not None else None)


def _uploads(rng, nodes, noise=0.3):
    """Correlated client models: a shared rank-1 part per array plus client noise."""
    shared = []
    for s in SHAPES:
        a, b = rng.normal(size=s[0]), rng.normal(size=int(np.prod(s[1:])))
        shared.append((2.0 * np.outer(a, b)).reshape(s))
    return {n: [(p + noise * rng.normal(size=p.shape)).astype(np.float32) for p in shared] for n in nodes}


def _strategy(**params) -> FedCEO:
    return FedCEO(FedCEOConfig(**params), min_train_nodes=1, min_available_nodes=1)


def _close(a, b, tol=2e-5):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), y, rtol=tol, atol=tol)


# ---------------------------------------------------------------------- strategy level
def test_smoothing_round_global_is_the_svt_of_the_average_and_clients_get_their_own_model():
    rng = np.random.default_rng(0)
    strategy = _strategy(lam=0.5, theta=1.5, interval=2)
    g0 = [np.zeros(s, np.float32) for s in SHAPES]

    # Round 1 (1 % 2 != 0): the unweighted FedAvg of Alg. 2 line 18, whatever n_k.
    up1 = _uploads(rng, NODES)
    sent1, g1 = _round(strategy, 1, g0, up1)
    for n in NODES:
        _close(sent1[n], g0, tol=0)
    _close(g1, [np.mean([up1[n][i] for n in NODES], axis=0, dtype=np.float64) for i in range(len(SHAPES))])
    assert strategy.round_log[-1].diagnostics[DIAG_SMOOTHED] == 0.0

    # Round 2 smooths the three replies (node 103 drops): thr = 1.5^(2/2) / (2 · 0.5).
    up2 = _uploads(rng, NODES[:3])
    _, g2 = _round(strategy, 2, g1, up2)
    thr = 1.5
    models = [up2[n] for n in NODES[:3]]
    _close(g2, oracle_global(models, thr))
    _close(g2, [np.mean([m[i] for m in oracle_smooth(models, thr)], axis=0) for i in range(len(SHAPES))])
    plain = [np.mean([m[i] for m in models], axis=0, dtype=np.float64) for i in range(len(SHAPES))]
    assert max(np.abs(a - b).max() for a, b in zip(g2, plain, strict=True)) > 1e-2, "the threshold must bite"
    entry = strategy.round_log[-1].diagnostics
    assert entry[DIAG_SMOOTHED] == 1.0 and entry[DIAG_CLIENTS] == 3.0
    assert entry[DIAG_THRESHOLD] == pytest.approx(thr)

    # Round 3: each client of S_2 starts from ITS OWN ŵ_k(2); node 103 gets the global.
    sent3, g3 = _round(strategy, 3, g2, _uploads(rng, NODES))
    personal = oracle_smooth(models, thr)
    for k, node in enumerate(NODES[:3]):
        _close(sent3[node], personal[k])
        assert max(np.abs(a - b).max() for a, b in zip(sent3[node], g2, strict=True)) > 1e-3
    _close(sent3[103], g2, tol=0)

    # Round 4: after a non-smoothing round everyone starts from the global again.
    sent4, _ = _round(strategy, 4, g3, _uploads(rng, NODES))
    for n in NODES:
        _close(sent4[n], g3, tol=0)


def test_restart_global_sends_everyone_the_global_model_after_smoothing():
    rng = np.random.default_rng(3)
    own, glob = _strategy(lam=0.5, interval=1), _strategy(lam=0.5, interval=1, restart="global")
    g0 = [np.zeros(s, np.float32) for s in SHAPES]
    up1 = _uploads(rng, NODES)
    (_, g_own), (_, g_glob) = _round(own, 1, g0, up1), _round(glob, 1, g0, up1)
    _close(g_own, g_glob, tol=0)  # the restart does not change the aggregation
    sent_own, _ = _round(own, 2, g_own, _uploads(rng, NODES))
    sent_glob, _ = _round(glob, 2, g_glob, _uploads(rng, NODES))
    for n in NODES:
        _close(sent_glob[n], g_glob, tol=0)
        assert max(np.abs(a - b).max() for a, b in zip(sent_own[n], g_own, strict=True)) > 1e-3


@pytest.mark.parametrize("theta", [1.0, 1.2])
def test_threshold_is_constant_for_theta_one_and_geometric_otherwise(theta):
    rng = np.random.default_rng(1)
    lam, interval = 2.0, 2
    strategy = _strategy(lam=lam, theta=theta, interval=interval)
    g = [np.zeros(s, np.float32) for s in SHAPES]
    for t in range(1, 7):
        _, g = _round(strategy, t, g, _uploads(rng, NODES))
    thresholds = [e.diagnostics[DIAG_THRESHOLD] for e in strategy.round_log]
    assert [math.isnan(x) for x in thresholds] == [True, False] * 3
    expected = [theta ** (t / interval) / (2 * lam) for t in (2, 4, 6)]
    assert thresholds[1::2] == pytest.approx(expected)
    if theta == 1.0:
        assert thresholds[1] == thresholds[3] == thresholds[5] == 1 / (2 * lam)


def test_layers_limits_smoothing_to_the_listed_arrays():
    rng = np.random.default_rng(2)
    strategy = _strategy(lam=0.5, theta=1.0, interval=1, layers="2")
    up = _uploads(rng, NODES)
    _, g = _round(strategy, 1, [np.zeros(s, np.float32) for s in SHAPES], up)
    models = [up[n] for n in NODES]
    smoothed = oracle_global(models, 1.0)
    for i in range(len(SHAPES)):
        plain = np.mean([m[i] for m in models], axis=0, dtype=np.float64)
        _close([g[i]], [smoothed[i] if i == 2 else plain])

    bad = _strategy(layers="0,9")
    with pytest.raises(ValueError, match="'fedceo.layers' index 9 out of range"):
        _round(bad, 1, [np.zeros(s, np.float32) for s in SHAPES], up)


def test_fewer_than_two_usable_replies_fall_back_to_averaging(caplog):
    """Invalid uploads are rejected before stacking; one survivor cannot collaborate."""
    rng = np.random.default_rng(3)
    strategy = _strategy(interval=1)
    up = _uploads(rng, NODES[:3])
    up[100][0] = np.full(SHAPES[0], np.nan, np.float32)
    up[101] = up[101][:-1]  # an array missing
    g0 = [np.zeros(s, np.float32) for s in SHAPES]
    with caplog.at_level(logging.WARNING, logger="privet.strategy"):
        _, g1 = _round(strategy, 1, g0, up)
    assert "needs >= 2 usable client models, got 1; averaging instead" in caplog.text
    _close(g1, up[102], tol=0)
    entry = strategy.round_log[-1]
    assert entry.accepted == ["102"] and len(entry.rejected) == 2
    assert entry.diagnostics[DIAG_SMOOTHED] == 0.0 and math.isnan(entry.diagnostics[DIAG_THRESHOLD])
    sent2, _ = _round(strategy, 2, g1, _uploads(rng, NODES))
    for n in NODES:
        _close(sent2[n], g1, tol=0)


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("fedceo.lambda", 0.0, "must be a finite number > 0"),
        ("fedceo.lambda", True, "must be a number"),
        ("fedceo.theta", 0.9, ">= 1"),
        ("fedceo.interval", 0, ">= 1"),
        ("fedceo.layers", "1,x", "comma-separated parameter indices"),
        ("fedceo.layers", "1,1", "distinct indices"),
        ("fedceo.half-spectrum", "maybe", "valid boolean"),
        ("fedceo.restart", "mine", "must be one of own, global"),
    ],
)
def test_config_errors_name_the_key(run_config_factory, key, value, words):
    from server.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=f"'{key}'") as err:
        RunConfig.from_flower(run_config_factory(strategy="fedceo", **{key: value}))
    assert words in str(err.value)


def test_config_section_defaults_and_registry(run_config_factory):
    from server.config import RunConfig
    from server.registry import build_strategy

    base = RunConfig.from_flower(run_config_factory(strategy="fedceo", dp_mode="auto"))
    assert base.fedceo == FedCEOConfig()  # the pyproject table equals the class defaults
    assert base.resolved_dp_mode == "update"  # the paper's Algorithm 1
    cfg = RunConfig.from_flower(run_config_factory(strategy="fedceo", **{"fedceo.theta": 1, "fedceo.layers": 3}))
    strategy = build_strategy(cfg)
    assert isinstance(strategy, FedCEO)
    assert strategy.params.theta == 1.0 and strategy.params.layer_indices == (3,)


# ---------------------------------------------------------------- in-process end-to-end
def _run(cfg, hook=None):
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg, reply_hook=hook)
    summary = run_experiment(grid, cfg, run_id=1)
    rounds = [json.loads(x) for x in open(f"{cfg['out-dir']}/rounds.jsonl").read().splitlines()]
    return summary, rounds


def _fedceo_config(run_config_factory, **kw):
    return run_config_factory(strategy="fedceo", dp_mode="update", num_clients=4, model="mlp2",
                              max_examples_per_client=200, min_train_clients=2, **kw)


def test_bad_replies_are_dropped_before_stacking_in_process(run_config_factory):
    cfg = _fedceo_config(run_config_factory, num_server_rounds=1, **{"fedceo.interval": 1})

    def tamper(node, request, reply):
        from privet.inprocess import FIRST_NODE_ID

        if request.metadata.message_type != "train" or node not in (FIRST_NODE_ID, FIRST_NODE_ID + 1):
            return reply
        arrays = reply.content[keys.ARRAYS].to_numpy_ndarrays()
        if node == FIRST_NODE_ID:
            arrays[0] = np.full_like(arrays[0], np.nan)
        else:
            arrays[1] = arrays[1][:-1]
        return Message(RecordDict({keys.ARRAYS: ArrayRecord(arrays), keys.METRICS: reply.content[keys.METRICS],
                                   keys.META: reply.content[keys.META]}), reply_to=request)

    summary, rounds = _run(cfg, tamper)
    assert summary["rounds_completed"] == 1
    last = rounds[-1]
    assert sorted(r["client"] for r in last["rejected"]) == ["0", "1"]
    assert "NaN or Inf" in str(last["rejected"]) and "has shape" in str(last["rejected"])
    assert last["accepted"] == ["2", "3"]
    assert last[DIAG_SMOOTHED] == 1.0 and last[DIAG_CLIENTS] == 2.0
    assert math.isfinite(summary["final_accuracy"])


def test_tiny_fedceo_run_personalises_and_stays_within_budgets(run_config_factory):
    cfg = _fedceo_config(run_config_factory, num_server_rounds=4, **{"fedceo.interval": 2, "fedceo.lambda": 0.05})
    downloads: dict[int, dict[int, list[np.ndarray]]] = {}

    def record_requests(node, request, reply):
        if request.metadata.message_type == "train":
            t = int(request.content[keys.CONFIG][keys.SERVER_ROUND])
            downloads.setdefault(t, {})[node] = request.content[keys.ARRAYS].to_numpy_ndarrays()
        return reply

    summary, rounds = _run(cfg, record_requests)
    assert summary["rounds_completed"] == 4 and summary["dp_mode"] == "update"
    for c in summary["clients"]:
        assert c["within_budget"] and 0 < c["epsilon_spent"] <= c["epsilon_budget"]
        assert c["rounds_joined"] == [1, 2, 3, 4]
        assert "(client-level)" in c["guarantee"]
    assert [r.get(DIAG_SMOOTHED) for r in rounds[1:]] == [0.0, 1.0, 0.0, 1.0]
    assert rounds[4][DIAG_THRESHOLD] == pytest.approx(1.04 ** 2 / (2 * 0.05))

    def identical(t):
        first, *rest = downloads[t].values()
        return all(all(np.array_equal(a, b) for a, b in zip(first, other, strict=True)) for other in rest)

    # everyone gets the same global in rounds 2 and 4; after a smoothing round (t = 3)
    # each client gets its own smoothed model
    assert identical(2) and identical(4) and not identical(3)
