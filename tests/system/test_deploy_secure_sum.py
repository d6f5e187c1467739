"""A secure round over gRPC: SuperLink (TLS + SuperNode authentication) and four SuperNodes.

The secure-sum stages (with the roster's signatures and the consistency round) travel as real
Flower messages between separate processes; the run completes, every round's sum is released
with all four inputs, and every site's ε is the charge for σ·√(r_min/m).
"""

from __future__ import annotations

import json
import math

import pytest

from tests.deploy_support import FAST, SecureDeployment, generate_certs, read_rounds

pytestmark = pytest.mark.slow

SITES = 4
RUN = {**FAST, "strategy": "udp-fedavg", "num-clients": SITES, "min-train-clients": SITES,
       "noise-multiplier": 4.0, "noise-shares": SITES, "secure-aggregation": "secagg+",
       "secagg.min-survivors": 3, "round-timeout": 300.0}


def _roster(tmp_path, sites: int):
    """The operator's roster (every site's signing key beside it) and each site's identity node-config."""
    from protocol.roster import generate

    roster = generate([f"site-{i}" for i in range(sites)], tmp_path / "roster")
    return roster, [{"roster": str(roster), "signing-key": str(tmp_path / "roster" / "keys" / f"site-{i}.pem")}
                    for i in range(sites)]


def test_secure_sum_over_grpc_with_tls_and_node_authentication(tmp_path):
    from privacy.accountants import DEFAULT_ACCOUNTANT, epsilon_of
    from privacy.secure_sum import charged_multiplier

    certs, keys = generate_certs(tmp_path / "deploy", SITES)
    roster, identities = _roster(tmp_path, SITES)
    dep = SecureDeployment(tmp_path / "procs", certs)
    try:
        dep.start_superlink(auth=True)
        node_ids = [dep.register(keys / f"supernode-{i}.pub") for i in range(SITES)]
        for i in range(SITES):
            dep.start_supernode(f"supernode-{i}", {"partition-id": i, "num-partitions": SITES,
                                                   "client-id": f"site-{i}", "epsilon": 40.0, "delta": 1e-5,
                                                   **identities[i]}, key=keys / f"supernode-{i}")
        dep.wait_online(node_ids)
        out = tmp_path / "results"
        status = dep.run_app({**RUN, "out-dir": str(out), "roster": str(roster)}, timeout=600)
        assert status["status"] == "finished:completed", dep.logs()
        summary = json.loads((out / "summary.json").read_text())
        rows = [r for r in read_rounds(out) if r.get("round", 0) > 0]
        assert len(rows) == RUN["num-server-rounds"]
        for row in rows:
            (s,) = row["secure_sums"]
            assert s["released"] and s["survivors"] == SITES, row
        sigma = charged_multiplier(RUN["noise-multiplier"], SITES, 3)
        expected = epsilon_of([(sigma, 1.0, RUN["num-server-rounds"])], 1e-5, DEFAULT_ACCOUNTANT)
        for c in summary["clients"]:
            assert c["epsilon_spent"] == pytest.approx(expected, rel=1e-6), c
            assert "secure sum (SecAgg+) of at least 3" in c["guarantee"] and "even one that deviates" in c["guarantee"]
        assert summary["secure_aggregation"]["threshold"] == 0.5 and summary["secure_aggregation"]["roster"]
        assert summary["threat_model"]["row"] == "deviates-with-clients"
        assert math.isfinite(summary["final_loss"])
    finally:
        dep.stop_all()


def test_secure_sum_on_flowers_ray_simulation(tmp_path, capsys):
    """The third run mode: ``privet run`` -> ``flwr run`` on Flower's Ray simulation, where
    every node keeps its SecAgg+ state in its own Context between the four stages."""
    from privet.cli import main

    sets = {**FAST, "strategy": "udp-fedavg", "num-clients": 3, "min-train-clients": 3, "noise-multiplier": 4.0,
            "noise-shares": 3, "secure-aggregation": "secagg+", "budget-distribution": "constant", "epsilon": 40.0}
    out = tmp_path / "sim"
    args = sum((["--set", f"{k}={json.dumps(v)}"] for k, v in sets.items()), [])
    assert main(["run", "--out", str(out), *args]) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and not summary["failed_rounds"]
    rows = [r for r in read_rounds(out) if r.get("round", 0) > 0]
    assert all(r["secure_sums"][0]["released"] and r["secure_sums"][0]["survivors"] == 3 for r in rows)
    assert summary["secure_aggregation"]["roster"]  # privet run made one for its simulated sites


GDPFED_BUDGETS = [0.6, 0.8, 1.6, 2.0, 3.5, 5.0]  # two sites per group of gdpfed.group-epsilons (0.5, 1.5, 3)


def test_gdpfed_plus_with_secure_group_sums_over_grpc(tmp_path):
    """Sites declare budgets in three groups; every round is one secure sum per group over
    gRPC, released with all r_m members, and every site stays within its own budget."""
    n = len(GDPFED_BUDGETS)
    certs, keys = generate_certs(tmp_path / "deploy", n)
    roster, identities = _roster(tmp_path, n)
    dep = SecureDeployment(tmp_path / "procs", certs)
    try:
        dep.start_superlink(auth=True)
        node_ids = [dep.register(keys / f"supernode-{i}.pub") for i in range(n)]
        for i, eps in enumerate(GDPFED_BUDGETS):
            dep.start_supernode(f"supernode-{i}", {"partition-id": i, "num-partitions": n, "client-id": f"site-{i}",
                                                   "epsilon": eps, "delta": 1e-5, **identities[i]},
                                key=keys / f"supernode-{i}")
        dep.wait_online(node_ids)
        out = tmp_path / "results"
        run = {**FAST, "strategy": "gdpfed-plus", "num-clients": n, "min-train-clients": n, "gdpfed.q": 1.0,
               "max-examples-per-client": 32, "batch-size": 8, "secure-aggregation": "secagg+",
               "budget-distribution": "groups",  # checked at start like a simulation; sites declare their own
               "num-server-rounds": 1, "round-timeout": 300.0, "out-dir": str(out), "roster": str(roster)}
        status = dep.run_app(run, timeout=600)
        assert status["status"] == "finished:completed", dep.logs()
        summary = json.loads((out / "summary.json").read_text())
        plan = summary["group_dp"]["plan"]
        assert summary["group_dp"]["aggregation"].startswith("secure aggregation")
        rows = [r for r in read_rounds(out) if r.get("round", 0) > 0]
        assert len(rows) == 1
        for row in rows:
            assert [s["survivors"] for s in row["secure_sums"]] == plan["counts"] == [2, 2, 2], row
            assert all(s["released"] for s in row["secure_sums"]), row
        for c in summary["clients"]:
            assert c["within_budget"] and 0 < c["epsilon_spent"] <= c["epsilon_budget"], c
    finally:
        dep.stop_all()
