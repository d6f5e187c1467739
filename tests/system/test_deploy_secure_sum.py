"""Secure rounds over gRPC: one SuperLink (TLS + SuperNode authentication) per module, SuperNodes per test.

The secure-sum stages (with the roster's signatures and the consistency round) travel as real
Flower messages between separate processes; the runs complete, every round's sum is released
with all its inputs, and every site's ε is the charge it made.

What is shared: the two gRPC tests use one SuperLink process (the module-scoped ``secure_link``
fixture: certificates, ten SuperNode keys and ``flower-superlink`` started once, stopped by its
finalizer). Each test registers its own keys (the secure-sum test keys 0-3, the GDPFed+ test keys
4-9, so either may run first or alone), starts its own SuperNodes, and on the way out (``finally``)
stops them and unregisters their node ids. Nothing else is shared: each test has its own roster,
SuperNode homes, results directory and run. Under pytest-xdist the two tests may land on different
workers; each worker then starts its own SuperLink on ports ``free_port`` picked for it.

Why a stale node can never serve the next test's run (Flower 1.39, flwr/server/superlink/linkstate/
in_memory_linkstate.py, the SuperLink's default state): a ServerApp sees ``get_nodes``, which keeps only
``NodeStatus.ONLINE`` nodes (line 613); ``delete_node`` (``flwr supernode unregister``) marks a node
``UNREGISTERED`` and ends its ``online_until`` now (lines 539-556); an unregistered node's heartbeat is
refused (line 946) and its key no longer maps to a node id (``get_node_id_by_public_key``, line 652),
so the authenticating interceptor rejects its requests. Stopping alone would not do: a SuperNode that
dies without deactivating stays online for ``HEARTBEAT_PATIENCE`` × 30 s. A key, once registered, cannot
be registered again on the same SuperLink (line 517, "Public key already in use"), hence a key range
per test.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_support import FAST, SecureDeployment, generate_certs, read_rounds

pytestmark = pytest.mark.slow

SITES = 4
RUN = {**FAST, "strategy": "udp-fedavg", "num-clients": SITES, "min-train-clients": SITES,
       "noise-multiplier": 4.0, "noise-shares": SITES, "secure-aggregation": "secagg+",
       "secagg.min-survivors": 3, "round-timeout": 300.0}

GDPFED_BUDGETS = [0.6, 0.8, 1.6, 2.0, 3.5, 5.0]  # two sites per group of gdpfed.group-epsilons (0.5, 1.5, 3)

#: the SuperNode keys each gRPC test registers on the shared SuperLink (disjoint: a key registers once)
KEYS = {"secure-sum": range(0, SITES), "gdpfed": range(SITES, SITES + len(GDPFED_BUDGETS))}


@dataclass
class SharedLink:
    """The module's SuperLink, its SuperNode keys, and what the tests run on it so far."""

    dep: SecureDeployment
    keys: Path
    retired: list[int] = field(default_factory=list)  # node ids earlier tests registered and unregistered
    runs: list[int] = field(default_factory=list)  # run ids submitted to it, in order


@pytest.fixture(scope="module")
def secure_link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedLink]:
    """One SuperLink with TLS and ``--enable-supernode-auth`` for the module's gRPC tests."""
    root = tmp_path_factory.mktemp("secure-link")
    certs, keys = generate_certs(root / "deploy", max(k.stop for k in KEYS.values()))
    dep = SecureDeployment(root / "procs", certs)
    try:
        dep.start_superlink(auth=True)
        yield SharedLink(dep, keys)
    finally:
        dep.stop_all()


@contextmanager
def supernodes(link: SharedLink, test: str, node_configs: list[dict[str, Any]]) -> Iterator[list[int]]:
    """Register ``test``'s keys, start one SuperNode per node config, wait until all are online, and
    yield their node ids; afterwards stop them and unregister the ones that came online."""
    dep = link.dep
    assert dep.procs["superlink"].poll() is None, f"the shared SuperLink has exited\n{dep.logs()}"
    names: list[str] = []
    node_ids: list[int] = []
    try:
        for i, (k, config) in enumerate(zip(KEYS[test], node_configs, strict=True)):
            node_ids.append(dep.register(link.keys / f"supernode-{k}.pub"))
            dep.start_supernode(f"{test}-{i}", config, key=link.keys / f"supernode-{k}")
            names.append(f"{test}-{i}")
        dep.wait_online(node_ids)
        status = dep.nodes()
        # what a run on this SuperLink can be given now: this test's nodes, none of an earlier test's
        assert {n for n, s in status.items() if s == "online"} == set(node_ids), status
        assert all(status[n] == "unregistered" for n in link.retired), (link.retired, status)
        yield node_ids
    finally:
        for name in names:
            dep.stop(name)
        status = dep.nodes()
        # Flower's delete_node fails on a node that never came online (online_until is None); such a
        # node is not ONLINE, and so never offered to a run, and its key is this test's alone
        gone = [n for n in node_ids if status.get(n) in ("online", "offline")]
        for n in gone:
            dep.unregister(n)
        link.retired += gone


def _roster(tmp_path: Path, sites: int) -> tuple[Path, list[dict[str, str]]]:
    """The operator's roster (every site's signing key beside it) and each site's identity node-config."""
    from protocol.roster import generate

    roster = generate([f"site-{i}" for i in range(sites)], tmp_path / "roster")
    return roster, [{"roster": str(roster), "signing-key": str(tmp_path / "roster" / "keys" / f"site-{i}.pem")}
                    for i in range(sites)]


def _run(link: SharedLink, run_config: dict[str, Any], node_ids: list[int]) -> dict[str, Any]:
    """Run the app on the shared SuperLink; its summary, after checking that it finished, that its
    clients were exactly ``node_ids``, and that the SuperLink still lists the earlier tests' runs."""
    dep = link.dep
    run_id = dep.submit(run_config)
    link.runs.append(run_id)
    status = dep.wait_run(run_id, timeout=600)
    assert status["status"] == "finished:completed", dep.logs()
    summary = json.loads((Path(run_config["out-dir"]) / "summary.json").read_text())
    assert sorted(c["node_id"] for c in summary["clients"]) == sorted(node_ids), summary["clients"]
    listed = json.loads(dep.flwr("ls", "secure", "--format", "json").stdout)["runs"]
    assert sorted(int(r["run-id"]) for r in listed) == sorted(link.runs), listed  # one SuperLink served them all
    return summary


def test_secure_sum_over_grpc_with_tls_and_node_authentication(tmp_path, secure_link):
    from privacy.accountants import DEFAULT_ACCOUNTANT, epsilon_of
    from privacy.secure_sum import charged_multiplier

    roster, identities = _roster(tmp_path, SITES)
    configs = [{"partition-id": i, "num-partitions": SITES, "client-id": f"site-{i}", "epsilon": 40.0,
                "delta": 1e-5, **identities[i]} for i in range(SITES)]
    with supernodes(secure_link, "secure-sum", configs) as node_ids:
        out = tmp_path / "results"
        summary = _run(secure_link, {**RUN, "out-dir": str(out), "roster": str(roster)}, node_ids)
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


def test_gdpfed_plus_with_secure_group_sums_over_grpc(tmp_path, secure_link):
    """Sites declare budgets in three groups; every round is one secure sum per group over
    gRPC, released with all r_m members, and every site stays within its own budget."""
    n = len(GDPFED_BUDGETS)
    roster, identities = _roster(tmp_path, n)
    configs = [{"partition-id": i, "num-partitions": n, "client-id": f"site-{i}", "epsilon": eps, "delta": 1e-5,
                **identities[i]} for i, eps in enumerate(GDPFED_BUDGETS)]
    with supernodes(secure_link, "gdpfed", configs) as node_ids:
        out = tmp_path / "results"
        run = {**FAST, "strategy": "gdpfed-plus", "num-clients": n, "min-train-clients": n, "gdpfed.q": 1.0,
               "max-examples-per-client": 32, "batch-size": 8, "secure-aggregation": "secagg+",
               "budget-distribution": "groups",  # checked at start like a simulation; sites declare their own
               "num-server-rounds": 1, "round-timeout": 300.0, "out-dir": str(out), "roster": str(roster)}
        summary = _run(secure_link, run, node_ids)
    plan = summary["group_dp"]["plan"]
    assert summary["group_dp"]["aggregation"].startswith("secure aggregation")
    rows = [r for r in read_rounds(out) if r.get("round", 0) > 0]
    assert len(rows) == 1
    for row in rows:
        assert [s["survivors"] for s in row["secure_sums"]] == plan["counts"] == [2, 2, 2], row
        assert all(s["released"] for s in row["secure_sums"]), row
    for c in summary["clients"]:
        assert c["within_budget"] and 0 < c["epsilon_spent"] <= c["epsilon_budget"], c
