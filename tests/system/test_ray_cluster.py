"""``privet run`` on an existing Ray cluster of two "machines" (docs/ray-cluster.md).

    privet-<id>-head:   10.78.0.1  Ray head (GCS on :6379, 1 CPU) + ``RAY_ADDRESS=10.78.0.1:6379 privet run``
    privet-<id>-worker: 10.78.0.2  Ray worker node (1 CPU) that joined the head

The two network namespaces are joined by one veth pair; every address exists only inside
them. The worker node (in a mount namespace of its own) sees the folder of the driver's
TMPDIR empty, so it cannot see the run's FLWR_HOME, where Flower installed the app; the
rest of the file system is shared, so the venv (in which privet is installed) and the
dataset are at the same paths on both, as docs/ray-cluster.md requires of real machines.

Checks: the run completes (exit 0, summary.json "completed"), the cluster has two alive
nodes before and after the run, and ClientApp actors (``ray::ClientAppActor``) ran inside
both namespaces, i.e. on both nodes; the worker's actors ran without seeing the app folder
that the driver put on their PYTHONPATH.

Ray is stopped by pid (every process inside the two namespaces), never with ``ray stop``:
that kills Ray processes by name on the whole host, namespaces or not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.deploy_support import Network, netns_unavailable, ns_prefix, port_open
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


def _actors(net: Network, ns: str) -> dict[int, bool]:
    """Flower's ClientApp actors (Ray worker processes titled ``ray::ClientAppActor``) in
    ``ns``: pid -> whether the app folder that the driver put first on their PYTHONPATH (the
    app installed in the run's FLWR_HOME) exists in their view of the file system."""
    found = {}
    for pid in net.pids(ns):
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ClientAppActor"):
                continue
            env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
        except OSError:
            continue
        apps = [d for d in env.get(b"PYTHONPATH", b"").decode().split(os.pathsep) if "privet-flwr-home-" in d]
        assert apps, f"actor {pid}: no app folder of the run on PYTHONPATH: {env.get(b'PYTHONPATH')!r}"
        found[pid] = os.path.isdir(f"/proc/{pid}/root{apps[0]}")
    return found


def _tail(path: Path, n: int = 3000) -> str:
    return f"--- {path.name}\n{path.read_text(errors='replace')[-n:]}" if path.exists() else ""


def test_privet_run_joins_a_ray_cluster_of_two_namespaces(tmp_path):
    reason = netns_unavailable("unshare", "mount")
    if reason:
        pytest.skip(reason)
    if shutil.which("ray", path=str(BIN)) is None:
        pytest.skip(f"no `ray` command in {BIN}")
    net = Network()
    procs: list[subprocess.Popen] = []
    # the head's Ray temp dir and the driver's TMPDIR (privet's FLWR_HOME, with the app
    # installed in it) are in here, which the worker sees empty; short: Ray's unix
    # sockets live under it (108 bytes at most in their paths)
    ray_tmp = Path(tempfile.mkdtemp(prefix="prc-", dir="/tmp"))
    (ray_tmp / "driver").mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        head_ns, worker_ns = net.pair(("head", HEAD_ADDR), ("worker", WORKER_ADDR))
        started = time.monotonic()
        procs.append(_ray_node(head_ns, ["--head", f"--node-ip-address={HEAD_ADDR}", f"--port={GCS_PORT}",
                                         "--include-dashboard=false", f"--temp-dir={ray_tmp / 'h'}"],
                               logs / "ray-head.log"))
        deadline = time.monotonic() + 120
        while not port_open(HEAD_ADDR, GCS_PORT, worker_ns):  # reached from the worker's machine
            assert procs[0].poll() is None and time.monotonic() < deadline, _tail(logs / "ray-head.log")
            time.sleep(1.0)
        procs.append(_ray_node(worker_ns, [f"--address={RAY_ADDRESS}", f"--node-ip-address={WORKER_ADDR}",
                                           f"--temp-dir={ray_tmp / 'w'}"], logs / "ray-worker.log", hide=ray_tmp))
        deadline = time.monotonic() + 180
        while len(nodes := _alive_nodes(head_ns)) < 2:
            assert procs[1].poll() is None and time.monotonic() < deadline, _tail(logs / "ray-worker.log")
            time.sleep(2.0)
        assert sorted(n["ip"] for n in nodes) == [HEAD_ADDR, WORKER_ADDR] and all(n["cpus"] == 1 for n in nodes)
        cluster_up = time.monotonic() - started

        # ---- the run, from the head's machine, joining the cluster through RAY_ADDRESS
        out = tmp_path / "results"
        sets = {"num-clients": 2, "num-server-rounds": 1, "model": "logreg", "max-examples-per-client": 200,
                "batch-size": 32, "learning-rate": 0.1, "momentum": 0.0, "min-train-clients": 2}
        cmd = [*ns_prefix(head_ns), sys.executable, "-m", "privet.cli", "run", "--out", str(out)]
        for key, value in sets.items():
            cmd += ["--set", f"{key}={json.dumps(value)}"]
        run_log = logs / "privet-run.log"
        run_started = time.monotonic()
        env = {**_env(), "RAY_ADDRESS": RAY_ADDRESS, "TMPDIR": str(ray_tmp / "driver")}
        with run_log.open("w") as log:
            run = subprocess.Popen(cmd, cwd=APP_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        procs.append(run)
        actors: dict[str, dict[int, bool]] = {head_ns: {}, worker_ns: {}}
        deadline = time.monotonic() + 900
        while run.poll() is None:
            assert time.monotonic() < deadline, _tail(run_log)
            for ns in actors:
                actors[ns].update(_actors(net, ns))
            time.sleep(0.5)
        run_time = time.monotonic() - run_started
        text = run_log.read_text(errors="replace")
        assert run.returncode == 0, text[-5000:] + _tail(logs / "ray-head.log") + _tail(logs / "ray-worker.log")
        assert f"joins the Ray cluster at RAY_ADDRESS={RAY_ADDRESS}" in text
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds_completed"] == 1, summary
        assert len(summary["clients"]) == 2

        # ---- both machines did the clients' work; the cluster is still whole
        assert actors[head_ns] and actors[worker_ns], f"ClientApp actors per namespace: {actors}\n{text[-3000:]}"
        # the head's actors saw the app installed in the run's FLWR_HOME; the worker's could
        # not, and imported it from the Python environment of their node (docs/ray-cluster.md)
        assert all(actors[head_ns].values()) and not any(actors[worker_ns].values()), actors
        assert len(_alive_nodes(head_ns)) == 2
        print(f"ray cluster: 2 nodes up in {cluster_up:.0f}s; privet run (2 clients, 1 round) {run_time:.0f}s; "
              f"ClientApp actors (pid: sees the app folder): head {actors[head_ns]}, worker {actors[worker_ns]}")
    finally:
        for proc in reversed(procs):
            stop(proc)
        net.kill_all()
        net.down()
        shutil.rmtree(ray_tmp, ignore_errors=True)
