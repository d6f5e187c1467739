"""A site that hangs instead of dying (real SuperLink and SuperNodes on loopback).

``site-2``'s SuperNode and its ClientApp are stopped with SIGSTOP once round 1 is aggregated
and resumed with SIGCONT after the run ended. The run must finish with the two others after
``round-timeout``, report ``site-2`` as dropped in round 2, and the resumed site must not
train or charge anything for the round it missed: its ledger holds round 1 only.
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

ROUND_TIMEOUT = 40.0


def test_a_stopped_site_is_dropped_and_its_late_work_is_never_charged(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    dep = LocalDeployment(tmp_path)
    ledgers = {i: tmp_path / f"site-{i}.json" for i in range(3)}
    try:
        dep.start_superlink()
        procs = {i: dep.start_supernode(f"supernode-{i}", {
            "partition-id": i, "num-partitions": 3, "client-id": f"site-{i}", "epsilon": 50.0,
            "ledger-path": str(ledgers[i])}) for i in range(3)}
        out = tmp_path / "results"
        run_id = dep.submit({**FAST, "num-clients": 3, "min-train-clients": 2, "num-server-rounds": 2,
                             "noise-multiplier": 1.0, "round-timeout": ROUND_TIMEOUT, "out-dir": str(out),
                             "budget-distribution": "constant", "epsilon": 50.0})
        deadline = time.monotonic() + 300
        while not any(r.get("round") == 1 for r in read_rounds(out)):
            assert time.monotonic() < deadline, dep.logs()
            time.sleep(0.5)
        os.killpg(procs[2].pid, signal.SIGSTOP)  # the SuperNode and any ClientApp it runs
        stopped = time.monotonic()
        try:
            status = dep.wait_run(run_id, timeout=600)
        finally:
            os.killpg(procs[2].pid, signal.SIGCONT)
        assert status["status"] == "finished:completed", dep.logs()
        assert time.monotonic() - stopped >= ROUND_TIMEOUT * 0.9, "round 2 waited for the hung site"
        summary = json.loads((out / "summary.json").read_text())
        by_id = {c["client_id"]: c for c in summary["clients"]}
        assert summary["rounds_completed"] == 2 and not summary["failed_rounds"], summary
        assert by_id["site-2"]["rounds_joined"] == [1] and by_id["site-2"]["dropped_rounds"] == [2]
        assert by_id["site-0"]["rounds_joined"] == [1, 2] and by_id["site-1"]["rounds_joined"] == [1, 2]

        time.sleep(20.0)  # the resumed node pulls whatever is left for it, and must not act on it
        hung = PrivacyLedger.load(ledgers[2])
        assert set(hung.rounds) == {1}, hung.rounds
        assert hung.spent() == pytest.approx(by_id["site-2"]["epsilon_spent"], rel=1e-9)
    finally:
        dep.stop_all()
