"""Real Flower processes for the end-to-end tests: a SuperLink and SuperNodes talking
gRPC on loopback, and the ``flwr`` CLI against them. Every process gets its own
``FLWR_HOME`` (as if on its own machine) and free ports; everything is stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privet.flower_sim import flwr_env as cli_flwr_env
from privet.flower_sim import free_port

BIN = Path(sys.executable).parent
APP_DIR = Path(__file__).resolve().parents[1]


def flwr_env(home: Path) -> dict[str, str]:
    """``privet.flower_sim.flwr_env`` with one thread per process (several share 2 cores here)."""
    return {**cli_flwr_env(home), "OMP_NUM_THREADS": "1"}


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


@dataclass
class LocalDeployment:
    """A SuperLink plus SuperNodes on 127.0.0.1, insecure (TLS is the deployment issue's)."""

    root: Path
    fleet_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    control_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, env=flwr_env(home), cwd=home, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def start_superlink(self, name: str = "superlink", database: Path | None = None) -> subprocess.Popen:
        proc = self._spawn(name, [
            str(BIN / "flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
            "--fleet-api-address", f"127.0.0.1:{self.fleet_port}",
            "--control-api-address", f"127.0.0.1:{self.control_port}",
            "--host", "127.0.0.1", "--port", str(self.http_port),
            *(["--database", str(database)] if database else []),
        ])
        self.wait_for_port(self.http_port)
        self.wait_for_port(self.fleet_port)
        return proc

    def start_supernode(self, name: str, node_config: dict[str, Any]) -> subprocess.Popen:
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in node_config.items())
        return self._spawn(name, [
            str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.fleet_port}",
            "--port", str(free_port()), "--node-config", config,
        ])

    def wait_for_port(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")

    def cli_home(self) -> Path:
        home = self.root / "cli"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "local-deploy"\n\n'
            f'[superlink.local-deploy]\naddress = "127.0.0.1:{self.http_port}"\ninsecure = true\n'
        )
        return home

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        home = self.cli_home()
        return subprocess.run([str(BIN / "flwr"), *args], env=flwr_env(home), cwd=home,
                              capture_output=True, text=True, timeout=timeout)

    def run_app(self, run_config: dict[str, Any], timeout: float = 900.0) -> dict[str, Any]:
        """``flwr run`` the app against the SuperLink, wait, return the run's status entry."""
        return self.wait_run(self.submit(run_config), timeout)

    def submit(self, run_config: dict[str, Any]) -> int:
        """``flwr run`` the app against the SuperLink; the run's id."""
        import tomli_w

        overrides = self.root / "run-config.toml"
        from server.config import nest

        overrides.write_text(tomli_w.dumps(nest(run_config)))
        out = self.flwr("run", str(APP_DIR), "local-deploy", "--run-config", str(overrides),
                        "--format", "json")
        assert out.returncode == 0, out.stdout + out.stderr
        return int(json.loads(out.stdout)["run-id"])

    def wait_run(self, run_id: int, timeout: float = 900.0) -> dict[str, Any]:
        """Poll ``flwr ls`` until the run finished; its status entry."""
        status: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.run_status(run_id)
            if status["status"].startswith("finished"):
                return status
            time.sleep(2.0)
        raise TimeoutError(f"run {run_id} did not finish in {timeout}s: {status}")

    def run_status(self, run_id: int) -> dict[str, Any]:
        out = self.flwr("ls", "--run-id", str(run_id), "--format", "json")
        return json.loads(out.stdout)["runs"][0]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.root.glob("*.log")))

    def stop_all(self) -> None:
        for name in list(self.procs)[::-1]:
            stop(self.procs.pop(name))
