"""``privet run`` on an existing Ray cluster of two "machines" (docs/ray-cluster.md).

    privet-<id>-head:   10.78.0.1  Ray head (GCS on :6379, 1 CPU) + ``RAY_ADDRESS=10.78.0.1:6379 privet run``
    privet-<id>-worker: 10.78.0.2  Ray worker node (1 CPU) that joined the head

The cluster (namespaces, the worker's private ``ray_tmp``, shared venv, dataset and
``ledger-dir``) is built by ``tests/ray_netns.py``.

One cluster serves the module's tests, in order:

1. a ``ledger-dir`` that only the head sees (inside ``ray_tmp``) is refused before anything
   starts, in one line naming the key and the worker's address: clients served on both nodes
   would otherwise keep two ledgers each (issue #41);
2. a run with a ``ledger-dir`` both nodes see: ClientApp actors (``ray::ClientAppActor``) run in
   both namespaces (the worker's without seeing the app folder the driver put on their
   PYTHONPATH); then the worker machine is lost after round 1 (SIGKILL of its raylet, then of
   every other process in its namespace: a raylet killed alone leaves its actors serving for a
   while, until they notice, which makes the round of the loss a matter of timing). The messages lost
   with the worker's actor are drops (not rejections), the dead actor leaves Flower's pool so
   the next round trains every client on the head, the round that lost clients fails
   (``min-accepted-clients`` = every client), and the run ends ``incomplete`` with exit status 2.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import pytest

from privacy.ledger import PrivacyLedger
from tests.deploy_support import netns_unavailable, read_rounds
from tests.flower_processes import BIN
from tests.ray_netns import RAY_ADDRESS, WORKER_ADDR, RayNetnsCluster, ray_cluster

pytestmark = pytest.mark.slow

#: A small run: logreg, 100 examples per client, one CPU per client (privet run's default).
SMALL = {"model": "logreg", "max-examples-per-client": 100, "batch-size": 32, "learning-rate": 0.1,
         "momentum": 0.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[RayNetnsCluster]:
    reason = netns_unavailable("unshare", "mount")
    if reason:
        pytest.skip(reason)
    if shutil.which("ray", path=str(BIN)) is None:
        pytest.skip(f"no `ray` command in {BIN}")
    started = time.monotonic()
    with ray_cluster(tmp_path_factory.mktemp("ray-logs")) as c:  # 1 CPU on each node
        print(f"ray cluster: 2 nodes up in {time.monotonic() - started:.0f}s")
        yield c


def test_a_ledger_dir_only_one_node_sees_is_refused(cluster, tmp_path):
    """A folder on the head's disk only: each client would keep one ledger per node that served it."""
    ledgers = cluster.ray_tmp / "ledgers"  # the worker sees an empty tmpfs at ray_tmp
    out = tmp_path / "results"
    sets = {**SMALL, "num-clients": 2, "num-server-rounds": 1, "min-train-clients": 2, "ledger-dir": str(ledgers)}
    started = time.monotonic()
    run, log = cluster.start_run(sets, out, "privet-run-node-local-ledgers")
    assert run.wait(timeout=600) == 2, log.read_text(errors="replace")[-5000:] + cluster.tails()
    errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("privet: error:")]
    assert len(errors) == 1, log.read_text(errors="replace")[-5000:]
    assert "ledger-dir" in errors[0] and WORKER_ADDR in errors[0] and str(ledgers) in errors[0], errors[0]
    assert not out.exists(), "a refused run writes no results"
    assert not list(ledgers.glob("client-*.json")), "no client ran"
    print(f"node-local ledger-dir refused in {time.monotonic() - started:.1f}s: {errors[0]}")


def test_a_lost_node_is_a_drop_and_the_run_goes_on_without_it(cluster, tmp_path):
    ledgers = tmp_path / "ledgers"  # outside ray_tmp: the same storage on both nodes
    out = tmp_path / "results"
    clients, rounds = 4, 3
    sets = {**SMALL, "num-clients": clients, "num-server-rounds": rounds, "min-train-clients": clients,
            "min-accepted-clients": clients, "ledger-dir": str(ledgers)}
    started = time.monotonic()
    run, log = cluster.start_run(sets, out, "privet-run-node-loss")
    actors: dict[str, dict[int, bool]] = {cluster.head_ns: {}, cluster.worker_ns: {}}
    killed_after = None
    deadline = time.monotonic() + 900
    while run.poll() is None:
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-5000:]
        if killed_after is None:
            done = [r["round"] for r in read_rounds(out) if r["round"] >= 1]
            if done:  # round 1 is over: the worker machine goes away (at once: listing actors takes seconds)
                cluster.crash(cluster.worker_ns)
                killed_after = done[-1]
            else:
                for ns in actors:
                    actors[ns].update(cluster.actors(ns))
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    text = log.read_text(errors="replace")
    assert f"joins the Ray cluster at RAY_ADDRESS={RAY_ADDRESS}" in text
    assert killed_after == 1, f"the worker was to be killed after round 1, not {killed_after}\n{text[-5000:]}"

    # ---- before the loss, both machines did the clients' work
    assert actors[cluster.head_ns] and actors[cluster.worker_ns], f"ClientApp actors per namespace: {actors}"
    # the head's actors saw the app installed in the run's FLWR_HOME; the worker's could
    # not, and imported it from the Python environment of their node (docs/ray-cluster.md)
    assert all(actors[cluster.head_ns].values()) and not any(actors[cluster.worker_ns].values()), actors

    # ---- the loss: drops in the first round that sends work to the dead node's actor (round 2, or
    # round 3 where round 2's work on the worker was done before the crash took effect), none
    # rejected for it; every other round trains every client (after the loss, on the head)
    rows = {r["round"]: r for r in read_rounds(out) if r["round"] >= 1}
    assert sorted(rows) == [1, 2, 3], rows
    assert len(rows[1]["accepted"]) == clients and not rows[1]["dropped"] and not rows[1]["rejected"], rows[1]
    (lost,) = [r for r in (2, 3) if rows[r]["dropped"]]
    assert not rows[lost]["rejected"] and len(rows[lost]["accepted"]) + len(rows[lost]["dropped"]) == clients, rows
    for r in {2, 3} - {lost}:
        assert len(rows[r]["accepted"]) == clients and not rows[r]["dropped"] and not rows[r]["rejected"], rows[r]

    # ---- visible: summary, report, console, exit status
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"].startswith(f"incomplete: 1 of 3 rounds failed (rounds {lost})"), summary["status"]
    assert summary["dropped"] == sorted(rows[lost]["dropped"]), summary["dropped"]
    assert run.returncode == 2, text[-5000:]
    assert f"privet: error: the run is incomplete: 1 of 3 rounds failed (rounds {lost})" in text, text[-5000:]
    assert f"round {lost}: client" in text and "dropped out" in text, text[-5000:]
    report = (out / "privacy_report.md").read_text()
    assert f"Clients that dropped out of at least one round: {', '.join(summary['dropped'])}." in report

    # ---- every client's ledger (one file each, on storage both nodes see) holds what the server
    # knows it spent, and at most what the rounds it may have been charged in add to that
    for c in summary["clients"]:
        spent = PrivacyLedger.from_json((ledgers / f"client-{c['client_id']}.json").read_text()).spent()
        assert c["epsilon_spent"] - 1e-9 <= spent <= c.get("epsilon_spent_at_most", c["epsilon_spent"]) + 1e-9, c
        assert c["within_budget"], c
    print(f"node loss: run of {rounds} rounds x {clients} clients in {elapsed:.0f}s; actors (pid: sees the app "
          f"folder): head {actors[cluster.head_ns]}, worker {actors[cluster.worker_ns]}; round {lost} dropped "
          f"{rows[lost]['dropped']}")
