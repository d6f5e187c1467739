"""An interrupted run's summary never understates a client's ledger (issue 40, item 2).

The real ServerApp logic and the real ClientApp run on the in-process grid, with durable
ledgers (``ledger-dir``). A reply hook interrupts the run in the middle of a round, after some
clients have trained and charged their ledgers but before the server read their replies (as
Ctrl-C does while replies are in flight). The summary's ``epsilon_spent`` is then what the server
knows for sure and ``epsilon_spent_at_most`` bounds the ledger from above; both are compared with
the ledger files on disk, which the server never reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Message, MessageType

from client.app import app as client_app
from privacy.ledger import PrivacyLedger
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys
from server.app import run_experiment


def interrupt_in_round(stop_round: int, after_replies: int):
    """A reply hook that raises KeyboardInterrupt in ``stop_round`` once ``after_replies`` clients
    of that round have trained: their ledgers are charged, their replies never reach the server."""
    seen = {"n": 0}

    def hook(node: int, request: Message, reply: Message) -> Message | None:
        if request.metadata.message_type != MessageType.TRAIN:
            return reply
        if int(request.content[keys.CONFIG][keys.SERVER_ROUND]) == stop_round:
            seen["n"] += 1
            if seen["n"] >= after_replies:
                raise KeyboardInterrupt
        return reply
    return hook


def run_interrupted(cfg: dict, stop_round: int, after_replies: int, run_id: int = 1) -> dict:
    grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg, run_id=run_id,
                         reply_hook=interrupt_in_round(stop_round, after_replies))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(grid, cfg, run_id=run_id)
    return json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())


def ledgers(folder: Path) -> dict[str, float]:
    """ε spent by each client's ledger file, by client id (simulated ids are partition ids)."""
    return {p.stem.removeprefix("client-"): PrivacyLedger.load(p).spent() for p in folder.glob("client-*.json")}


def check_bounds(summary: dict, on_disk: dict[str, float]) -> list[str]:
    """Every client's known spend <= its ledger <= its bound; the clients whose ledger the server
    did not know (known < ledger)."""
    unknown = []
    for c in summary["clients"]:
        ledger = on_disk[c["client_id"]]
        known, at_most = c["epsilon_spent"], c["epsilon_spent_at_most"]
        assert known <= ledger * (1 + 1e-9), c
        assert ledger <= at_most, (c["client_id"], ledger, at_most)  # never understated
        assert at_most <= c["epsilon_budget"] * (1 + 1e-9)
        if ledger > known * (1 + 1e-9):
            unknown.append(c["client_id"])
            assert c["possibly_charged_rounds"], c  # the report says which rounds may have cost it
    return unknown


def test_an_interrupt_mid_round_bounds_every_ledger_from_both_sides(run_config_factory, tmp_path):
    cfg = run_config_factory(num_server_rounds=3, ledger_dir=str(tmp_path / "ledgers"))
    summary = run_interrupted(cfg, stop_round=2, after_replies=2)
    assert summary["status"].startswith("interrupted")
    assert summary["rounds_completed"] == 1
    unknown = check_bounds(summary, ledgers(tmp_path / "ledgers"))
    # the two clients that trained in round 2 charged their ledgers; the server never saw it
    assert len(unknown) == 2
    for c in summary["clients"]:
        if c["client_id"] in unknown:
            assert c["possibly_charged_rounds"] == [2]
    report = (Path(cfg["out-dir"]) / "privacy_report.md").read_text()
    assert "possibly charged" in report and "at most" in report


def test_a_reused_ledger_and_a_fixed_sigma_are_bounded_too(run_config_factory, tmp_path):
    folder = tmp_path / "ledgers"
    first = run_config_factory(num_server_rounds=1, ledger_dir=str(folder), out_dir=str(tmp_path / "r1"),
                               budget_distribution="constant", epsilon=20.0, noise_multiplier=1.5)
    run_experiment(InProcessGrid(client_app, simulation_node_configs(3), first), first, run_id=1)
    before = ledgers(folder)
    assert all(v > 0 for v in before.values())
    second = run_config_factory(num_server_rounds=3, ledger_dir=str(folder), out_dir=str(tmp_path / "r2"),
                                budget_distribution="constant", epsilon=20.0, noise_multiplier=1.5)
    summary = run_interrupted(second, stop_round=3, after_replies=1, run_id=2)
    for c in summary["clients"]:
        assert c["epsilon_spent_before_run"] == pytest.approx(before[c["client_id"]])
    assert len(check_bounds(summary, ledgers(folder))) == 1


def test_an_interrupt_before_any_reply_falls_back_to_the_runs_cap(run_config_factory, tmp_path):
    # calibrated sigma, and no accepted reply yet: the server cannot know sigma, only the run's cap
    cfg = run_config_factory(num_server_rounds=2, ledger_dir=str(tmp_path / "ledgers"), run_epsilon=1.5,
                             budget_distribution="constant", epsilon=8.0)
    summary = run_interrupted(cfg, stop_round=1, after_replies=3)
    assert summary["rounds_completed"] == 0
    check_bounds(summary, ledgers(tmp_path / "ledgers"))
    for c in summary["clients"]:
        assert c["epsilon_spent"] == 0.0 and c["possibly_charged_rounds"] == [1]
        assert c["epsilon_spent_at_most"] == pytest.approx(1.5, rel=1e-6)  # the run's cap, not the budget


def test_a_completed_run_claims_nothing_beyond_what_it_knows(run_config_factory):
    cfg = run_config_factory(num_server_rounds=1)
    summary = run_experiment(InProcessGrid(client_app, simulation_node_configs(3), cfg), cfg, run_id=1)
    for c in summary["clients"]:
        assert c["possibly_charged_rounds"] == [] and c["epsilon_spent_at_most"] == c["epsilon_spent"]
