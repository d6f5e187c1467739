"""The ``privet`` command.

::

    privet run                         the embedded default experiment (Flower simulation)
    privet run CONFIG.toml             another experiment (keys of [tool.flwr.app.config])
    privet run --set strategy=fedavg --set budget-distribution=none --out results/fedavg
    privet run --backend inprocess     the same app in one process, without Ray (quick runs)
    privet report DIR                  print the privacy report of a results directory
    privet report DIR --open           write and open its HTML report

``run`` validates the whole configuration before anything starts (a bad key or value
exits with status 2 and a message naming the key and the allowed values), runs Flower's
simulation through ``flwr run`` with a private ``FLWR_HOME``, checks the run's real status
with ``flwr ls --format json`` (``flwr run`` exits 0 even when a run fails), stops the
local SuperLink it started (by pid), and prints the privacy report. With ``RAY_ADDRESS``
set, the simulation joins that Ray cluster instead of starting one (docs/ray-cluster.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

if TYPE_CHECKING:
    from server.console import RunConsole

from privet.run_config import (  # noqa: F401  (privet.cli.<name> stays importable)
    APP_DIR,
    CliError,
    app_defaults,
    check_out_dir,
    flatten,
    load_experiment,
    parse_assignment,
    read_toml,
    simulated_roster,
    toml_error_message,
    validate,
)


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




# ---------------------------------------------------------------- simulation runner
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


def run_inprocess(run_config: dict[str, Any], console: RunConsole | None = None) -> dict[str, Any]:
    """Run one experiment in this process (no Ray, no gRPC); logs go to ``console``."""
    import contextlib

    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment
    from server.console import logs_to

    grid = InProcessGrid(client_app, simulation_node_configs(int(run_config["num-clients"])), run_config)
    with logs_to(console) if console is not None else contextlib.nullcontext():
        run_experiment(grid, run_config, run_id=1)
    return {"status": "finished:completed"}


def lost_heartbeat_but_completed(status: dict[str, Any], out: Path) -> bool:
    """Whether Flower marked the run failed only for a missed task heartbeat while the
    ServerApp itself finished: ``summary.json`` says "completed".

    Flower 1.39 fails a run whose ``flwr-simulation`` process sends no heartbeat for 60 s
    (``HEARTBEAT_PATIENCE`` 2 x ``HEARTBEAT_DEFAULT_INTERVAL`` 30 s, constants, not options),
    which happens on an overloaded machine although the run goes on to the end.
    """
    if "heartbeat" not in json.dumps(status).lower():
        return False
    try:
        return json.loads((out / "summary.json").read_text()).get("status") == "completed"
    except (OSError, json.JSONDecodeError):
        return False


# ------------------------------------------------------------------------ commands
def cmd_run(args: argparse.Namespace) -> int:
    """``privet run``; SIGINT (Ctrl-C) and SIGTERM end it with one line (:func:`report_interrupt`)."""
    where: dict[str, Path] = {}
    with signals_raise():
        try:
            return _run(args, where)
        except KeyboardInterrupt as exc:  # Interrupted, or a Ctrl-C before its handler was in place
            with signals_raise(signal.SIG_IGN):
                return report_interrupt(exc, where.get("out"), where.get("log"))


def report_interrupt(exc: KeyboardInterrupt, out: Path | None, log_path: Path | None) -> int:
    """One line on an interrupted run (where its partial results are); exit status 128 + the signal."""
    signum = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
    name = signal.Signals(signum).name
    summary = out / "summary.json" if out is not None else None
    if log_path is not None and log_path.exists() and out is not None and out.is_dir():
        shutil.move(str(log_path), out / "run.log")
    status = ""
    if summary is not None and summary.exists():
        try:
            status = str(json.loads(summary.read_text()).get("status", ""))
        except (OSError, json.JSONDecodeError):
            status = ""
    if status:
        when = re.search(r"during round \d+|between rounds", status)
        print(f"privet: interrupted by {name}{' ' + when.group(0) if when else ''}; partial results in {out} "
              "(summary.json and privacy_report.md: each client's spend as known for sure, and at most what "
              "unanswered rounds may have charged)", file=sys.stderr, flush=True)
    else:
        print(f"privet: interrupted by {name} before the run wrote any result", file=sys.stderr, flush=True)
    return 128 + signum


def _run(args: argparse.Namespace, where: dict[str, Path]) -> int:
    from server.console import RunConsole, open_log

    run_config = load_experiment(args.config, args.set or [], args.out)
    validate(run_config)
    out = Path(run_config["out-dir"])
    check_out_dir(out)
    if run_config.get("secure-aggregation", "none") != "none" and not run_config.get("roster"):
        run_config = {**run_config, "roster": simulated_roster(run_config, out)}
    cluster = ray_cluster_address() if args.backend == "simulation" else None
    if cluster:
        check_ray_cluster(cluster)
        from privet.shared_storage import ledger_dir_refusal  # one ledger per client (docs/ray-cluster.md)
        if refusal := ledger_dir_refusal(cluster, str(run_config.get("ledger-dir", ""))):
            raise CliError(refusal)
    where["out"] = out
    print(f"privet: {run_config['strategy']} on {run_config['dataset']}, "
          f"{run_config['num-clients']} clients, {run_config['num-server-rounds']} rounds -> {out}", flush=True)
    if cluster:
        print(f"privet: the simulation joins the Ray cluster at {RAY_ADDRESS_ENV}={cluster} "
              "(docs/ray-cluster.md)", flush=True)
    # run.log is written next to the results once they exist (a refused run leaves no folder)
    log_path = Path(tempfile.mkstemp(prefix="privet-run-", suffix=".log")[1])
    where["log"] = log_path
    with open_log(log_path) as log_file, \
            RunConsole(int(run_config["num-server-rounds"]), log=log_file, verbose=args.verbose) as console, \
            signals_raise(muting(console)):
        if args.backend == "inprocess":
            try:
                status = run_inprocess(run_config, console)
            except Exception as exc:  # noqa: BLE001 - reported like a failed simulation
                log_file.write(f"ERROR: {type(exc).__name__}: {exc}\n")
                status = {"status": "finished:failed", "details": f"{type(exc).__name__}: {exc}"}
        else:
            status = run_simulation(run_config, console=console)
    kept_log = log_path
    if out.is_dir():
        kept_log = out / "run.log"
        shutil.move(str(log_path), kept_log)
    if status.get("status") != "finished:completed":
        if lost_heartbeat_but_completed(status, out):
            print("privet: warning: Flower marked the run failed for a missed heartbeat (an overloaded "
                  "machine), but the ServerApp finished and wrote every result; see README, "
                  "'Heartbeats on a loaded machine'", file=sys.stderr)
        elif "heartbeat" in json.dumps(status).lower():
            raise CliError(f"Flower stopped the run: its simulation process sent no heartbeat for 60 s (an "
                           f"overloaded machine; see README, 'Heartbeats on a loaded machine'). Status: "
                           f"{json.dumps(status)}; full log: {kept_log}")
        elif (out / "summary.json").exists() and (ended := str(json.loads((out / "summary.json").read_text())
                                                       .get("status", ""))).startswith("incomplete"):
            raise CliError(f"the run is {ended}; results and privacy_report.md in {out}; full log: {kept_log}")
        else:
            raise CliError(f"the run did not complete: {json.dumps(status)}; full log: {kept_log}")
    report = out / "privacy_report.md"
    if not report.exists():
        raise CliError(f"the run completed but wrote no privacy report in {out}; full log: {kept_log}")
    print(report.read_text())
    html = write_html_report(out)
    print(f"results: {out}\nreport:  {html}\nlog:     {kept_log}")
    return 0


def write_html_report(out: Path) -> Path:
    """``report.html`` of a results directory (written anew from its files)."""
    from server.report_html import write_report

    return write_report(out)


def cmd_report(args: argparse.Namespace) -> int:
    """``privet report DIR [--open]``: print a results directory's privacy report, or write and open its HTML."""
    out = Path(args.dir)
    path = out / "privacy_report.md"
    if not path.exists():
        raise CliError(f"{args.dir} is not a privet results directory (no privacy_report.md)")
    if not (args.html or args.open):
        print(path.read_text())
        return 0
    html = write_html_report(out)
    print(html)
    if args.open:
        import webbrowser

        if not webbrowser.open(html.resolve().as_uri()):
            print(f"privet: no browser found here; open {html} yourself", file=sys.stderr)
    return 0


MAIN_HELP = """\
privet: differentially private federated learning with heterogeneous per-client
budgets, on Flower. Each client keeps its own (epsilon, delta) budget and ledger; the
server verifies every reply and writes a per-client privacy report.

examples:
  privet run                                   the default experiment (10 clients, Fashion-MNIST)
  privet run --backend inprocess --set num-server-rounds=1
  privet run my-experiment.toml --out results/pfa
  privet report results/pfa                    print its privacy report
  privet report results/pfa --open             its HTML report, in a browser

The same app runs with Flower's own CLI (clients in parallel, one CPU each):
  flwr run . --federation-config "num-supernodes=10 client-resources-num-cpus=1" --stream
(see the README)."""

RUN_HELP = """\
Run one experiment: validate the whole configuration first (a bad key, value, TOML line
or missing dataset stops here with status 2 and nothing written), then run Flower's
simulation (or the in-process backend), show progress, and write the results directory:
config.json, rounds.jsonl, summary.json, privacy_report.md, progress.png, report.html, run.log.

Configuration: the defaults of [tool.flwr.app.config] in pyproject.toml < CONFIG.toml <
--set KEY=VALUE (TOML values; bare words are strings) < --out.

examples:
  privet run
  privet run --set strategy=fedavg --set budget-distribution=none --out results/fedavg
  privet run --set budget-distribution=constant --set epsilon=2 --set num-server-rounds=5
  privet run experiment.toml --backend inprocess --verbose
  RAY_ADDRESS=10.0.0.1:6379 privet run         the simulation on an existing Ray cluster
                                               (docs/ray-cluster.md)"""

REPORT_HELP = """\
Print the privacy report of a results directory (privacy_report.md), or write its
self-contained HTML report (report.html: accuracy and epsilon over rounds, per-client
budget bars and guarantees, the run's configuration) and print its path or open it.

examples:
  privet report results/fedavg-hdp-20260101-120000
  privet report results/run --html
  privet report results/run --open"""


def build_parser() -> argparse.ArgumentParser:
    """The ``privet`` command line: ``run``, ``report``, ``site``, ``roster`` and ``audit``."""
    from strategies.catalogue import catalogue_help

    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="privet", description=MAIN_HELP, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,report,site,roster,audit}")
    run = sub.add_parser("run", help="run one experiment (default: the embedded default)",
                         description=RUN_HELP + "\n\nstrategies (--set strategy=NAME):\n" + catalogue_help(),
                         formatter_class=fmt)
    run.add_argument("config", nargs="?", help="experiment TOML (keys of [tool.flwr.app.config])")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config key (repeatable)")
    run.add_argument("--out", help="results directory (default: results/<strategy>-<time>)")
    run.add_argument("--backend", choices=("simulation", "inprocess"), default="simulation",
                     help="Flower's Ray simulation (default) or one process without Ray")
    run.add_argument("--verbose", "-v", action="store_true",
                     help="print every log line (the full log always goes to run.log)")
    run.set_defaults(func=cmd_run)
    report = sub.add_parser("report", help="print or open the report of a results directory",
                            description=REPORT_HELP, formatter_class=fmt)
    report.add_argument("dir", help="a results directory of privet run")
    report.add_argument("--html", action="store_true", help="write report.html and print its path")
    report.add_argument("--open", action="store_true", help="write report.html and open it in a browser")
    report.set_defaults(func=cmd_report)
    from privet.site import add_parser as add_site_parser

    add_site_parser(sub)  # privet site check (privet/site.py)
    from privet.roster_cmd import add_parser as add_roster_parser

    add_roster_parser(sub)  # privet roster generate (privet/roster_cmd.py)
    from privet.audit_cli import add_parser as add_audit_parser

    add_audit_parser(sub)  # privet audit (privet/audit_cli.py; the audit itself: privet/audit_cmd.py)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``privet`` command; the exit status (2 for a bad configuration, one line on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"privet: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a run (privet run handles its own: report_interrupt)
        print("privet: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
