"""The ``privet`` command.

::

    privet run                         the embedded default experiment (Flower simulation)
    privet run CONFIG.toml             another experiment (keys of [tool.flwr.app.config])
    privet run --set strategy=fedavg --set budget-distribution=none --out results/fedavg
    privet run --backend inprocess     the same app in one process, without Ray (quick runs)
    privet report DIR                  print the privacy report of a results directory

``run`` validates the whole configuration before anything starts (a bad key or value
exits with status 2 and a message naming the key and the allowed values), runs Flower's
simulation through ``flwr run`` with a private ``FLWR_HOME``, checks the run's real status
with ``flwr ls --format json`` (``flwr run`` exits 0 even when a run fails), stops the
local SuperLink it started (by pid), and prints the privacy report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

APP_DIR = Path(__file__).resolve().parents[1]


class CliError(RuntimeError):
    """A user-facing failure: printed without a traceback."""


# ------------------------------------------------------------------ config merging
def app_defaults(app_dir: Path = APP_DIR) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the app's ``pyproject.toml``, flattened with dots."""
    pyproject = app_dir / "pyproject.toml"
    if not pyproject.exists():
        raise CliError(f"no pyproject.toml in {app_dir}: run privet from a checkout of the project")
    with open(pyproject, "rb") as fh:
        return flatten(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested TOML tables to Flower's dotted run-config keys."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` with a TOML value (bare words are strings)."""
    if "=" not in text:
        raise CliError(f"--set expects key=value; found {text!r}")
    key, raw = (s.strip() for s in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def load_experiment(config_path: str | None, sets: list[str], out: str | None) -> dict[str, Any]:
    """Defaults < experiment file < ``--set`` overrides < ``--out``; unknown keys rejected."""
    defaults = app_defaults()
    merged = dict(defaults)
    overrides: dict[str, Any] = {}
    if config_path:
        path = Path(config_path)
        if not path.exists():
            raise CliError(f"experiment config {config_path} does not exist")
        with open(path, "rb") as fh:
            overrides.update(flatten(tomllib.load(fh)))
    overrides.update(dict(parse_assignment(s) for s in sets))
    if out:
        overrides["out-dir"] = str(Path(out).resolve())
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise CliError(
            f"unknown config key(s) {', '.join(unknown)}; allowed keys: {', '.join(sorted(defaults))}"
        )
    for key, value in overrides.items():
        expected = type(defaults[key])
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise CliError(f"config key '{key}' must be a {expected.__name__}; found {value!r}")
        merged[key] = value
    if not merged.get("out-dir"):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        merged["out-dir"] = str((Path.cwd() / "results" / f"{merged['strategy']}-{stamp}").resolve())
    return merged


def validate(run_config: dict[str, Any]) -> None:
    from server.config import ConfigError, RunConfig

    try:
        RunConfig.from_flower(run_config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


# ---------------------------------------------------------------- simulation runner
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flwr_env(flwr_home: Path) -> dict[str, str]:
    """The environment for a ``flwr`` / ``flower-*`` process with its own ``FLWR_HOME``:
    no runtime dependency installation, no update check or telemetry, this venv's ``bin``
    first on PATH, and private ports for the local simulation SuperLink."""
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


def _flwr_bin(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else (shutil.which(name) or name)


def local_superlink_pids(flwr_home: Path) -> list[int]:
    """Pids of the background ``flower-superlink`` that ``flwr run`` started for this
    ``FLWR_HOME`` (matched on its own log-file path, never on the program name alone)."""
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


def stop_local_superlink(flwr_home: Path) -> None:
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


def run_simulation(run_config: dict[str, Any], *, app_dir: Path = APP_DIR, keep_home: bool = False) -> dict[str, Any]:
    """Run one experiment with ``flwr run`` (Ray simulation); returns the run's status entry."""
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
    try:
        subprocess.run(cmd, env=env, cwd=flwr_home, check=False)
        status = run_status(flwr_home, env)
    finally:
        stop_local_superlink(flwr_home)
        if not keep_home:
            shutil.rmtree(flwr_home, ignore_errors=True)
    return status


def run_inprocess(run_config: dict[str, Any]) -> dict[str, Any]:
    from client.app import app as client_app
    from server.app import run_experiment
    from server.inprocess import InProcessGrid, simulation_node_configs

    grid = InProcessGrid(client_app, simulation_node_configs(int(run_config["num-clients"])), run_config)
    run_experiment(grid, run_config, run_id=1)
    return {"status": "finished:completed"}


# ------------------------------------------------------------------------ commands
def cmd_run(args: argparse.Namespace) -> int:
    run_config = load_experiment(args.config, args.set or [], args.out)
    validate(run_config)
    out = Path(run_config["out-dir"])
    print(f"privet: {run_config['strategy']} on {run_config['dataset']}, "
          f"{run_config['num-clients']} clients, {run_config['num-server-rounds']} rounds -> {out}", flush=True)
    if args.backend == "inprocess":
        status = run_inprocess(run_config)
    else:
        status = run_simulation(run_config)
    if status.get("status") != "finished:completed":
        raise CliError(f"the run did not complete: {json.dumps(status)}; see the log above")
    report = out / "privacy_report.md"
    if not report.exists():
        raise CliError(f"the run completed but wrote no privacy report in {out}")
    print(report.read_text())
    print(f"results: {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.dir) / "privacy_report.md"
    if not path.exists():
        raise CliError(f"{args.dir} is not a privet results directory (no privacy_report.md)")
    print(path.read_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privet", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment (default: the embedded default)")
    run.add_argument("config", nargs="?", help="experiment TOML (keys of [tool.flwr.app.config])")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config key")
    run.add_argument("--out", help="results directory")
    run.add_argument("--backend", choices=("simulation", "inprocess"), default="simulation",
                     help="Flower's Ray simulation (default) or one process without Ray")
    run.set_defaults(func=cmd_run)
    report = sub.add_parser("report", help="print the privacy report of a results directory")
    report.add_argument("dir")
    report.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"privet: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
