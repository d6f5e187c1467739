"""A Ray cluster of one or two "machines" built from network namespaces on this host.

Used by ``tests/system/test_ray_cluster.py`` (a lost node, a node-local ``ledger-dir``) and by
``benchmarks/bench_scale_two_node.py`` (the scale benchmark's two-node row)::

    privet-<id>-head:   10.78.0.1  Ray head (GCS on :6379) + ``RAY_ADDRESS=10.78.0.1:6379 privet run``
    privet-<id>-worker: 10.78.0.2  Ray worker node that joined the head (absent with ``worker_cpus=0``)

The two namespaces are joined by one veth pair; every address exists only inside them. The
worker node (in a mount namespace of its own) sees the folder ``ray_tmp`` empty (a tmpfs of its
own): the driver's TMPDIR, so the run's FLWR_HOME where Flower installed the app, and any folder
put there, exist on the head's machine only. The rest of the file system is shared, so the venv
(in which privet is installed), the dataset and a ``ledger-dir`` outside ``ray_tmp`` are the same
storage at the same paths on both, as docs/ray-cluster.md requires of real machines.

Ray is stopped by pid (the ``ray start --block`` process groups, then every process left inside
the namespaces), never with ``ray stop``: that kills Ray processes by name on the whole host,
namespaces or not. The namespaces are deleted on the way out, also when the cluster failed to
come up.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy_support import Network, ns_prefix, port_open
from tests.flower_processes import APP_DIR, BIN, stop

SUBNET = "10.78.0"
HEAD_ADDR, WORKER_ADDR = f"{SUBNET}.1", f"{SUBNET}.2"
GCS_PORT = 6379
RAY_ADDRESS = f"{HEAD_ADDR}:{GCS_PORT}"
NODES_PROBE = (
    "import json, ray\n"
    f"ray.init(address={RAY_ADDRESS!r}, logging_level='ERROR', log_to_driver=False)\n"
    "print(json.dumps([{'ip': n['NodeManagerAddress'], 'alive': n['Alive'], 'cpus': n['Resources'].get('CPU', 0),"
    " 'node_id': n['NodeID']} for n in ray.nodes()]))\n"
)


def ray_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What the Ray nodes and the run get: one thread per process (two busy cores here), no
    RAY_ADDRESS inherited from the caller, no usage stats; plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **(extra or {})})
    return env


def tail(path: Path, n: int = 3000) -> str:
    return f"--- {path.name}\n{path.read_text(errors='replace')[-n:]}" if path.exists() else ""


@dataclass
class RayNetnsCluster:
    """The namespace Ray cluster and where its pieces are.

    ``head_proc`` / ``worker_proc``: the ``ray start --block`` processes (their process trees are
    each node's GCS, raylet and workers); ``worker_proc`` is None for a one-node cluster.
    """

    net: Network
    head_ns: str
    worker_ns: str
    ray_tmp: Path  # seen by the head only (the worker sees an empty tmpfs there)
    logs: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    head_proc: subprocess.Popen | None = None
    worker_proc: subprocess.Popen | None = None

    def node(self, ns: str, args: list[str], cpus: int, log: Path, hide: Path | None = None) -> subprocess.Popen:
        """``ray start ARGS --block`` inside ``ns``, in its own session (stopped by pid).

        ``hide``: a folder that the node sees empty (its own mount namespace, an empty tmpfs
        mounted there), as if it were on another machine.
        """
        cmd = [*ns_prefix(ns), str(BIN / "ray"), "start", *args, f"--num-cpus={cpus}", "--disable-usage-stats",
               "--object-store-memory=100000000", "--block"]
        if hide is not None:
            cmd[len(ns_prefix(ns)):len(ns_prefix(ns))] = [
                "unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount -t tmpfs -o size=512m privet-node-tmp {hide} && exec "$@"', "sh"]
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def alive_nodes(self) -> list[dict]:
        """The cluster's alive nodes, as a driver in the head's namespace sees them (``ray.nodes()``)."""
        out = subprocess.run([*ns_prefix(self.head_ns), sys.executable, "-c", NODES_PROBE], env=self.env,
                             capture_output=True, text=True, timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"ray.nodes() failed in {self.head_ns}:\n{out.stderr[-3000:]}")
        return [n for n in json.loads(out.stdout.strip().splitlines()[-1]) if n["alive"]]

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
            if not apps:
                raise AssertionError(f"actor {pid}: no app folder of the run on PYTHONPATH: {env.get(b'PYTHONPATH')!r}")
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

    def start_run(self, sets: dict, out: Path, name: str, args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, Path]:
        """``RAY_ADDRESS=<head> python -m privet.cli run --out OUT ARGS --set ...`` in the head's namespace."""
        cmd = [*ns_prefix(self.head_ns), sys.executable, "-m", "privet.cli", "run", "--out", str(out), *args]
        for key, value in sets.items():
            cmd += ["--set", f"{key}={json.dumps(value)}"]
        log_path = self.logs / f"{name}.log"
        env = {**self.env, "RAY_ADDRESS": RAY_ADDRESS, "TMPDIR": str(self.ray_tmp / "driver")}
        with log_path.open("w") as log:
            run = subprocess.Popen(cmd, cwd=APP_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.procs.append(run)
        return run, log_path

    def tails(self) -> str:
        return tail(self.logs / "ray-head.log") + tail(self.logs / "ray-worker.log")


@contextmanager
def ray_cluster(logs: Path, *, head_cpus: int = 1, worker_cpus: int = 1,
                env: dict[str, str] | None = None) -> Iterator[RayNetnsCluster]:
    """A Ray head in one namespace and, when ``worker_cpus`` > 0, a worker node in the other;
    yields once ``ray.nodes()`` shows them all alive with those CPUs. Everything started is
    stopped by pid and the namespaces deleted on the way out, whatever happened.

    The caller checks first that namespaces can be made (``tests.deploy_support.netns_unavailable``
    with ``"unshare", "mount"``) and that the venv has a ``ray`` command. ``env``: extra
    variables for every Ray process and the run (e.g. ``RAY_PROFILING``).
    """
    net = Network()
    # the head's Ray temp dir and the driver's TMPDIR (privet's FLWR_HOME, with the app
    # installed in it) are in here, which the worker sees empty; short: Ray's unix
    # sockets live under it (108 bytes at most in their paths)
    ray_tmp = Path(tempfile.mkdtemp(prefix="prc-", dir="/tmp"))
    (ray_tmp / "driver").mkdir()
    logs.mkdir(parents=True, exist_ok=True)
    c = RayNetnsCluster(net=net, head_ns="", worker_ns="", ray_tmp=ray_tmp, logs=logs, env=ray_env(env))
    try:
        c.head_ns, c.worker_ns = net.pair(("head", HEAD_ADDR), ("worker", WORKER_ADDR))
        c.head_proc = c.node(c.head_ns, ["--head", f"--node-ip-address={HEAD_ADDR}", f"--port={GCS_PORT}",
                                         "--include-dashboard=false", f"--temp-dir={ray_tmp / 'h'}"], head_cpus, logs / "ray-head.log")
        deadline = time.monotonic() + 120
        while not port_open(HEAD_ADDR, GCS_PORT, c.worker_ns):  # reached from the worker's machine
            if c.head_proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not come up\n{tail(logs / 'ray-head.log')}")
            time.sleep(1.0)
        expected = [(HEAD_ADDR, head_cpus)]
        if worker_cpus:
            c.worker_proc = c.node(c.worker_ns, [f"--address={RAY_ADDRESS}", f"--node-ip-address={WORKER_ADDR}",
                                                 f"--temp-dir={ray_tmp / 'w'}"], worker_cpus,
                                   logs / "ray-worker.log", hide=ray_tmp)
            expected.append((WORKER_ADDR, worker_cpus))
        deadline = time.monotonic() + 180
        while len(nodes := c.alive_nodes()) < len(expected):
            if any(p.poll() is not None for p in c.procs) or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray nodes did not come up: {nodes}\n{c.tails()}")
            time.sleep(2.0)
        if sorted((n["ip"], n["cpus"]) for n in nodes) != expected:
            raise RuntimeError(f"expected nodes (address, CPUs) {expected}, found {nodes}")
        yield c
    finally:
        for proc in reversed(c.procs):
            stop(proc)
        net.kill_all()
        net.down()
        shutil.rmtree(ray_tmp, ignore_errors=True)
