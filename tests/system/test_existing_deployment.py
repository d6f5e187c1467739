"""examples/existing-deployment: privet on a plain Flower 1.39 federation that knows nothing
about it. The SuperLink and SuperNodes are started with stock ``flower-superlink`` /
``flower-supernode`` commands (as in the example's README; dependencies preinstalled, no
privet wrapper), and the operator submits the app with ``flwr run``. Each site's budget
comes from its own ``--node-config`` and nowhere else: a site that declares none, or a
malformed one, is refused at the handshake (named, with the key, in the run's summary and
report) and the run goes on with the others, although the run config names a budget
distribution.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.deploy_support import FAST
from tests.flower_processes import BIN, LocalDeployment

pytestmark = pytest.mark.slow


def test_privet_runs_on_a_stock_flower_deployment(tmp_path, monkeypatch):
    # the SuperLink starts `flower-superexec` by name: the environment's bin must be on PATH
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    deployment = LocalDeployment(tmp_path)
    try:
        deployment.start_superlink()
        budgets = [3.0, 6.0]
        for i, eps in enumerate(budgets):
            deployment.start_supernode(f"supernode-{i}", {"partition-id": i, "num-partitions": 2, "epsilon": eps})
        # two badly configured sites: no budget at all, and a budget that is not a number
        deployment.start_supernode("supernode-none", {"partition-id": 0, "num-partitions": 2, "client-id": "nobudget"})
        deployment.start_supernode("supernode-abc", {"partition-id": 1, "num-partitions": 2, "client-id": "abc",
                                                     "epsilon": "abc"})
        out = tmp_path / "results"
        run_config = {**FAST, "num-clients": 2, "min-train-clients": 2, "out-dir": str(out),
                      "budget-distribution": "uniform", "epsilon-min": 2.0, "epsilon-max": 8.0, "seed": 11}
        status = deployment.run_app(run_config)
        assert status["status"] == "finished:completed", deployment.logs()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds_completed"] == 2 and summary["final_accuracy"] > 0.2
        by_id = {c["client_id"]: c for c in summary["clients"]}
        assert set(by_id) == {"0", "1"}, "client ids default to the partition ids"
        for i, eps in enumerate(budgets):
            c = by_id[str(i)]
            assert c["epsilon_budget"] == eps, "the site's own budget, not the run config's distribution"
            assert 0 < c["epsilon_spent"] <= c["epsilon_budget"] and c["rounds_joined"] == [1, 2]
        refused = {r["reason"] for r in summary["refused"]}
        assert len(summary["refused"]) == 2, summary["refused"]
        assert any("declares no 'epsilon'" in r for r in refused), refused
        assert any("'epsilon' must be a number" in r and "'abc'" in r for r in refused), refused
        report = (out / "privacy_report.md").read_text()
        assert "Sites refused at the handshake" in report and "declares no 'epsilon'" in report
        nodes_log = "".join((deployment.root / f"{n}.log").read_text() for n in ("supernode-none", "supernode-abc"))
        assert "declares no 'epsilon'" in nodes_log and "must be a number" in nodes_log
    finally:
        deployment.stop_all()
