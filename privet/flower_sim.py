"""The Flower simulation runner behind ``privet run``: ``flwr run`` with a private ``FLWR_HOME``.

It starts the simulation with exactly ``num-clients`` SuperNodes, streams its log, checks the run's
real status with ``flwr ls --format json`` (``flwr run`` exits 0 even when a run fails), and stops
what it started by pid (this run's ``flwr-simulation`` and local SuperLink, found by their
``FLWR_HOME``; never anyone else's). SIGINT/SIGTERM raise :class:`Interrupted`, and an interrupted
simulation gets :data:`INTERRUPT_GRACE_S` to write what its server knows. With ``RAY_ADDRESS``
set, the simulation joins that Ray cluster (:func:`ray_cluster_address`, :func:`check_ray_cluster`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privet.run_config import APP_DIR, CliError

if TYPE_CHECKING:
    from server.console import RunConsole


class Interrupted(KeyboardInterrupt):
    """``privet run`` received SIGINT (Ctrl-C) or SIGTERM."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


#: Seconds an interrupted run's simulation gets to write what its server knows and exit.
INTERRUPT_GRACE_S = 90.0


@contextmanager
def signals_raise(handler: Any = None) -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (``handler``: instead do that)."""
    def raise_interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    saved = {s: signal.signal(s, handler or raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)


def muting(console: RunConsole) -> Any:
    """A SIGINT/SIGTERM handler that silences ``console`` (lines still go to run.log), then raises
    :class:`Interrupted`: what the interrupted run logs while it writes its summary stays off the screen.
    """
    def handler(signum: int, _frame: Any) -> None:
        console.mute()
        raise Interrupted(signum)
    return handler




def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flwr_env(flwr_home: Path) -> dict[str, str]:
    """The environment for a ``flwr`` / ``flower-*`` process with its own ``FLWR_HOME``:
    no runtime dependency installation, no update check or telemetry, this venv's ``bin``
    first on PATH, and private ports for the local simulation SuperLink.
    """
    env = dict(os.environ)
    # Flower starts flower-superlink / flwr-simulation by name: put this venv's bin first
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "RAY_DEDUP_LOGS": "0",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        "PYTHONUNBUFFERED": "1",
    })
    return env


#: Ray's variable for the cluster that ``ray.init()`` joins; Flower's Ray backend calls
#: ``ray.init()`` without an address, in ``flwr-simulation``, which inherits it from here.
RAY_ADDRESS_ENV = "RAY_ADDRESS"


def ray_cluster_address(environ: dict[str, str] | None = None) -> str | None:
    """The Ray cluster a simulation will join: ``$RAY_ADDRESS`` (``HOST:PORT`` of a head's GCS),
    or None when unset or when Ray resolves it itself (``auto``: the cluster started on this
    machine; ``local``: a new one, as without it).
    """
    address = (os.environ if environ is None else environ).get(RAY_ADDRESS_ENV, "").strip()
    return address if address and address not in ("auto", "local") else None


def check_ray_cluster(address: str, timeout: float = 5.0) -> None:
    """Refuse, in one line naming ``RAY_ADDRESS``, an address where no Ray head answers.

    Only a TCP connection to the head's GCS port is tried: without it the simulation would
    wait in ``ray.init()`` and then fail with Flower's generic run status.
    """
    hint = "start one with `ray start --head --port=6379` or unset RAY_ADDRESS"
    target = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise CliError(f"{RAY_ADDRESS_ENV}={address!r} is not HOST:PORT of a Ray head (e.g. 10.0.0.1:6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise CliError(f"{RAY_ADDRESS_ENV}={address}: no Ray cluster answers there ({reason}); {hint}") from None


def _flwr_bin(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else (shutil.which(name) or name)


def local_superlink_pids(flwr_home: Path) -> list[int]:
    """Pids of the background ``flower-superlink`` that ``flwr run`` started for this
    ``FLWR_HOME`` (matched on its own log-file path, never on the program name alone).
    """
    marker = str(flwr_home / "local-superlink")
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "flower-superlink" in cmd and marker in cmd:
            pids.append(int(proc.name))
    return pids


def simulation_pids(flwr_home: Path) -> list[int]:
    """Pids of the ``flwr-simulation`` processes running with this ``FLWR_HOME`` (read from
    their environment: only processes this run started carry it).
    """
    marker = f"FLWR_HOME={flwr_home}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"flwr-simulation" not in (proc / "cmdline").read_bytes():
                continue
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def wait_for_simulation(flwr_home: Path, timeout: float) -> bool:
    """Wait until this run's ``flwr-simulation`` has exited; True if it did within ``timeout``.

    When Flower marks a run failed for a lost heartbeat, its log stream ends while the
    simulation process goes on, until its next heartbeat is answered with "stop" or the run
    ends (README, "Heartbeats on a loaded machine").
    """
    deadline = time.monotonic() + timeout
    while simulation_pids(flwr_home):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def stop_simulation(flwr_home: Path, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to what is left of this run's ``flwr-simulation`` (never anyone else's)."""
    for pid in simulation_pids(flwr_home):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue


def stop_interrupted(flwr_home: Path, proc: subprocess.Popen[str] | None, grace: float = INTERRUPT_GRACE_S) -> None:
    """Stop an interrupted simulation so that it writes what its server knows, quietly.

    Flower's ``flwr-simulation`` handles SIGINT by stopping its Simulation Runtime (its SIGTERM
    handler is Ray's, a bare ``sys.exit``); privet's results writer then interrupts the ServerApp's
    thread, which writes ``summary.json`` (status "interrupted") before the process exits
    (:func:`server.results.interrupt_on_exit_signal`). This
    waits up to ``grace`` seconds for that; another SIGINT/SIGTERM cuts the wait short, and what is
    left is killed. ``flwr run`` (which streams the log) is stopped as well.
    """
    def hurry(_signum: int, _frame: Any) -> None:
        raise Interrupted(_signum)

    with signals_raise(hurry):
        try:
            stop_simulation(flwr_home, signal.SIGINT)
            wait_for_simulation(flwr_home, grace)
        except Interrupted:
            pass
        finally:
            stop_simulation(flwr_home, signal.SIGKILL)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def stop_local_superlink(flwr_home: Path) -> None:
    """Stop the local SuperLink that ``flwr run`` started under ``flwr_home`` (found by its FLWR_HOME, by pid)."""
    for pid in local_superlink_pids(flwr_home):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 10
    while local_superlink_pids(flwr_home) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in local_superlink_pids(flwr_home):
        os.kill(pid, signal.SIGKILL)


def run_status(flwr_home: Path, env: dict[str, str]) -> dict[str, Any]:
    """The newest run's entry of ``flwr ls --format json``."""
    out = subprocess.run([_flwr_bin("flwr"), "ls", "--format", "json"], env=env, cwd=flwr_home,
                         capture_output=True, text=True, timeout=120)
    try:
        runs = json.loads(out.stdout)["runs"]
    except (json.JSONDecodeError, KeyError) as exc:
        raise CliError(f"could not read the run status (flwr ls): {out.stdout}{out.stderr}") from exc
    if not runs:
        raise CliError("flwr ls lists no run: the run was never started")
    return max(runs, key=lambda r: int(r["run-id"]))


def run_simulation(run_config: dict[str, Any], *, app_dir: Path = APP_DIR, keep_home: bool = False,
                   console: RunConsole | None = None) -> dict[str, Any]:
    """Run one experiment with ``flwr run`` (Ray simulation); returns the run's status entry.

    The simulation gets exactly ``num-clients`` SuperNodes (``--federation-config``); its
    streamed log goes line by line to ``console`` (or straight through without one).
    """
    import tomli_w

    flwr_home = Path(tempfile.mkdtemp(prefix="privet-flwr-home-"))
    env = flwr_env(flwr_home)
    overrides = flwr_home / "run-config.toml"
    from server.config import nest

    overrides.write_text(tomli_w.dumps(nest(run_config)))
    federation = (f"num-supernodes={int(run_config['num-clients'])} "
                  "client-resources-num-cpus=1 client-resources-num-gpus=0.0")
    cmd = [_flwr_bin("flwr"), "run", str(app_dir), "--run-config", str(overrides),
           "--federation-config", federation, "--stream"]
    proc: subprocess.Popen[str] | None = None
    try:
        # flwr run's own Ctrl-C output never reaches the console (its stdout is read here); an
        # interrupt stops the simulation so that its server writes what it knows (stop_interrupted)
        proc = subprocess.Popen(cmd, env=env, cwd=flwr_home, text=True, bufsize=1, errors="replace",
                                stdout=None if console is None else subprocess.PIPE,
                                stderr=None if console is None else subprocess.STDOUT)
        try:
            if proc.stdout is not None and console is not None:
                for line in proc.stdout:
                    console.feed(line)
            proc.wait()
        except Interrupted:
            stop_interrupted(flwr_home, proc)
            raise
        status = run_status(flwr_home, env)
        if "heartbeat" in json.dumps(status).lower() and simulation_pids(flwr_home):
            print("privet: Flower lost the simulation's heartbeat (an overloaded machine?) but the "
                  "simulation is still running: waiting for it to finish", file=sys.stderr, flush=True)
            budget = float(run_config.get("round-timeout", 3600.0)) * int(run_config.get("num-server-rounds", 1))
            wait_for_simulation(flwr_home, budget)
        else:
            wait_for_simulation(flwr_home, 30.0)
    finally:
        with signals_raise(signal.SIG_IGN):  # clean-up runs to its end, whatever arrives now
            stop_simulation(flwr_home)
            stop_local_superlink(flwr_home)
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()
            if not keep_home:
                shutil.rmtree(flwr_home, ignore_errors=True)
    return status
