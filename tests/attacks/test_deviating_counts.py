"""A server that lies about counts or names cannot make a client release more than it charged (issue 34).

Attack 5: GDPFed's clients pre-charge their group's run (σ_m, q_m, T); a server that declares T = 1
and runs four rounds got four releases for the price of one. Attack 8: a node that declares
another site's ``client-id`` took the name at the handshake. Both against the real ClientApp and
the real strategies, with the attacker rewriting what the ServerApp sends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Message

from client.app import app as client_app
from client.ledger_store import STATE_KEY
from privacy.ledger import PrivacyLedger
from privet.inprocess import FIRST_NODE_ID, simulation_node_configs
from protocol import keys
from protocol.roster import generate
from server.app import run_experiment
from tests.attacks.deviating_server import DeviatingGrid, Loot


def _dp_accounting_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """ε of a history under replace-one with Google's dp_accounting (PLD), independent of privet's accountant."""
    import dp_accounting
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import pld_privacy_accountant

    acct = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    for sigma, q, steps in history:
        event = dp_accounting.GaussianDpEvent(sigma)
        acct.compose(dp_accounting.SelfComposedDpEvent(
            event if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, event), steps))
    return float(acct.get_epsilon(delta))


def _run(cfg: dict[str, Any], tamper: Any, node_configs: list[dict[str, Any]] | None = None) -> tuple[Any, Any]:
    grid = DeviatingGrid(client_app, node_configs or simulation_node_configs(int(cfg["num-clients"])), cfg,
                         tamper=tamper, loot=Loot())
    try:
        run_experiment(grid, cfg, run_id=1)
    except RuntimeError:  # rounds failed: the attack was refused
        pass
    return json.loads((Path(cfg["out-dir"]) / "summary.json").read_text()), grid


def test_a_gdpfed_run_longer_than_the_t_it_declared_is_refused_beyond_t(run_config_factory):
    """Every client of a 4-round run told T = 1 releases once, is charged once, and refuses rounds 2-4."""
    cfg = run_config_factory(strategy="dp-fedavg", num_clients=4, num_server_rounds=4, min_train_clients=4,
                             budget_distribution="constant", epsilon=8.0, max_examples_per_client=32, batch_size=8,
                             **{"gdpfed.q": 1.0, "gdpfed.group-epsilons": "8"})

    def declare_one_round(node: int, msg: Message) -> Message | None:
        if msg.metadata.message_type == "train" and keys.CONFIG in msg.content.config_records:
            record = dict(msg.content.config_records[keys.CONFIG])
            record[keys.NUM_ROUNDS] = 1  # the charge the client pays for the whole run
            msg.content.config_records[keys.CONFIG] = ConfigRecord(record)
        return msg

    summary, grid = _run(cfg, declare_one_round)
    for context in grid.contexts.values():
        ledger = PrivacyLedger.from_json(str(context.state[STATE_KEY]["json"]))
        assert ledger.releases_in_run(1) == 1 and len(ledger.history) == 1  # one release, one charge
        sigma, q, steps = ledger.history[0]
        assert (q, steps) == (1.0, 1)
        # the ledger's ε is an upper bound on what the releases it made cost, and tight
        independent = _dp_accounting_epsilon(ledger.history, ledger.delta)
        assert ledger.spent() == __import__("pytest").approx(independent, rel=1e-5)
    for client in summary["clients"]:
        late = [r for r in client["rejections"] if r["round"] > 1]  # asked again in round 2: refused
        assert [r["round"] for r in late] == [2] and late[0]["reason"].startswith(keys.BUDGET_EXHAUSTED)
        assert all("charged for T=1" in r["reason"] for r in late)


def test_a_changed_group_mechanism_mid_run_is_refused(run_config_factory):
    """A server that lowers σ_m after the run's pre-charge gets a refusal, not a free release."""
    cfg = run_config_factory(strategy="dp-fedavg", num_clients=4, num_server_rounds=2, min_train_clients=4,
                             budget_distribution="constant", epsilon=8.0, max_examples_per_client=32, batch_size=8,
                             **{"gdpfed.q": 1.0, "gdpfed.group-epsilons": "8"})

    def weaker_noise_later(node: int, msg: Message) -> Message | None:
        record = msg.content.config_records.get(keys.CONFIG)
        if msg.metadata.message_type == "train" and record is not None and record.get(keys.SERVER_ROUND) == 2:
            changed = dict(record)
            changed[keys.NOISE_MULTIPLIER] = float(changed[keys.NOISE_MULTIPLIER]) / 2
            msg.content.config_records[keys.CONFIG] = ConfigRecord(changed)
        return msg

    summary, grid = _run(cfg, weaker_noise_later)
    for client in summary["clients"]:
        assert [r["round"] for r in client["rejections"]] == [2]
        assert "paid for" in client["rejections"][0]["reason"]
    for context in grid.contexts.values():
        assert PrivacyLedger.from_json(str(context.state[STATE_KEY]["json"])).releases_in_run(1) == 1


def test_a_node_cannot_take_another_sites_name_when_names_are_bound_to_keys(run_config_factory, tmp_path):
    """Attack 8: a node without site-0's key declares client-id site-0 and answers first; with the roster it
    is refused (listed, with the reason) and the real site-0 is registered, its row its own."""
    roster = generate(["site-0", "site-1"], tmp_path / "roster")
    keys_dir = tmp_path / "roster" / "keys"
    nodes = [
        {"partition-id": 2, "num-partitions": 3, "epsilon": 5.0, "client-id": "site-0"},  # the impostor: no key
        {"partition-id": 0, "num-partitions": 3, "epsilon": 5.0, "client-id": "site-0", "roster": str(roster),
         "signing-key": str(keys_dir / "site-0.pem")},
        {"partition-id": 1, "num-partitions": 3, "epsilon": 5.0, "client-id": "site-1", "roster": str(roster),
         "signing-key": str(keys_dir / "site-1.pem")},
    ]
    cfg = run_config_factory(num_clients=3, num_server_rounds=1, min_train_clients=1, budget_distribution="constant",
                             epsilon=5.0, noise_multiplier=1.0, roster=str(roster))

    def as_is(node: int, msg: Message) -> Message | None:
        return msg

    summary, _ = _run(cfg, as_is, nodes)
    refused = [(r["client_id"], r["reason"]) for r in summary["refused"]]
    registered = {c["client_id"]: c["node_id"] for c in summary["clients"]}
    assert registered == {"site-0": FIRST_NODE_ID + 1, "site-1": FIRST_NODE_ID + 2}
    assert refused == [("site-0", refused[0][1])] and "not bound to this node's key" in refused[0][1]
    assert all(c["epsilon_spent"] > 0 for c in summary["clients"])  # the real sites trained under their names
