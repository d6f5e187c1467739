"""WeiAvg, PFA and PFA+ as Flower strategies (``strategies/pfa.py``).

Strategy-level tests drive the real ``configure_train`` / ``aggregate_train`` with a
fake grid that answers the budget handshake, build the clients' replies by hand and
compare the new global model with independent numpy computations. The end-to-end tests
run the real ServerApp logic and ClientApp on the in-process grid.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from client.pfa_coordinates import encode_pfa_coordinates
from protocol import keys
from strategies.pfa import PFA, PFAConfig, PFAPlus, WeiAvg
from tests.fakes import BudgetGrid, train_reply

NAMES = ["fc.weight", "fc.bias", "conv.weight"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models train much faster on one thread on a shared CPU; restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SHAPES = [(4, 6), (4,), (2, 3, 2)]




def _model(rng, scale=1.0):
    return [(scale * rng.normal(size=s)).astype(np.float32) for s in SHAPES]


def _record(arrays):
    return ArrayRecord({n: Array(np.asarray(a)) for n, a in zip(NAMES, arrays, strict=True)})


def _round(strategy, server_round, global_model, budgets, trained, encode=False):
    """configure_train, then one reply per message (models, or coordinates where asked)."""
    messages = list(strategy.configure_train(server_round, _record(global_model), ConfigRecord({}),
                                             BudgetGrid(budgets)))
    replies = []
    for msg in messages:
        node = msg.metadata.dst_node_id
        if node not in trained:  # dropped out
            continue
        arrays = trained[node]
        if encode and msg.content[keys.CONFIG].get(keys.UPLOAD_FORMAT) == keys.UPLOAD_COORDINATES:
            arrays = encode_pfa_coordinates(msg.content, global_model, arrays).to_numpy_ndarrays()
        replies.append(train_reply(msg, arrays, epsilon_budget=budgets[node], epsilon_spent=budgets[node] / 2))
    record, _ = strategy.aggregate_train(server_round, replies)
    return messages, record.to_numpy_ndarrays()


def _pfa_numpy(global_model, trained, budgets, public):
    """Independent PFA (authors' WeiPFA, k = 1, centred), per layer, on local − global."""
    out = []
    for j, g in enumerate(global_model):
        g = g.astype(np.float64).ravel()
        delta = {n: w[j].astype(np.float64).ravel() - g for n, w in trained.items()}
        pub = [n for n in delta if n in public]
        pri = [n for n in delta if n not in public]
        e_pub, e_pri = sum(budgets[n] for n in pub), sum(budgets[n] for n in pri)
        mean_pub = sum(budgets[n] * delta[n] for n in pub) / e_pub
        mean_pri = sum(budgets[n] * delta[n] for n in pri) / e_pri
        a = np.stack([delta[n] for n in pub])
        mu = a.mean(axis=0)
        vals, vecs = np.linalg.eigh((a - mu).T @ (a - mu))
        v = vecs[:, np.argmax(vals)]
        projected = mu + v * (v @ (mean_pri - mu))
        out.append((g + (e_pub * mean_pub + e_pri * projected) / (e_pub + e_pri)).reshape(global_model[j].shape))
    return out


BUDGETS = {100 + i: e for i, e in enumerate([0.1, 0.12, 0.09, 0.5, 0.11, 10.0, 9.0, 9.5, 0.2, 0.3])}
PUBLIC = {105, 106, 107}  # the top 30 %


def _trained(rng, global_model, nodes):
    return {n: [g + 0.1 * rng.normal(size=g.shape).astype(np.float32) for g in global_model] for n in nodes}


# --------------------------------------------------------------------------- config
def test_config_section_validates_and_matches_the_pyproject_defaults(run_config_factory):
    from server.config import ConfigError, RunConfig

    cfg = RunConfig.from_flower(run_config_factory(strategy="pfa-plus", **{"pfa.k": 2}))
    assert cfg.pfa.k == 2 and cfg.resolved_dp_mode == "dpsgd"
    assert RunConfig.from_flower(run_config_factory()).pfa == PFAConfig()  # pyproject == class defaults
    for key, value, words in [("pfa.split", "kmeans", "top-fraction, two-cluster"),
                              ("pfa.subspace-method", "lanczos", "exact, randomized"),
                              ("pfa.no-public", "skip", "weiavg, redraw, error"),
                              ("pfa.k", 0, "greater than or equal to 1"),
                              ("pfa.public-fraction", 1.5, "less than or equal to 1")]:
        with pytest.raises(ConfigError, match=key) as err:
            RunConfig.from_flower(run_config_factory(**{key: value}))
        assert words in str(err.value)


# ---------------------------------------------------------------- strategy level
def test_weiavg_is_the_epsilon_weighted_mean():
    rng = np.random.default_rng(0)
    g = _model(rng)
    trained = _trained(rng, g, BUDGETS)
    _, got = _round(WeiAvg(min_train_nodes=1, min_available_nodes=1), 1, g, BUDGETS, trained)
    total = sum(BUDGETS.values())
    for j in range(len(SHAPES)):
        expected = sum(e * trained[n][j].astype(np.float64) for n, e in BUDGETS.items()) / total
        np.testing.assert_allclose(got[j], expected, rtol=1e-5, atol=1e-6)


def test_pfa_matches_an_independent_projection_with_a_global_public_set():
    rng = np.random.default_rng(1)
    g = _model(rng)
    strategy = PFA(PFAConfig(k=1, public_fraction=0.3), min_train_nodes=1, min_available_nodes=1)
    trained = _trained(rng, g, BUDGETS)
    _, got = _round(strategy, 1, g, BUDGETS, trained)
    assert strategy.public_nodes() == PUBLIC
    for a, b in zip(got, _pfa_numpy(g, trained, BUDGETS, PUBLIC), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert strategy.round_log[-1].diagnostics["pfa-num-public"] == 3.0

    # Round 2: public client 107 (eps 9.5) drops. The split stays the one over all ten
    # registered clients: eps = 0.5 is still private (a per-round top 30% of the nine
    # replies would make it public).
    trained = _trained(rng, got, [n for n in BUDGETS if n != 107])
    _, got2 = _round(strategy, 2, got, BUDGETS, trained)
    assert strategy.round_log[-1].diagnostics["pfa-num-public"] == 2.0
    for a, b in zip(got2, _pfa_numpy(got, trained, BUDGETS, PUBLIC), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_round_without_public_replies_follows_the_no_public_policy():
    rng = np.random.default_rng(6)
    g = _model(rng)
    trained = _trained(rng, g, [n for n in BUDGETS if n not in PUBLIC])
    strategy = PFA(PFAConfig(public_fraction=0.3), min_train_nodes=1, min_available_nodes=1)
    _, got = _round(strategy, 1, g, BUDGETS, trained)
    assert strategy.round_log[-1].diagnostics["pfa-fallback-weiavg"] == 1.0
    total = sum(BUDGETS[n] for n in trained)
    for j in range(len(SHAPES)):
        expected = sum(BUDGETS[n] * trained[n][j].astype(np.float64) for n in trained) / total
        np.testing.assert_allclose(got[j], expected, rtol=1e-5, atol=1e-6)
    strict = PFA(PFAConfig(public_fraction=0.3, no_public="error"), min_train_nodes=1, min_available_nodes=1)
    with pytest.raises(ValueError, match="no public client"):
        _round(strict, 1, g, BUDGETS, trained)


def test_pfa_plus_messages_carry_the_subspace_to_private_clients_only():
    rng = np.random.default_rng(2)
    g = _model(rng)
    strategy = PFAPlus(PFAConfig(public_fraction=0.3), min_train_nodes=1, min_available_nodes=1)
    warmup, g2 = _round(strategy, 1, g, BUDGETS, _trained(rng, g, BUDGETS))
    assert all(list(m.content.array_records) == [keys.ARRAYS] for m in warmup)
    assert all(keys.UPLOAD_FORMAT not in m.content[keys.CONFIG] for m in warmup)
    messages = list(strategy.configure_train(2, _record(g2), ConfigRecord({}), BudgetGrid(BUDGETS)))
    for msg in messages:
        node = msg.metadata.dst_node_id
        account = strategy.accounts[node]
        model = msg.content[keys.ARRAYS].to_numpy_ndarrays()
        assert [a.shape for a in model] == SHAPES  # the client loads "arrays" unchanged
        if node in PUBLIC:
            assert list(msg.content.array_records) == [keys.ARRAYS]
            assert [s.shape for s in strategy.expected_specs(2, account)] == SHAPES
            continue
        assert msg.content[keys.CONFIG][keys.UPLOAD_FORMAT] == keys.UPLOAD_COORDINATES
        record = msg.content[keys.PFA_BASIS_RECORD]
        for name, shape in zip(NAMES, SHAPES, strict=True):
            d = int(np.prod(shape))
            assert record[keys.PROJECTION_BASIS_PREFIX + name].shape == (d, 1)
            assert record[keys.PROJECTION_CENTER_PREFIX + name].shape == (d,)
        assert [(s.shape, s.dtype) for s in strategy.expected_specs(2, account)] == [((1,), np.float32)] * 3


def test_pfa_plus_equals_pfa_on_the_same_subspace():
    """Alg. 5 with the subspace of Alg. 3 gives Alg. 3's model."""
    rng = np.random.default_rng(3)
    g = _model(rng)
    trained = _trained(rng, g, BUDGETS)
    pfa = PFA(PFAConfig(public_fraction=0.3), min_train_nodes=1, min_available_nodes=1)
    _, expected = _round(pfa, 1, g, BUDGETS, trained)

    plus = PFAPlus(PFAConfig(public_fraction=0.3), min_train_nodes=1, min_available_nodes=1)
    plus._subspaces = pfa._subspaces  # as if the previous round had fitted exactly these
    messages, got = _round(plus, 2, g, BUDGETS, trained, encode=True)
    assert sum(keys.PFA_BASIS_RECORD in m.content.array_records for m in messages) == 7
    log = plus.round_log[-1]
    assert log.diagnostics["pfa-coordinate-uploads"] == 7.0
    assert log.bytes_up == 3 * sum(4 * int(np.prod(s)) for s in SHAPES) + 7 * 3 * 4
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_coordinate_encoder_projects_the_update_and_names_a_missing_basis():
    rng = np.random.default_rng(4)
    g, w = _model(rng), _model(rng)
    bases = [np.linalg.qr(rng.normal(size=(int(np.prod(s)), 2)))[0] for s in SHAPES]
    centers = [rng.normal(size=int(np.prod(s))) for s in SHAPES]
    items = {}
    for name, v, mu in zip(NAMES, bases, centers, strict=True):
        items[keys.PROJECTION_BASIS_PREFIX + name] = Array(v)
        items[keys.PROJECTION_CENTER_PREFIX + name] = Array(mu)
    request = RecordDict({keys.ARRAYS: _record(g), keys.PFA_BASIS_RECORD: ArrayRecord(items),
                          keys.CONFIG: ConfigRecord({keys.UPLOAD_FORMAT: keys.UPLOAD_COORDINATES})})
    from client.uploads import encode_upload

    got = encode_upload(request, g, w)
    assert list(got.keys()) == NAMES
    for c, v, mu, a, b in zip(got.to_numpy_ndarrays(), bases, centers, w, g, strict=True):
        assert c.dtype == np.float32
        np.testing.assert_allclose(c, v.T @ ((a.astype(np.float64) - b).ravel() - mu), rtol=1e-5)
    del request[keys.PFA_BASIS_RECORD]
    with pytest.raises(ValueError, match=keys.PFA_BASIS_RECORD):
        encode_upload(request, g, w)


def test_infinite_budgets_are_refused_at_the_handshake_with_a_clear_message():
    rng = np.random.default_rng(5)
    g = _model(rng)
    budgets = {100: float("inf"), 101: 1.0}
    strategy = PFA(min_train_nodes=1, min_available_nodes=1)
    messages, _ = _round(strategy, 1, g, budgets, _trained(rng, g, budgets))
    assert [m.metadata.dst_node_id for m in messages] == [101], "the infinite budget is never scheduled"
    assert "must be finite" in strategy.refused[100].reason


# ------------------------------------------------------------------ end to end
def _run(cfg, hook=None):
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg, reply_hook=hook)
    return run_experiment(grid, cfg, run_id=1)


def _rounds(cfg):
    with open(f"{cfg['out-dir']}/rounds.jsonl") as fh:
        return [json.loads(line) for line in fh]


E2E = dict(num_clients=5, num_server_rounds=3, max_examples_per_client=800, budget_distribution="mixgauss1",
           min_train_clients=5, noise_source="seeded", **{"pfa.public-fraction": 0.4})


@pytest.mark.parametrize("strategy", ["pfa", "pfa-plus"])
def test_pfa_runs_within_every_budget(run_config_factory, strategy):
    cfg = run_config_factory(strategy=strategy, **E2E)
    summary = _run(cfg)
    assert summary["rounds_completed"] == 3
    for c in summary["clients"]:
        assert c["within_budget"] and 0 < c["epsilon_spent"] <= c["epsilon_budget"]
        assert c["rounds_joined"] == [1, 2, 3] and not c["rejections"]
    model_bytes = 4 * (784 * 10 + 10)
    rounds = _rounds(cfg)[1:]
    assert all(r["pfa-num-public"] == 2.0 and r["pfa-num-private"] == 3.0 for r in rounds)
    assert rounds[0]["bytes_up"] == 5 * model_bytes  # warm-up / PFA: full models
    if strategy == "pfa-plus":
        for r in rounds[1:]:  # private clients: k = 1 value per layer, 2 layers, float32
            assert r["pfa-coordinate-uploads"] == 3.0
            assert r["bytes_up"] == 2 * model_bytes + 3 * 2 * 4
            assert r["bytes_down"] > 5 * model_bytes  # the basis and centre travel down
    assert 0.1 < summary["final_accuracy"] <= 1.0


def test_pfa_plus_rejects_malformed_coordinate_replies(run_config_factory):
    """Round 2: one private client sends k + 1 coordinates, a public client sends
    coordinates instead of its model. Both are rejected with a reason; the round goes on."""
    cfg = run_config_factory(strategy="pfa-plus", **{**E2E, "num_server_rounds": 2})
    tampered = {}

    def hook(node, request, reply):
        if request.metadata.message_type != MessageType.TRAIN or reply.has_error():
            return reply
        if int(request.content[keys.CONFIG][keys.SERVER_ROUND]) != 2:
            return reply
        private = request.content[keys.CONFIG].get(keys.UPLOAD_FORMAT) == keys.UPLOAD_COORDINATES
        if ("private" if private else "public") in tampered:
            return reply
        arrays = reply.content[keys.ARRAYS].to_numpy_ndarrays()
        if private:
            arrays[0] = np.append(arrays[0], np.float32(0.0))
        else:
            arrays = [np.zeros(1, np.float32) for _ in arrays]
        tampered["private" if private else "public"] = str(reply.content[keys.META][keys.CLIENT_ID])
        content = RecordDict({keys.ARRAYS: ArrayRecord(arrays), keys.METRICS: reply.content[keys.METRICS],
                              keys.META: reply.content[keys.META]})
        return Message(content, reply_to=request)

    summary = _run(cfg, hook)
    assert summary["rounds_completed"] == 2 and set(tampered) == {"private", "public"}
    clients = {c["client_id"]: c for c in summary["clients"]}
    assert "has shape (2,), expected (1,)" in clients[tampered["private"]]["rejections"][0]["reason"]
    assert "has shape (1,), expected (10, 784)" in clients[tampered["public"]]["rejections"][0]["reason"]
    others = [c for cid, c in clients.items() if cid not in tampered.values()]
    assert len(others) == 3 and all(c["rounds_joined"] == [1, 2] for c in others)
    last = _rounds(cfg)[-1]
    assert len(last["rejected"]) == 2 and last["pfa-num-public"] == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_redraw_gives_every_round_a_public_client_where_weiavg_would_not(seed):
    """``no-public = "redraw"`` (the authors' behaviour): every sample holds a public client;
    the same seed without redraw has rounds with none (so the test can fail)."""
    budgets = {100 + i: (10.0 if i < 2 else 1.0 + 0.1 * i) for i in range(20)}  # 2 public of 20
    samples = {}
    for policy in ("redraw", "weiavg"):
        strategy = PFA(params=PFAConfig(no_public=policy), fraction_train=0.2, min_train_nodes=1,
                       min_available_nodes=1, seed=seed)
        strategy.registry.handshake(BudgetGrid(budgets), list(budgets), strategy.budget_query())
        public = strategy.public_nodes()
        assert public == {100, 101}
        samples[policy] = [strategy.sample(r, sorted(budgets)) for r in range(1, 41)]
        assert all(len(s) == 4 for s in samples[policy])
    assert all(public & set(s) for s in samples["redraw"])
    assert any(not public & set(s) for s in samples["weiavg"])
    # a round that already had a public client is not redrawn
    assert all(r == w for r, w in zip(samples["redraw"], samples["weiavg"], strict=True) if public & set(w))
