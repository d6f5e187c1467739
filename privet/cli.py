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
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.console import RunConsole

from privet.flower_sim import (
    RAY_ADDRESS_ENV,
    Interrupted,
    check_ray_cluster,
    muting,
    ray_cluster_address,
    run_simulation,
    signals_raise,
)
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
