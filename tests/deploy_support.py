"""Helpers for the deployment tests: a SuperLink with TLS and SuperNode authentication,
SuperNodes with their own keys, optionally each in its own network namespace ("machine"),
and the ``flwr`` CLI of an operator on the SuperLink's machine.

Every process is started in its own session and stopped by pid (process group).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.flower_processes import APP_DIR, BIN, flwr_env, free_port, stop

GENERATE_CERTS = APP_DIR / "deploy" / "generate-certs.sh"

FAST = {
    "num-server-rounds": 2,
    "max-examples-per-client": 256,
    "model": "logreg",
    "batch-size": 32,
    "learning-rate": 0.1,
    "momentum": 0.0,
}


def env_for(home: Path) -> dict[str, str]:
    """``flwr_env`` plus the venv's bin on PATH: the SuperLink/SuperNode start
    ``flower-superexec`` and ``flwr-serverapp``/``flwr-clientapp`` by name."""
    env = flwr_env(home)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def generate_certs(out: Path, n_keys: int, *sans: str) -> tuple[Path, Path]:
    """Run ``deploy/generate-certs.sh``; returns (certs dir, keys dir)."""
    args = ["bash", str(GENERATE_CERTS), str(n_keys), "--out", str(out)]
    for san in sans:
        args += ["--san", san]
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=120)
    return out / "certs", out / "keys"


def ns_prefix(ns: str | None) -> list[str]:
    return ["ip", "netns", "exec", ns] if ns else []


def port_open(host: str, port: int, ns: str | None = None) -> bool:
    probe = ns_prefix(ns) + ["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@dataclass
class SecureDeployment:
    """SuperLink (TLS + ``--enable-supernode-auth``) and SuperNodes.

    ``link_ns``/``link_addr``: the SuperLink's network namespace (None: this one) and the
    address SuperNodes dial. The operator's CLI runs on the SuperLink's machine and talks
    to the Control API on 127.0.0.1 there.
    """

    root: Path
    certs: Path
    link_ns: str | None = None
    link_addr: str = "127.0.0.1"
    fleet_port: int = field(default_factory=free_port)
    control_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    log_files: dict[str, Path] = field(default_factory=dict)

    # ------------------------------------------------------------ processes
    def spawn(self, name: str, cmd: list[str], ns: str | None = None) -> subprocess.Popen:
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        log_path = self.root / f"{name}.log"
        if name in self.procs and self.procs[name].poll() is None:
            raise RuntimeError(f"{name} is still running")
        log = open(log_path, "a")
        proc = subprocess.Popen(ns_prefix(ns) + cmd, env=env_for(home), cwd=home, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = proc
        self.log_files[name] = log_path
        return proc

    def start_superlink(self, *, auth: bool = True, database: Path | None = None) -> None:
        cmd = [
            str(BIN / "flower-superlink"),
            "--ssl-ca-certfile", str(self.certs / "ca.crt"),
            "--ssl-certfile", str(self.certs / "server.pem"),
            "--ssl-keyfile", str(self.certs / "server.key"),
            "--disable-runtime-dependency-installation",
            "--fleet-api-address", f"{'0.0.0.0' if self.link_ns else '127.0.0.1'}:{self.fleet_port}",
            "--host", "127.0.0.1", "--port", str(self.control_port),
        ]
        if auth:
            cmd.append("--enable-supernode-auth")
        if database is not None:
            cmd += ["--database", str(database)]
        self.spawn("superlink", cmd, self.link_ns)
        self.wait_for(lambda: port_open("127.0.0.1", self.control_port, self.link_ns)
                      and port_open("127.0.0.1", self.fleet_port, self.link_ns),
                      60, "the SuperLink to listen")

    def supernode_cmd(self, node_config: dict[str, Any], *, key: Path | None, tls: bool = True,
                      max_retries: int | None = None) -> list[str]:
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in node_config.items())
        cmd = [str(BIN / "flower-supernode"), "--superlink", f"{self.link_addr}:{self.fleet_port}",
               "--port", str(free_port()), "--node-config", config]
        if max_retries is not None:
            cmd += ["--max-retries", str(max_retries), "--max-wait-time", "15"]
        cmd += ["--root-certificates", str(self.certs / "ca.crt")] if tls else ["--insecure"]
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        return cmd

    def start_supernode(self, name: str, node_config: dict[str, Any], *, key: Path | None,
                        tls: bool = True, ns: str | None = None,
                        max_retries: int | None = None) -> subprocess.Popen:
        cmd = self.supernode_cmd(node_config, key=key, tls=tls, max_retries=max_retries)
        return self.spawn(name, cmd, ns)

    def stop(self, name: str) -> None:
        stop(self.procs.pop(name))

    def stop_all(self) -> None:
        for name in list(self.procs)[::-1]:
            stop(self.procs.pop(name))

    @staticmethod
    def wait_for(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}")

    # ------------------------------------------------------------------ CLI
    def cli_home(self) -> Path:
        home = self.root / "cli"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "secure"\n\n'
            f'[superlink.secure]\naddress = "127.0.0.1:{self.control_port}"\n'
            f'root-certificates = "{self.certs / "ca.crt"}"\n'
        )
        return home

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        home = self.cli_home()
        return subprocess.run(ns_prefix(self.link_ns) + [str(BIN / "flwr"), *args], env=env_for(home),
                              cwd=home, capture_output=True, text=True, timeout=timeout)

    def register(self, public_key: Path) -> int:
        out = self.flwr("supernode", "register", str(public_key), "secure", "--format", "json")
        data = json.loads(out.stdout)
        assert data.get("success"), out.stdout + out.stderr
        return int(data["node-id"])

    def unregister(self, node_id: int) -> None:
        out = self.flwr("supernode", "unregister", str(node_id), "secure", "--format", "json")
        assert json.loads(out.stdout).get("success"), out.stdout + out.stderr

    def nodes(self) -> dict[int, str]:
        """node id -> status (registered / online / offline / unregistered)."""
        out = self.flwr("supernode", "list", "secure", "--format", "json")
        return {int(n["node-id"]): n["status"] for n in json.loads(out.stdout)["nodes"]}

    def wait_online(self, node_ids: list[int], timeout: float = 90.0) -> None:
        self.wait_for(lambda: all(self.nodes().get(n) == "online" for n in node_ids), timeout,
                      f"nodes {node_ids} to be online ({self.logs()})")

    def submit(self, run_config: dict[str, Any], app_dir: Path = APP_DIR) -> int:
        import tomli_w

        from server.config import nest

        overrides = self.root / f"run-config-{time.monotonic_ns()}.toml"
        overrides.write_text(tomli_w.dumps(nest(run_config)))
        out = self.flwr("run", str(app_dir), "secure", "--run-config", str(overrides), "--format", "json")
        assert out.returncode == 0, out.stdout + out.stderr
        data = json.loads(out.stdout)
        assert data.get("success", True), out.stdout
        return int(data["run-id"])

    def run_status(self, run_id: int) -> dict[str, Any]:
        out = self.flwr("ls", "secure", "--run-id", str(run_id), "--format", "json")
        return json.loads(out.stdout)["runs"][0]

    def wait_run(self, run_id: int, timeout: float = 600.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.run_status(run_id)
            if status["status"].startswith("finished"):
                return status
            time.sleep(2.0)
        raise TimeoutError(f"run {run_id} did not finish in {timeout}s: {status}\n{self.logs()}")

    def run_app(self, run_config: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        return self.wait_run(self.submit(run_config), timeout)

    def log(self, name: str) -> str:
        path = self.log_files.get(name, self.root / f"{name}.log")
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted(self.root.glob("*.log")))


def wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit code, or None if it is still running after ``timeout`` s."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def missing(*tools: str) -> list[str]:
    """The tools of ``tools`` that are missing from PATH."""
    return [t for t in tools if shutil.which(t) is None]


def read_rounds(out: Path) -> list[dict[str, Any]]:
    """The lines of a run's ``rounds.jsonl`` written so far (none before the file exists)."""
    path = out / "rounds.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


# ------------------------------------------------------------- network namespaces
#: the Debian package of each tool the namespace tests need
PACKAGES = {"ip": "iproute2", "ssh-keygen": "openssh-client", "openssl": "openssl", "unshare": "util-linux",
            "mount": "mount"}


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS`` (iproute2)."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_unavailable(*tools: str) -> str | None:
    """Why network namespaces (with veth pairs) and ``tools`` cannot be used here, or None."""
    absent = missing("ip", *tools)
    if absent:
        pkgs = " ".join(PACKAGES.get(t, t) for t in absent)
        return f"missing tools: {', '.join(absent)} (apt-get install {pkgs})"
    probe = f"privet-probe-{uuid.uuid4().hex[:6]}"
    res = ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        why = res.stderr.strip() or res.returncode
        return f"`ip netns add` is not permitted here ({why}); needs root/CAP_SYS_ADMIN"
    try:
        veth = subprocess.run(["ip", "netns", "exec", probe, "ip", "link", "add", "pa", "type", "veth",
                               "peer", "name", "pb"], capture_output=True, text=True, timeout=30)
        if veth.returncode != 0:
            return f"veth pairs cannot be created in a network namespace: {veth.stderr.strip()}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


class Network:
    """Network namespaces ("machines") named ``privet-<id>-<tag>``: either a bridge namespace
    plus one namespace per host with a veth leg on the bridge (``up`` then ``host``), or two
    namespaces joined by one veth pair (``pair``). Every address exists only inside them."""

    def __init__(self) -> None:
        self.id = f"{os.getpid() % 100000}{uuid.uuid4().hex[:3]}"
        self.bridge = f"privet-{self.id}-br"
        self.namespaces: list[str] = []

    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def up(self) -> None:
        self._add_ns(self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")

    def host(self, tag: str, address: str) -> str:
        ns = f"privet-{self.id}-{tag}"
        self._add_ns(ns)
        leg = f"v{tag}"[:15]
        ip("-n", self.bridge, "link", "add", leg, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("-n", self.bridge, "link", "set", leg, "master", "br0", "up")
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        return ns

    def pair(self, a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
        """Two namespaces, ``(tag, address)`` each, joined by one veth pair (``eth0`` in both)."""
        (tag_a, addr_a), (tag_b, addr_b) = a, b
        ns_a, ns_b = f"privet-{self.id}-{tag_a}", f"privet-{self.id}-{tag_b}"
        self._add_ns(ns_a)
        self._add_ns(ns_b)
        ip("-n", ns_a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", ns_b)
        for ns, addr in ((ns_a, addr_a), (ns_b, addr_b)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
        return ns_a, ns_b

    def pids(self, ns: str) -> list[int]:
        """Pids of the processes inside namespace ``ns`` (all of them started by the test:
        nothing else enters a namespace it created)."""
        wanted = f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]"
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if os.readlink(proc / "ns" / "net") == wanted:
                        found.append(int(proc.name))
                except OSError:
                    continue
        return found

    def kill_all(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL, every process left inside these namespaces, by pid."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for ns in self.namespaces:
                for pid in self.pids(ns):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        continue
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(self.pids(ns) for ns in self.namespaces):
                time.sleep(0.2)

    def down(self) -> None:
        for ns in reversed(self.namespaces):
            ip("netns", "del", ns, check=False)
        self.namespaces.clear()
