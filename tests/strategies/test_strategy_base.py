"""The shared strategy pieces on their own: weighted mean, validation, sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord

from protocol import keys
from strategies.base import ClientAccount, PrivacyAwareFedAvg
from strategies.layers import weighted_mean
from strategies.validation import DeclaredBudget, specs_of, validate_train_reply
from tests.fakes import train_reply_content


def _reply(arrays, **metrics):
    return train_reply_content(arrays, num_examples=10, epsilon_budget=2.0, **metrics)


def test_weighted_mean_matches_an_explicit_sum():
    rng = np.random.default_rng(0)
    models = [[rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)] for _ in range(5)]
    w = rng.uniform(1, 100, size=5)
    got = weighted_mean(models, w)
    for j in range(2):
        expected = sum(wk * m[j].astype(np.float64) for wk, m in zip(w, models, strict=True)) / w.sum()
        np.testing.assert_allclose(got[j], expected, rtol=1e-6)
        assert got[j].dtype == np.float32


def test_validation_accepts_a_good_reply_and_names_each_defect():
    ref = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    specs = specs_of(ArrayRecord(ref))
    declared = DeclaredBudget(epsilon_budget=2.0, delta=1e-5, epsilon_spent=0.5)
    assert validate_train_reply(_reply(ref), specs, declared) is None
    cases = {
        "has shape": _reply([np.zeros((3, 3), np.float32), ref[1]]),
        "expected 2 arrays": _reply(ref[:1]),
        "NaN or Inf": _reply([np.full((2, 3), np.inf, np.float32), ref[1]]),
        "positive integer": _reply(ref, **{keys.NUM_EXAMPLES: 0}),
        "is NaN": _reply(ref, **{keys.EPSILON_SPENT: math.nan}),
        "negative": _reply(ref, **{keys.EPSILON_SPENT: -1.0}),
        "exceeds the claimed budget": _reply(ref, **{keys.EPSILON_SPENT: 3.0}),
        "contradicts the handshake": _reply(ref, **{keys.EPSILON_BUDGET: 50.0}),
        "below what it had already spent": _reply(ref, **{keys.EPSILON_SPENT: 0.1}),
        "outside (0, 1)": _reply(ref, **{keys.DELTA: 2.0}),
    }
    for expected_reason, content in cases.items():
        reason = validate_train_reply(content, specs, declared)
        assert reason is not None and expected_reason in reason, (expected_reason, reason)


def test_sampling_never_picks_an_exhausted_client_and_is_seeded():
    strategy = PrivacyAwareFedAvg(fraction_train=0.5, min_train_nodes=1, seed=3)
    for n in range(10):
        strategy.accounts[n] = ClientAccount(n, str(n), 1.0, 1e-5, 10, 0.0, 0.0, exhausted=n % 3 == 0)
    eligible = strategy.registry.eligible(range(10))
    assert eligible == [1, 2, 4, 5, 7, 8]
    for rnd in range(1, 20):
        chosen = strategy.sample(rnd, eligible)
        assert len(chosen) == 3 and set(chosen) <= set(eligible)
        assert chosen == strategy.sample(rnd, eligible)
    assert strategy.sample(1, []) == []


def test_constructor_validates_its_domain():
    with pytest.raises(ValueError, match="dp.mode"):
        PrivacyAwareFedAvg(dp_mode="central")
    with pytest.raises(ValueError, match="fraction_train"):
        PrivacyAwareFedAvg(fraction_train=0.0)
    with pytest.raises(ValueError, match="noise_shares"):
        PrivacyAwareFedAvg(noise_shares=0)


def test_the_same_seed_samples_the_same_clients_whatever_their_node_ids():
    """Backends number nodes differently (in-process: consecutive ids; Ray simulation and a
    deployment: random uint64): sampling follows client ids, so the same clients train."""
    from tests.fakes import BudgetGrid

    picked = []
    for node_ids in (list(range(100, 140)), [2**63 + 7919 * k for k in range(40, 0, -1)]):
        grid = BudgetGrid({n: 5.0 for n in node_ids})
        names = {n: str(i) for i, n in enumerate(node_ids)}  # client i on whatever node id
        grid.send_and_receive = _renamed(grid.send_and_receive, names)
        strategy = PrivacyAwareFedAvg(fraction_train=0.25, min_train_nodes=1, seed=3)
        strategy.registry.handshake(grid, node_ids, strategy.budget_query())
        picked.append([sorted(strategy.accounts[n].client_id for n in strategy.sample(r, strategy.registry.eligible(node_ids)))
                       for r in range(1, 6)])
    assert picked[0] == picked[1]
    assert len({tuple(p) for p in picked[0]}) > 1, "rounds draw different clients"


def test_personalized_evaluation_asks_the_same_clients_whatever_their_node_ids():
    """PPSGD's evaluation sample follows client ids too, like the training sample."""
    from flwr.app import ArrayRecord, ConfigRecord

    from strategies.personalized import PPSGD
    from tests.fakes import BudgetGrid

    asked = []
    for node_ids in (list(range(100, 140)), [2**63 + 7919 * k for k in range(40, 0, -1)]):
        grid = BudgetGrid({n: 5.0 for n in node_ids})
        names = {n: str(i) for i, n in enumerate(node_ids)}
        grid.send_and_receive = _renamed(grid.send_and_receive, names, evaluation=True)
        strategy = PPSGD(fraction_evaluate=0.25, min_train_nodes=1, seed=3)
        strategy.registry.handshake(grid, node_ids, strategy.budget_query())
        asked.append([sorted(names[m.metadata.dst_node_id] for m in
                             strategy.configure_evaluate(r, ArrayRecord(), ConfigRecord(), grid)) for r in (1, 2, 3)])
    assert asked[0] == asked[1] and all(len(a) == 10 for a in asked[0])
    assert len({tuple(a) for a in asked[0]}) > 1, "rounds ask different clients"


def _renamed(send, names, evaluation=False):  # noqa: ANN001
    from flwr.app import ConfigRecord, Message, RecordDict

    def wrapped(messages, *, timeout=None):  # noqa: ANN001
        out = []
        for reply in send(messages, timeout=timeout):
            meta = ConfigRecord({keys.CLIENT_ID: names[reply.metadata.src_node_id],
                                 **({keys.CLIENT_EVALUATION: "on"} if evaluation else {})})
            out.append(Message(RecordDict({keys.METRICS: reply.content[keys.METRICS], keys.META: meta}),
                               reply_to=next(m for m in messages
                                             if m.metadata.dst_node_id == reply.metadata.src_node_id)))
        return out

    return wrapped
