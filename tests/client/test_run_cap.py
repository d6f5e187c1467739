"""A run's cap and calibrated noise survive a site's restart (issue 40, item 1).

A site restarted mid-run used to re-base ``run-epsilon`` on a ledger that already held the run's
rounds, and spent past the cap. The cap and σ now live in the ledger, keyed by run.
"""

from __future__ import annotations

from flwr.app import RecordDict

from client.app import app as client_app
from privacy.accountants import exceeds_budget
from privacy.ledger import PrivacyLedger
from privet.inprocess import InProcessGrid, simulation_node_configs
from server.app import run_experiment


def test_a_site_restarted_after_every_round_stays_within_the_runs_cap(run_config_factory, tmp_path):
    cap = 0.4
    cfg = run_config_factory(num_server_rounds=3, run_epsilon=cap, ledger_dir=str(tmp_path / "ledgers"))
    grids: list[InProcessGrid] = []

    def restart(node, request, reply):  # a new process for the node's next message: its state is gone
        if request.metadata.message_type == "train":
            grids[0].contexts[node].state = RecordDict()
        return reply

    grid = InProcessGrid(client_app, simulation_node_configs(3), cfg, reply_hook=restart)
    grids.append(grid)
    summary = run_experiment(grid, cfg, run_id=1)
    for client in summary["clients"]:
        assert client["rounds_joined"] == [1, 2, 3]
        ledger = PrivacyLedger.load(tmp_path / "ledgers" / f"client-{client['client_id']}.json")
        assert not exceeds_budget(ledger.spent(), cap) and ledger.spent() > 0.9 * cap
        plan = ledger.run(1)
        assert plan is not None and plan.cap == cap  # the cap, fixed at the run's first release


def test_the_cap_refuses_a_run_longer_than_it_declared(run_config_factory, tmp_path):
    """Calibrated for T = 2 under a cap, asked for a third round: refused, the cap holds."""
    from flwr.app import ConfigRecord

    from protocol import keys

    cap = 0.4
    cfg = run_config_factory(num_server_rounds=3, run_epsilon=cap, ledger_dir=str(tmp_path / "ledgers"))

    class TwoDeclared(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            for m in messages:
                if m.metadata.message_type == "train":
                    record = dict(m.content.config_records[keys.CONFIG])
                    record[keys.NUM_ROUNDS] = 2
                    m.content.config_records[keys.CONFIG] = ConfigRecord(record)
            return super().send_and_receive(messages, timeout=timeout)

    import json
    from pathlib import Path

    import pytest

    grid = TwoDeclared(client_app, simulation_node_configs(3), cfg)
    with pytest.raises(RuntimeError, match="incomplete"):  # round 3: every client refuses, visibly
        run_experiment(grid, cfg, run_id=1)
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    assert all([r["round"] for r in c["rejections"]] == [3] and "cap" in c["rejections"][0]["reason"]
               for c in summary["clients"])
    for i in range(3):
        ledger = PrivacyLedger.load(tmp_path / "ledgers" / f"client-{i}.json")
        assert ledger.releases_in_run(1) == 2 and not exceeds_budget(ledger.spent(), cap)
