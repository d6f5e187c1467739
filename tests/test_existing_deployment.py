"""examples/existing-deployment: privet on a plain Flower 1.39 federation that knows nothing
about it. The SuperLink and SuperNodes are started with stock ``flower-superlink`` /
``flower-supernode`` commands (as in the example's README; dependencies preinstalled, no
privet wrapper, SuperNodes with only the usual ``partition-id``/``num-partitions``), and
the operator submits the app with ``flwr run``. Budgets then come from the run config's
distribution, and each client's is the one the distribution assigns to its partition.
"""

from __future__ import annotations

import json
import os

import pytest

from client.profile import simulated_budget
from tests.deploy_support import FAST
from tests.flower_processes import BIN, LocalDeployment

pytestmark = pytest.mark.slow


def test_privet_runs_on_a_stock_flower_deployment(tmp_path, monkeypatch):
    # the SuperLink starts `flower-superexec` by name: the environment's bin must be on PATH
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    deployment = LocalDeployment(tmp_path)
    try:
        deployment.start_superlink()
        for i in range(2):
            deployment.start_supernode(f"supernode-{i}", {"partition-id": i, "num-partitions": 2})
        out = tmp_path / "results"
        run_config = {**FAST, "num-clients": 2, "min-train-clients": 2, "out-dir": str(out),
                      "budget-distribution": "uniform", "epsilon-min": 2.0, "epsilon-max": 8.0, "seed": 11}
        status = deployment.run_app(run_config)
        assert status["status"] == "finished:completed", deployment.logs()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds_completed"] == 2 and summary["final_accuracy"] > 0.2
        by_id = {c["client_id"]: c for c in summary["clients"]}
        assert set(by_id) == {"0", "1"}, "client ids default to the partition ids"
        from server.cli import app_defaults

        full = {**app_defaults(), **run_config}
        for i in range(2):
            c = by_id[str(i)]
            assert c["epsilon_budget"] == pytest.approx(simulated_budget(full, i, 2))
            assert 2.0 <= c["epsilon_budget"] <= 8.0
            assert 0 < c["epsilon_spent"] <= c["epsilon_budget"] and c["rounds_joined"] == [1, 2]
    finally:
        deployment.stop_all()
