"""A multi-machine deployment on one host: every Flower process in its own network
namespace ("machine"), joined by veth pairs to a bridge in a namespace of its own.

    privet-<id>-br:    bridge br0 (no address)
    privet-<id>-link:  10.77.0.1   SuperLink (TLS, --enable-supernode-auth) + the operator's flwr CLI
    privet-<id>-n<i>:  10.77.0.1x  SuperNode i (i = 0, 1, 2), its own key, budget and ledger
    privet-<id>-rogue: 10.77.0.99  a machine whose SuperNodes must be refused

All addresses exist only inside these namespaces; the Control API listens on 127.0.0.1 of
the SuperLink's machine only. Checks: a short experiment completes over the "network" with
TLS and authenticated SuperNodes (summary.json, privacy_report.md); a SuperNode with an
unregistered key is refused; a SuperNode without TLS cannot connect; rotating a SuperNode's
key (register new, restart with it, unregister old) works and the old key is then refused.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.deploy_support import (
    FAST,
    Network,
    SecureDeployment,
    generate_certs,
    netns_unavailable,
    port_open,
    wait_exit,
)

pytestmark = pytest.mark.slow

SUBNET = "10.77.0"
LINK_ADDR = f"{SUBNET}.1"
BUDGETS = [1.0, 2.5, 6.0]


def test_tls_authenticated_deployment_across_namespaces(tmp_path):
    reason = netns_unavailable("ssh-keygen", "openssl")
    if reason:
        pytest.skip(reason)
    net = Network()
    dep = None
    try:
        net.up()
        link_ns = net.host("link", LINK_ADDR)
        node_ns = [net.host(f"n{i}", f"{SUBNET}.1{i}") for i in range(3)]
        rogue_ns = net.host("rogue", f"{SUBNET}.99")
        certs, keys = generate_certs(tmp_path / "deploy", 5, LINK_ADDR)
        dep = SecureDeployment(tmp_path / "procs", certs, link_ns=link_ns, link_addr=LINK_ADDR)
        dep.start_superlink(auth=True, database=tmp_path / "superlink.db")
        started = time.monotonic()
        # the Fleet API is reachable across the bridge; the Control API is not
        assert port_open(LINK_ADDR, dep.fleet_port, node_ns[0])
        assert not port_open(LINK_ADDR, dep.control_port, node_ns[0])

        node_ids = [dep.register(keys / f"supernode-{i}.pub") for i in range(3)]
        assert set(dep.nodes()) == set(node_ids)
        configs = [{"partition-id": i, "num-partitions": 3, "client-id": f"site-{i}", "epsilon": eps,
                    "delta": 1e-5, "ledger-path": str(tmp_path / f"ledger-site-{i}.json")}
                   for i, eps in enumerate(BUDGETS)]
        for i in range(3):
            dep.start_supernode(f"supernode-{i}", configs[i], key=keys / f"supernode-{i}", ns=node_ns[i])
        dep.wait_online(node_ids)

        # ---- negative checks from the rogue machine
        rogue_cfg = {"partition-id": 0, "num-partitions": 3, "client-id": "rogue", "epsilon": 1.0}
        unregistered = dep.start_supernode("rogue-unregistered", rogue_cfg, key=keys / "supernode-3",
                                           ns=rogue_ns, max_retries=2)
        no_tls = dep.start_supernode("rogue-no-tls", rogue_cfg, key=keys / "supernode-3", tls=False,
                                     ns=rogue_ns, max_retries=2)

        # ---- the experiment
        out = tmp_path / "results"
        status = dep.run_app({**FAST, "num-clients": 3, "min-train-clients": 3, "out-dir": str(out)})
        elapsed = time.monotonic() - started
        assert status["status"] == "finished:completed", dep.logs()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds_completed"] == 2
        assert summary["final_accuracy"] > 0.2, summary  # 10 classes: chance is 0.1
        by_id = {c["client_id"]: c for c in summary["clients"]}
        assert set(by_id) == {"site-0", "site-1", "site-2"}, "the rogue nodes never joined"
        for i, eps in enumerate(BUDGETS):
            c = by_id[f"site-{i}"]
            assert c["epsilon_budget"] == eps and c["rounds_joined"] == [1, 2] and c["within_budget"]
            assert 0 < c["epsilon_spent"] <= eps
        report = (out / "privacy_report.md").read_text()
        assert "Clients over budget: none." in report
        for i in range(3):
            assert f"| site-{i} | {BUDGETS[i]:.4f} |" in report
        print(f"netns deployment: SuperLink start -> run finished in {elapsed:.0f}s")

        # the refused SuperNodes: unregistered key -> activation refused; no TLS -> no connection
        code = wait_exit(unregistered, 120)
        assert code not in (None, 0), dep.log("rogue-unregistered")[-2000:]
        assert "Failed to activate" in dep.log("rogue-unregistered") or "2004" in dep.log("rogue-unregistered")
        code = wait_exit(no_tls, 120)
        assert code not in (None, 0), dep.log("rogue-no-tls")[-2000:]
        assert "SuperNode ID" not in dep.log("rogue-no-tls")
        assert set(dep.nodes()) == set(node_ids), "no node was added by the rogue SuperNodes"

        # ---- key rotation of site-0: register the new key, restart with it, unregister the old
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                        str(keys / "supernode-0-rotated")], check=True)
        new_id = dep.register(keys / "supernode-0-rotated.pub")
        dep.stop("supernode-0")
        dep.start_supernode("supernode-0", configs[0], key=keys / "supernode-0-rotated", ns=node_ns[0])
        dep.unregister(node_ids[0])
        dep.wait_online([new_id, node_ids[1], node_ids[2]])
        assert dep.nodes()[node_ids[0]] == "unregistered"
        old_key = dep.start_supernode("old-key", configs[0], key=keys / "supernode-0", ns=node_ns[0],
                                      max_retries=2)
        assert wait_exit(old_key, 120) not in (None, 0), "the unregistered old key is refused"
        # the old key cannot come back either: Flower keeps it as used
        again = dep.flwr("supernode", "register", str(keys / "supernode-0.pub"), "secure")
        assert again.returncode != 0 and "already in use" in (again.stdout + again.stderr)
    finally:
        if dep is not None:
            dep.stop_all()
        net.down()
