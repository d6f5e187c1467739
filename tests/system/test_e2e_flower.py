"""The two real Flower runtimes, end to end (marked slow; CI runs them).

(a) ``privet run`` -> ``flwr run`` on Flower's Ray simulation, checked with
    ``flwr ls --format json`` (the exit code of ``flwr run`` does not tell);
(c) a SuperLink and three SuperNodes as separate processes talking gRPC on loopback,
    each SuperNode with its own budget in ``--node-config``.
"""

from __future__ import annotations

import json

import pytest

from tests.flower_processes import LocalDeployment

pytestmark = pytest.mark.slow

FAST = {
    "num-server-rounds": 2,
    "max-examples-per-client": 512,
    "model": "logreg",
    "batch-size": 64,
    "learning-rate": 0.1,
    "momentum": 0.0,
}


def test_privet_run_on_flower_simulation(tmp_path, capsys):
    from privet.cli import main

    sets = [f"{k}={json.dumps(v)}" for k, v in {**FAST, "num-clients": 4}.items()]
    out = tmp_path / "sim"
    code = main(["run", "--out", str(out), *sum((["--set", s] for s in sets), [])])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert summary["final_accuracy"] > 0.3
    assert len(summary["clients"]) == 4
    for c in summary["clients"]:
        assert 0 < c["epsilon_spent"] <= c["epsilon_budget"]
    assert (out / "progress.png").stat().st_size > 0
    assert "Privacy report" in capsys.readouterr().out


def test_privet_run_rejects_a_bad_config_before_starting(capsys):
    from privet.cli import main

    assert main(["run", "--set", "strategy=fedsgd"]) == 2
    err = capsys.readouterr().err
    assert "'strategy'" in err and "fedavg-hdp" in err


def test_superlink_and_three_supernodes_over_grpc(tmp_path):
    budgets = [1.0, 2.5, 6.0]
    deployment = LocalDeployment(tmp_path)
    try:
        deployment.start_superlink()
        for i, eps in enumerate(budgets):
            deployment.start_supernode(f"supernode-{i}", {
                "partition-id": i, "num-partitions": 3, "client-id": f"site-{i}",
                "epsilon": eps, "delta": 1e-5, "ledger-path": str(tmp_path / f"ledger-{i}.json"),
            })
        out = tmp_path / "results"
        status = deployment.run_app({**FAST, "num-clients": 3, "min-train-clients": 3,
                                     "out-dir": str(out)})
        assert status["status"] == "finished:completed", deployment.logs()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds_completed"] == 2
        assert summary["final_accuracy"] > 0.3
        by_id = {c["client_id"]: c for c in summary["clients"]}
        assert set(by_id) == {"site-0", "site-1", "site-2"}
        for i, eps in enumerate(budgets):
            c = by_id[f"site-{i}"]
            assert c["epsilon_budget"] == eps and c["rounds_joined"] == [1, 2]
            assert 0 < c["epsilon_spent"] <= eps
            ledger = json.loads((tmp_path / f"ledger-{i}.json").read_text())
            assert ledger["history"], "the durable ledger was written"
    finally:
        deployment.stop_all()
