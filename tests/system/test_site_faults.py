"""What a badly configured, hostile, hung or late site can do to a run: nothing.

Every test drives the real ClientApp and the real ServerApp logic on the in-process Grid:

- a site's budget comes only from the site when it is deployed; every malformed, missing or
  unusable declaration is refused at the handshake with the node-config key named, listed in
  the summary and the report, and the site is asked once, never again;
- a ``client-id`` already held by another node is refused (identities are not shared);
- an ε-weighted strategy refuses ε = inf at the handshake instead of failing mid-run;
- a round with fewer accepted replies than its minimum fails visibly;
- a train message that outlived its time-to-live is refused before anything is spent, also
  when it expires while the client trains.
"""

from __future__ import annotations

import json
import math
import sys
import time

import pytest
from flwr.app import Error, Message, MessageType, RecordDict

from client import app as client_module
from client.profile import resolve_profile
from privacy.ledger import PrivacyLedger
from privet.inprocess import FIRST_NODE_ID, InProcessGrid, simulation_node_configs
from protocol import keys
from tests.system.test_threat_model import _context, _global_arrays, _message


def _run(cfg: dict, node_configs: list[dict], hook=None) -> tuple[dict, dict[int, list[str]]]:  # noqa: ANN001
    """Run ``cfg`` on these nodes; also return, per node, the message types it was sent."""
    from server.app import run_experiment

    sent: dict[int, list[str]] = {}

    def record(node, request, reply):  # noqa: ANN001
        sent.setdefault(node, []).append(request.metadata.message_type)
        return hook(node, request, reply) if hook else reply

    grid = InProcessGrid(client_module.app, node_configs, cfg, run_id=1, reply_hook=record)
    return run_experiment(grid, cfg, run_id=1), sent


def _site(i: int, n: int = 3, **extra) -> dict:  # noqa: ANN003
    return {"partition-id": i % n, "num-partitions": n, "client-id": f"site-{i}", "epsilon": 50.0, **extra}


def test_a_node_that_does_not_answer_is_asked_again_briefly_and_rejoins():
    """A hung or restarting node is listed, re-asked with a short timeout, and registered
    once it answers; an explicit refusal is never re-asked."""
    from strategies.base import PrivacyAwareFedAvg
    from strategies.clients import RETRY_HANDSHAKE_SECONDS
    from tests.fakes import BudgetGrid

    class Flaky(BudgetGrid):
        def __init__(self, budgets):  # noqa: ANN001
            super().__init__(budgets)
            self.silent, self.timeouts = {101}, []

        def send_and_receive(self, messages, *, timeout=None):  # noqa: ANN001
            self.timeouts.append(timeout)
            return [r for r in super().send_and_receive(messages) if r.metadata.src_node_id not in self.silent]

    grid = Flaky({100: 5.0, 101: 5.0})
    strategy = PrivacyAwareFedAvg(handshake_timeout=300.0)
    strategy.registry.handshake(grid, [100, 101], strategy.budget_query())
    assert set(strategy.accounts) == {100} and strategy.refused[101].retry
    assert "no answer to the budget handshake within 300s" in strategy.refused[101].reason
    strategy.registry.handshake(grid, [100, 101], strategy.budget_query())  # still silent: re-asked briefly
    grid.silent = set()
    strategy.registry.handshake(grid, [100, 101], strategy.budget_query())  # back: registered, no longer listed
    assert set(strategy.accounts) == {100, 101} and not strategy.refused
    assert grid.timeouts == [300.0, RETRY_HANDSHAKE_SECONDS, RETRY_HANDSHAKE_SECONDS]
    strategy.registry.handshake(grid, [100, 101], strategy.budget_query())
    assert len(grid.timeouts) == 3, "registered nodes are not asked again"


def test_bad_declarations_are_refused_once_named_and_reported(run_config_factory, tmp_path):
    cfg = run_config_factory(num_server_rounds=2, budget_distribution="constant", epsilon=50.0,
                             noise_multiplier=1.0)
    nodes = [_site(0), _site(1), _site(2),
             _site(3, epsilon="abc"), _site(4, epsilon=-1.0), _site(5, delta=2.0),
             {**_site(6), "client-id": "site-0"}]
    summary, sent = _run(cfg, nodes)

    assert sorted(c["client_id"] for c in summary["clients"]) == ["site-0", "site-1", "site-2"]
    assert all(c["rounds_joined"] == [1, 2] for c in summary["clients"])
    reasons = {r["node_id"]: r["reason"] for r in summary["refused"]}
    assert len(reasons) == 4, summary["refused"]
    first = FIRST_NODE_ID
    assert "'epsilon' must be a number" in reasons[first + 3] and "'abc'" in reasons[first + 3]
    assert "'epsilon' must be > 0" in reasons[first + 4]
    assert "'delta' must be in (0, 1)" in reasons[first + 5]
    assert "client-id 'site-0' is already held" in reasons[first + 6]
    for node in reasons:  # asked once, at the first handshake, never trained
        assert sent[node] == [f"{MessageType.QUERY}.{keys.QUERY_BUDGET}"], sent[node]
    report = (tmp_path / "results" / "privacy_report.md").read_text()
    assert "Sites refused at the handshake" in report and "'abc'" in report
    assert summary["status"] == "completed"


def test_an_example_count_above_the_runs_cap_is_refused(run_config_factory):
    """A site claiming more examples than the run lets anyone train on would own FedAvg's weight."""
    cfg = run_config_factory(num_server_rounds=1, budget_distribution="constant", epsilon=50.0,
                             noise_multiplier=1.0, max_examples_per_client=200)

    def inflate(node, request, reply):  # noqa: ANN001
        if request.metadata.message_type.endswith(keys.QUERY_BUDGET) and node == FIRST_NODE_ID:
            from flwr.app import MetricRecord

            metrics = dict(reply.content[keys.METRICS])
            metrics[keys.NUM_EXAMPLES] = 10**9
            return Message(RecordDict({keys.METRICS: MetricRecord(metrics), keys.META: reply.content[keys.META]}),
                           reply_to=request)
        return reply

    summary, _ = _run(cfg, simulation_node_configs(3), hook=inflate)
    assert [r["node_id"] for r in summary["refused"]] == [FIRST_NODE_ID]
    assert "more than the run's max-examples-per-client (200)" in summary["refused"][0]["reason"]
    assert all(c["num_examples"] == 200 and c["rounds_joined"] == [1] for c in summary["clients"])


def test_a_deployed_site_without_a_budget_refuses_private_runs(run_config_factory, monkeypatch):
    cfg = run_config_factory(budget_distribution="uniform")
    node = {"partition-id": 0, "num-partitions": 3, "client-id": "site-0"}
    # in a simulation the run config's distribution speaks for the simulated clients
    assert math.isfinite(resolve_profile(node, cfg).epsilon_budget)
    monkeypatch.setattr(sys, "argv", ["/opt/venv/bin/flwr-clientapp", "--token", "x"])
    with pytest.raises(ValueError, match="declares no 'epsilon'.*comes only from the site"):
        resolve_profile(node, cfg)
    # ... and the run config cannot switch a deployed site's options on either
    assert not resolve_profile({**node, "epsilon": 2.0}, {**cfg, "client-evaluation": "on"}).allow_evaluation
    # a non-private run needs no budget: the site takes part, with none
    profile = resolve_profile(node, {**cfg, "budget-distribution": "none"})
    assert math.isinf(profile.epsilon_budget) and not profile.simulated


@pytest.mark.parametrize("strategy", ["weiavg", "pfa", "minimum", "maximum"])
def test_budget_weighted_strategies_refuse_an_infinite_budget_at_the_handshake(run_config_factory, strategy):
    cfg = run_config_factory(strategy=strategy, num_server_rounds=1, budget_distribution="constant",
                             epsilon=5.0)
    nodes = [{**_site(i), "epsilon": 5.0 + i} for i in range(3)] + [_site(3, epsilon=math.inf)]
    summary, _ = _run(cfg, nodes)
    assert [r["client_id"] for r in summary["refused"]] == ["site-3"], summary["refused"]
    assert "must be finite" in summary["refused"][0]["reason"]
    assert summary["status"] == "completed" and summary["rounds_completed"] == 1
    assert all(c["rounds_joined"] == [1] and c["within_budget"] for c in summary["clients"])


@pytest.mark.parametrize("strategy", ["weiavg", "pfa"])
def test_a_dominant_declared_budget_is_refused_but_the_papers_spread_is_not(run_config_factory, strategy):
    """ε-weighting gives a site ε_i/Σε of a round: ε = 1e300 would take it all. The cap is relative
    to the median, so PFA's own spread (public ε = 10 beside private ε = 0.1) passes."""
    cfg = run_config_factory(strategy=strategy, num_server_rounds=1, budget_distribution="constant",
                             epsilon=5.0, noise_multiplier=0.0)
    nodes = ([_site(0, n=4, epsilon=10.0)] + [_site(i, n=4, epsilon=0.1 + 0.01 * i) for i in (1, 2)]
             + [_site(3, n=4, epsilon=1e300)])
    summary, sent = _run(cfg, nodes)
    assert [r["client_id"] for r in summary["refused"]] == ["site-3"], summary["refused"]
    assert "max-epsilon-ratio=1000" in summary["refused"][0]["reason"]
    assert summary["status"] == "completed" and summary["rounds_completed"] == 1
    assert sorted(c["client_id"] for c in summary["clients"] if c["rounds_joined"] == [1]) == \
        ["site-0", "site-1", "site-2"]
    assert len(sent[FIRST_NODE_ID + 3]) == 1  # asked once (the handshake), never scheduled


def test_the_dominance_cap_is_the_operators_to_lift(run_config_factory):
    cfg = run_config_factory(strategy="weiavg", num_server_rounds=1, budget_distribution="constant",
                             epsilon=5.0, max_epsilon_ratio=0.0)
    summary, _ = _run(cfg, [_site(i, epsilon=1.0) for i in range(2)] + [_site(2, epsilon=1e6)])
    assert not summary["refused"] and summary["rounds_completed"] == 1


def test_a_round_below_its_minimum_fails_visibly(run_config_factory, tmp_path):
    cfg = run_config_factory(num_server_rounds=2, min_accepted_clients=2, budget_distribution="constant",
                             epsilon=50.0, noise_multiplier=1.0)

    def only_one_replies_in_round_2(node, request, reply):  # noqa: ANN001
        is_train = request.metadata.message_type == MessageType.TRAIN
        if is_train and int(request.content[keys.CONFIG][keys.SERVER_ROUND]) == 2 and node != FIRST_NODE_ID:
            return Message(Error(code=4003, reason="internal: disk full"), reply_to=request)
        return reply

    with pytest.raises(RuntimeError, match="incomplete: 1 of 2 rounds failed"):  # Flower marks the run failed
        _run(cfg, simulation_node_configs(3), hook=only_one_replies_in_round_2)
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert [f["round"] for f in summary["failed_rounds"]] == [2]
    assert "fewer than the minimum of 2" in summary["failed_rounds"][0]["reason"]
    assert summary["status"].startswith("incomplete: 1 of 2 rounds failed"), summary["status"]
    rounds = [json.loads(line) for line in (tmp_path / "results" / "rounds.jsonl").read_text().splitlines()]
    assert rounds[-1]["accuracy"] == rounds[-2]["accuracy"], "the failed round left the model unchanged"
    report = (tmp_path / "results" / "privacy_report.md").read_text()
    assert "Run status: incomplete" in report and "## Failed rounds" in report
    # what the one client that did reply spent in round 2 is still on record
    first = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert first["rounds_joined"] == [1, 2]


def _ledger_cfg(run_config_factory, tmp_path) -> tuple[dict, dict]:
    cfg = run_config_factory(budget_distribution="constant", epsilon=50.0, noise_multiplier=1.0)
    node = {"partition-id": 0, "num-partitions": 3, "epsilon": 50.0, "ledger-path": str(tmp_path / "l.json")}
    return cfg, node


def test_a_stale_train_message_is_refused_before_anything_is_spent(run_config_factory, tmp_path):
    cfg, node = _ledger_cfg(run_config_factory, tmp_path)
    msg = _message(cfg, _global_arrays(cfg))
    msg.metadata.ttl = 60.0
    msg.metadata.created_at = time.time() - 61.0  # the node was stopped for longer than a round
    reply = client_module.app(msg, _context(cfg, node))
    assert reply.has_error() and reply.error.reason.startswith(keys.STALE_MESSAGE), reply.error.reason
    assert not (tmp_path / "l.json").exists()
    fresh = client_module.app(_message(cfg, _global_arrays(cfg)), _context(cfg, node))
    assert not fresh.has_error()
    assert len(PrivacyLedger.load(tmp_path / "l.json").history) == 1


def test_a_message_that_expires_during_training_is_discarded_uncharged(run_config_factory, tmp_path, monkeypatch):
    cfg, node = _ledger_cfg(run_config_factory, tmp_path)
    msg = _message(cfg, _global_arrays(cfg))
    msg.metadata.ttl = 30.0
    msg.metadata.created_at = time.time()
    import client.work as work_module

    def stopped_mid_training(train):  # noqa: ANN001, ANN202
        def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            out = train(*args, **kwargs)
            msg.metadata.created_at -= 31.0  # as if SIGSTOPped for 31 s before the charge
            return out
        return wrapped

    for name in ("train", "train_dpsgd"):  # whichever the round's mechanism runs
        monkeypatch.setattr(work_module.ModelWork, name, stopped_mid_training(getattr(work_module.ModelWork, name)))
    reply = client_module.app(msg, _context(cfg, node))
    assert reply.has_error() and reply.error.reason.startswith(keys.STALE_MESSAGE)
    ledger = tmp_path / "l.json"
    assert not ledger.exists() or PrivacyLedger.load(ledger).history == []
