"""The coordinator dies: SIGKILL of the SuperLink (and its ServerApp) mid-run, then a restart
on the same ``--database`` (real processes on loopback).

What is defined (docs/deployment.md, runbook): the run in flight does not resume; Flower marks
it ``finished:failed``; its ``rounds.jsonl`` keeps every round aggregated before the crash.
The SuperNodes reconnect by themselves. No site is ever charged less than what reached the
server, and a re-submitted run continues from every site's ledger (including a charge for a
round whose reply was lost with the coordinator), every total within its budget.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from privacy.ledger import PrivacyLedger
from tests.deploy_support import FAST, read_rounds
from tests.flower_processes import BIN, LocalDeployment

pytestmark = pytest.mark.slow

BUDGETS = {0: 20.0, 1: 30.0, 2: 50.0}
RUN = {**FAST, "num-clients": 3, "min-train-clients": 2, "noise-multiplier": 1.0, "round-timeout": 120.0,
       "budget-distribution": "constant", "epsilon": 50.0}


def test_a_killed_superlink_restarts_and_a_resubmitted_run_continues_every_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    dep = LocalDeployment(tmp_path)
    database = tmp_path / "superlink.db"
    ledgers = {i: tmp_path / f"site-{i}.json" for i in BUDGETS}
    try:
        link = dep.start_superlink(database=database)
        for i, eps in BUDGETS.items():
            dep.start_supernode(f"supernode-{i}", {"partition-id": i, "num-partitions": 3, "client-id": f"site-{i}",
                                                   "epsilon": eps, "ledger-path": str(ledgers[i])})
        out1 = tmp_path / "results-1"
        run1 = dep.submit({**RUN, "num-server-rounds": 4, "out-dir": str(out1)})
        deadline = time.monotonic() + 300
        while not any(r.get("round") == 1 for r in read_rounds(out1)):
            assert time.monotonic() < deadline, dep.logs()
            time.sleep(0.5)
        os.killpg(link.pid, signal.SIGKILL)  # the coordinator's machine dies: SuperLink and ServerApp
        link.wait(timeout=10)
        dep.start_superlink(name="superlink-restarted", database=database)

        status = dep.wait_run(run1, timeout=300)
        assert status["status"] == "finished:failed", status
        seen = read_rounds(out1)
        assert seen and seen[-1]["round"] < 4, "the run in flight did not resume"
        last_seen = {cid: eps for r in seen for cid, eps in (r.get("epsilon_spent") or {}).items()}

        out2 = tmp_path / "results-2"
        status = dep.run_app({**RUN, "num-server-rounds": 2, "out-dir": str(out2)}, timeout=600)
        assert status["status"] == "finished:completed", dep.logs()
        summary = json.loads((out2 / "summary.json").read_text())
        by_id = {c["client_id"]: c for c in summary["clients"]}
        assert set(by_id) == {"site-0", "site-1", "site-2"}, "every SuperNode reconnected by itself"
        for cid, c in by_id.items():
            # never charged less than what reached the server; more where a ClientApp that was
            # training when the coordinator died charged a reply that was then lost
            assert c["epsilon_spent_before_run"] >= last_seen.get(cid, 0.0) * (1 - 1e-9), (cid, last_seen)
            assert c["rounds_joined"] == [1, 2] and c["within_budget"]
            assert c["epsilon_spent"] <= c["epsilon_budget"]
            ledger = PrivacyLedger.load(ledgers[int(cid[-1])])
            assert ledger.spent() == pytest.approx(c["epsilon_spent"], rel=1e-9)
    finally:
        dep.stop_all()
