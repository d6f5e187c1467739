"""Faults in a real deployment (loopback, TLS + SuperNode authentication).

One SuperLink and three authenticated SuperNodes, each with a durable ledger file:

1. run 1 (3 rounds): ``site-2``'s SuperNode is killed after round 1. The run finishes with
   the two others, and summary.json / privacy_report.md say that ``site-2`` dropped.
2. ``site-2``'s SuperNode is restarted (same key, same ledger file) and a second run
   starts: every client's ``epsilon_spent_before_run`` is what its ledger held after run 1,
   and ``site-0``, whose budget (5.7) fits 3 rounds but not a 4th, refuses to train.

Also checks that the logs say which client did what in each round (the ServerApp's log,
kept by the SuperLink and read with ``flwr log``; the SuperNodes' stdout), without ever
printing data or model parameters.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.deploy_support import FAST, SecureDeployment, generate_certs, read_rounds

pytestmark = pytest.mark.slow

# σ = 1 fixed, q = 32/256, 8 steps per round: the default ledger (PRV, replace-one) reads
# ε = 3.84, 5.15, 6.24, 7.22 after 1..4 rounds (δ = 1e-5). 6.7 therefore allows exactly 3 rounds
# (test_three_round_budget below recomputes these figures, so a change of accountant shows here).
# No short round-timeout is needed for the dead node: Flower 1.39's SuperLink answers a
# message to a node that stopped heartbeating with a NODE_UNAVAILABLE error reply (after
# 2 x the 30 s heartbeat interval), which ends the wait; the timeout only bounds a stuck run.
BUDGETS = {"site-0": 6.7, "site-1": 50.0, "site-2": 50.0}
RUN = {**FAST, "num-clients": 3, "min-train-clients": 2, "noise-multiplier": 1.0,
       "grad-sample-mode": "hooks", "round-timeout": 300.0}


def test_three_round_budget():
    """site-0's budget fits exactly three of this module's rounds under the default accountant."""
    from privacy.accountants import DEFAULT_ACCOUNTANT, epsilon_of

    step = (RUN["noise-multiplier"], RUN["batch-size"] / RUN["max-examples-per-client"], 8)
    spent = [epsilon_of([(step[0], step[1], step[2] * r)], 1e-5, DEFAULT_ACCOUNTANT) for r in (3, 4)]
    assert spent[0] <= BUDGETS["site-0"] < spent[1]


def test_killed_supernode_drops_and_restarted_ledger_continues(tmp_path):
    certs, keys = generate_certs(tmp_path / "deploy", 3)
    dep = SecureDeployment(tmp_path / "procs", certs)
    ledgers = {cid: tmp_path / "ledgers" / f"{cid}.json" for cid in BUDGETS}
    (tmp_path / "ledgers").mkdir()

    def node_config(i: int) -> dict:
        cid = f"site-{i}"
        return {"partition-id": i, "num-partitions": 3, "client-id": cid, "epsilon": BUDGETS[cid],
                "delta": 1e-5, "ledger-path": str(ledgers[cid])}

    try:
        dep.start_superlink(auth=True, database=tmp_path / "superlink.db")
        node_ids = [dep.register(keys / f"supernode-{i}.pub") for i in range(3)]
        for i in range(3):
            dep.start_supernode(f"supernode-{i}", node_config(i), key=keys / f"supernode-{i}")
        dep.wait_online(node_ids)

        # ---- run 1: kill site-2 once round 1 is aggregated
        out1 = tmp_path / "results-1"
        run1 = dep.submit({**RUN, "num-server-rounds": 3, "out-dir": str(out1)})
        deadline = time.monotonic() + 300
        while not any(r.get("round") == 1 for r in read_rounds(out1)):
            assert time.monotonic() < deadline, dep.logs()
            assert dep.run_status(run1)["status"] != "finished:failed", dep.logs()
            time.sleep(1.0)
        dep.stop("supernode-2")
        killed_at = time.monotonic()
        status = dep.wait_run(run1, timeout=600)
        assert status["status"] == "finished:completed", dep.logs()
        summary = json.loads((out1 / "summary.json").read_text())
        by_id = {c["client_id"]: c for c in summary["clients"]}
        assert summary["rounds_completed"] == 3
        assert summary["dropped"] == ["site-2"], summary
        assert by_id["site-2"]["rounds_joined"] == [1]
        assert 2 in by_id["site-2"]["dropped_rounds"]
        assert by_id["site-0"]["rounds_joined"] == [1, 2, 3]
        assert by_id["site-1"]["rounds_joined"] == [1, 2, 3]
        assert all(c["within_budget"] for c in summary["clients"])
        report = (out1 / "privacy_report.md").read_text()
        assert "dropped out of at least one round: site-2" in report
        print(f"run 1 finished {time.monotonic() - killed_at:.0f}s after the kill")

        spent_after_1 = {cid: json.loads(path.read_text()) for cid, path in ledgers.items()}
        ledger_eps = {cid: by_id[cid]["epsilon_spent"] for cid in BUDGETS}
        assert 6.0 < ledger_eps["site-0"] < 6.7 and 3.5 < ledger_eps["site-2"] < 4.0, ledger_eps

        # ---- restart site-2 (same key, same ledger), run 2
        dep.start_supernode("supernode-2", node_config(2), key=keys / "supernode-2")
        dep.wait_online(node_ids)
        out2 = tmp_path / "results-2"
        run2 = dep.submit({**RUN, "num-server-rounds": 2, "out-dir": str(out2)})
        status = dep.wait_run(run2, timeout=600)
        assert status["status"] == "finished:completed", dep.logs()
        summary2 = json.loads((out2 / "summary.json").read_text())
        by_id2 = {c["client_id"]: c for c in summary2["clients"]}
        for cid in BUDGETS:
            assert by_id2[cid]["epsilon_spent_before_run"] == pytest.approx(ledger_eps[cid], rel=1e-9), cid
        # site-2 continued from its ledger: 1 round before, 2 now -> the 3-round value
        assert by_id2["site-2"]["rounds_joined"] == [1, 2]
        assert by_id2["site-2"]["epsilon_spent"] == pytest.approx(by_id["site-0"]["epsilon_spent"], rel=1e-6)
        # site-0 has spent its budget: it refuses (or the server no longer schedules it)
        s0 = by_id2["site-0"]
        assert s0["rounds_joined"] == [] and s0["exhausted"], s0
        assert s0["epsilon_spent"] == pytest.approx(ledger_eps["site-0"]) and s0["within_budget"]
        assert any(r["reason"].startswith("budget-exhausted") for r in s0["rejections"]), s0
        assert json.loads(ledgers["site-0"].read_text()) == spent_after_1["site-0"], "no new spending"
        assert summary2["final_accuracy"] > 0.3

        # ---- operations: who did what, per round, and nothing else. Flower 1.39 keeps the
        # ServerApp's output in the SuperLink (`flwr log <run-id>`); ClientApp output goes to
        # the SuperNode's own stdout.
        server_log = "".join(dep.flwr("log", str(r), "secure", "--show", timeout=60).stdout for r in (run1, run2))
        link_log = server_log + dep.log("superlink")
        node_logs = "".join(dep.log(f"supernode-{i}") for i in range(3))
        sampled = re.search(r"round 1: sampled clients \[([^\]]*)\] of 3 connected", link_log)
        assert sampled, server_log[-3000:]
        assert sorted(x.strip(" '") for x in sampled.group(1).split(",")) == ["site-0", "site-1", "site-2"]
        assert "handshake: client site-0" in link_log
        assert "client site-2 dropped out" in link_log
        assert "budget-exhausted" in link_log
        assert "client site-1 round 1 mode=dpsgd" in node_logs, node_logs[-3000:]
        assert "eps_spent=" in node_logs
        for forbidden in ("tensor(", "array([", "state_dict"):
            assert forbidden not in link_log + node_logs, forbidden
    finally:
        dep.stop_all()
