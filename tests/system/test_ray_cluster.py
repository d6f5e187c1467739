"""``privet run`` on an existing Ray cluster of two "machines" (docs/ray-cluster.md).

    privet-<id>-head:   10.78.0.1  Ray head (GCS on :6379, 1 CPU) + ``RAY_ADDRESS=10.78.0.1:6379 privet run``
    privet-<id>-worker: 10.78.0.2  Ray worker node (1 CPU) that joined the head

The two network namespaces are joined by one veth pair; every address exists only inside
them. The worker node (in a mount namespace of its own) sees the folder ``ray_tmp`` empty (a
tmpfs of its own): the driver's TMPDIR, so the run's FLWR_HOME where Flower installed the app,
and any folder put there, exist on the head's machine only. The rest of the file system is
shared, so the venv (in which privet is installed), the dataset and a ``ledger-dir`` outside
``ray_tmp`` are the same storage at the same paths on both, as docs/ray-cluster.md requires of
real machines.

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

Ray is stopped by pid (every process inside the two namespaces), never with ``ray stop``:
that kills Ray processes by name on the whole host, namespaces or not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from privacy.ledger import PrivacyLedger
from tests.deploy_support import Network, netns_unavailable, ns_prefix, port_open, read_rounds
from tests.flower_processes import APP_DIR, BIN, stop

pytestmark = pytest.mark.slow

SUBNET = "10.78.0"
HEAD_ADDR, WORKER_ADDR = f"{SUBNET}.1", f"{SUBNET}.2"
GCS_PORT = 6379
RAY_ADDRESS = f"{HEAD_ADDR}:{GCS_PORT}"
NODES_PROBE = (
    "import json, ray\n"
    f"ray.init(address={RAY_ADDRESS!r}, logging_level='ERROR', log_to_driver=False)\n"
    "print(json.dumps([{'ip': n['NodeManagerAddress'], 'alive': n['Alive'], 'cpus': n['Resources'].get('CPU', 0)}"
    " for n in ray.nodes()]))\n"
)
#: A small run: logreg, 100 examples per client, one CPU per client (privet run's default).
SMALL = {"model": "logreg", "max-examples-per-client": 100, "batch-size": 32, "learning-rate": 0.1,
         "momentum": 0.0}


def _env() -> dict[str, str]:
    """What the Ray nodes and the run get: one thread per process (two busy cores here), no
    RAY_ADDRESS inherited from the caller, no usage stats."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    return env


def _ray_node(ns: str, args: list[str], log: Path, hide: Path | None = None) -> subprocess.Popen:
    """``ray start ARGS --block`` inside ``ns``, in its own session (stopped by pid).

    ``hide``: a folder that the node sees empty (its own mount namespace, an empty tmpfs
    mounted there), as if it were on another machine.
    """
    cmd = [*ns_prefix(ns), str(BIN / "ray"), "start", *args, "--num-cpus=1", "--disable-usage-stats",
           "--object-store-memory=100000000", "--block"]
    if hide is not None:
        cmd[len(ns_prefix(ns)):len(ns_prefix(ns))] = [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o size=512m privet-node-tmp {hide} && exec "$@"', "sh"]
    with log.open("w") as out:
        return subprocess.Popen(cmd, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _alive_nodes(ns: str) -> list[dict]:
    """The cluster's alive nodes, as a driver in ``ns`` sees them (``ray.nodes()``)."""
    out = subprocess.run([*ns_prefix(ns), sys.executable, "-c", NODES_PROBE], env=_env(), capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return [n for n in json.loads(out.stdout.strip().splitlines()[-1]) if n["alive"]]


def _tail(path: Path, n: int = 3000) -> str:
    return f"--- {path.name}\n{path.read_text(errors='replace')[-n:]}" if path.exists() else ""


@dataclass
class Cluster:
    """The two-namespace Ray cluster and where its pieces are."""

    net: Network
    head_ns: str
    worker_ns: str
    ray_tmp: Path  # seen by the head only (the worker sees an empty tmpfs there)
    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def actors(self, ns: str) -> dict[int, bool]:
        """Flower's ClientApp actors (Ray worker processes titled ``ray::ClientAppActor``) in
        ``ns``: pid -> whether the app folder that the driver put first on their PYTHONPATH (the
        app installed in the run's FLWR_HOME) exists in their view of the file system."""
        found = {}
        for pid in self.net.pids(ns):
            try:
                if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ClientAppActor"):
                    continue
                env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                           if b"=" in e)
            except OSError:
                continue
            apps = [d for d in env.get(b"PYTHONPATH", b"").decode().split(os.pathsep) if "privet-flwr-home-" in d]
            assert apps, f"actor {pid}: no app folder of the run on PYTHONPATH: {env.get(b'PYTHONPATH')!r}"
            found[pid] = os.path.isdir(f"/proc/{pid}/root{apps[0]}")
        return found

    def raylet(self, ns: str) -> int:
        """The pid of the raylet (Ray's per-node scheduler) of the node in ``ns``."""
        for pid in self.net.pids(ns):
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if argv0.endswith(b"/raylet"):
                return pid
        raise AssertionError(f"no raylet in {ns}")

    def crash(self, ns: str) -> None:
        """The machine ``ns`` goes away: SIGKILL its raylet, then every other process in it (its
        ClientApp actors among them), as a power cut would."""
        os.kill(self.raylet(ns), signal.SIGKILL)
        for pid in self.net.pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue

    def start_run(self, sets: dict, out: Path, name: str) -> tuple[subprocess.Popen, Path]:
        """``RAY_ADDRESS=<head> python -m privet.cli run --out OUT --set ...`` in the head's namespace."""
        cmd = [*ns_prefix(self.head_ns), sys.executable, "-m", "privet.cli", "run", "--out", str(out)]
        for key, value in sets.items():
            cmd += ["--set", f"{key}={json.dumps(value)}"]
        log_path = self.logs / f"{name}.log"
        env = {**_env(), "RAY_ADDRESS": RAY_ADDRESS, "TMPDIR": str(self.ray_tmp / "driver")}
        with log_path.open("w") as log:
            run = subprocess.Popen(cmd, cwd=APP_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.procs.append(run)
        return run, log_path

    def tails(self) -> str:
        return _tail(self.logs / "ray-head.log") + _tail(self.logs / "ray-worker.log")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    reason = netns_unavailable("unshare", "mount")
    if reason:
        pytest.skip(reason)
    if shutil.which("ray", path=str(BIN)) is None:
        pytest.skip(f"no `ray` command in {BIN}")
    net = Network()
    # the head's Ray temp dir and the driver's TMPDIR (privet's FLWR_HOME, with the app
    # installed in it) are in here, which the worker sees empty; short: Ray's unix
    # sockets live under it (108 bytes at most in their paths)
    ray_tmp = Path(tempfile.mkdtemp(prefix="prc-", dir="/tmp"))
    (ray_tmp / "driver").mkdir()
    logs = tmp_path_factory.mktemp("ray-logs")
    c = Cluster(net=net, head_ns="", worker_ns="", ray_tmp=ray_tmp, logs=logs)
    try:
        c.head_ns, c.worker_ns = net.pair(("head", HEAD_ADDR), ("worker", WORKER_ADDR))
        started = time.monotonic()
        c.procs.append(_ray_node(c.head_ns, ["--head", f"--node-ip-address={HEAD_ADDR}", f"--port={GCS_PORT}",
                                             "--include-dashboard=false", f"--temp-dir={ray_tmp / 'h'}"],
                                 logs / "ray-head.log"))
        deadline = time.monotonic() + 120
        while not port_open(HEAD_ADDR, GCS_PORT, c.worker_ns):  # reached from the worker's machine
            assert c.procs[0].poll() is None and time.monotonic() < deadline, _tail(logs / "ray-head.log")
            time.sleep(1.0)
        c.procs.append(_ray_node(c.worker_ns, [f"--address={RAY_ADDRESS}", f"--node-ip-address={WORKER_ADDR}",
                                               f"--temp-dir={ray_tmp / 'w'}"], logs / "ray-worker.log",
                                 hide=ray_tmp))
        deadline = time.monotonic() + 180
        while len(nodes := _alive_nodes(c.head_ns)) < 2:
            assert c.procs[1].poll() is None and time.monotonic() < deadline, _tail(logs / "ray-worker.log")
            time.sleep(2.0)
        assert sorted(n["ip"] for n in nodes) == [HEAD_ADDR, WORKER_ADDR] and all(n["cpus"] == 1 for n in nodes)
        print(f"ray cluster: 2 nodes up in {time.monotonic() - started:.0f}s")
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)
        net.kill_all()
        net.down()
        shutil.rmtree(ray_tmp, ignore_errors=True)


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
            for ns in actors:
                actors[ns].update(cluster.actors(ns))
            done = [r["round"] for r in read_rounds(out) if r["round"] >= 1]
            if done:  # round 1 is over: the worker machine goes away
                cluster.crash(cluster.worker_ns)
                killed_after = done[-1]
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

    # ---- the loss: drops in round 2, none rejected for it; round 3 trains everyone on the head
    rows = {r["round"]: r for r in read_rounds(out) if r["round"] >= 1}
    assert sorted(rows) == [1, 2, 3], rows
    assert len(rows[1]["accepted"]) == clients and not rows[1]["dropped"] and not rows[1]["rejected"], rows[1]
    assert rows[2]["dropped"] and not rows[2]["rejected"], rows[2]
    assert len(rows[2]["accepted"]) + len(rows[2]["dropped"]) == clients, rows[2]
    assert len(rows[3]["accepted"]) == clients and not rows[3]["dropped"] and not rows[3]["rejected"], rows[3]

    # ---- visible: summary, report, console, exit status
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"].startswith("incomplete: 1 of 3 rounds failed (rounds 2)"), summary["status"]
    assert summary["dropped"] == sorted(rows[2]["dropped"]), summary["dropped"]
    assert run.returncode == 2, text[-5000:]
    assert "privet: error: the run is incomplete: 1 of 3 rounds failed (rounds 2)" in text, text[-5000:]
    assert "round 2: client" in text and "dropped out" in text, text[-5000:]
    report = (out / "privacy_report.md").read_text()
    assert f"Clients that dropped out of at least one round: {', '.join(summary['dropped'])}." in report

    # ---- every client's ledger (one file each, on storage both nodes see) holds what the server
    # knows it spent, and at most what the rounds it may have been charged in add to that
    for c in summary["clients"]:
        spent = PrivacyLedger.from_json((ledgers / f"client-{c['client_id']}.json").read_text()).spent()
        assert c["epsilon_spent"] - 1e-9 <= spent <= c.get("epsilon_spent_at_most", c["epsilon_spent"]) + 1e-9, c
        assert c["within_budget"], c
    print(f"node loss: run of {rounds} rounds x {clients} clients in {elapsed:.0f}s; actors (pid: sees the app "
          f"folder): head {actors[cluster.head_ns]}, worker {actors[cluster.worker_ns]}; round 2 dropped "
          f"{rows[2]['dropped']}")
