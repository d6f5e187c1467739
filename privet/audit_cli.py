"""``privet audit``'s command line: its options and help, nothing that runs an audit.

Kept apart from :mod:`privet.audit_cmd` (which imports the client's mechanisms, the ledger, scipy
and Flower's record types) so that ``privet --help``, ``privet audit --help`` and a config error
import none of them (tests/privet/test_cli_imports.py); :func:`add_parser`'s command imports
:func:`privet.audit_cmd.cmd_audit` only when an audit runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from privacy.auditing import DEFAULT_CONFIDENCE
from privet.audit_defaults import DEFAULT_CANARIES, DEFAULT_EXTENSION

__all__ = ["AUDIT_HELP", "add_parser"]

AUDIT_HELP = """\
Measure each privacy mechanism of a run config empirically: run it on canaries (in this
process, through privet's own client mechanisms, calibration and ledger; no Flower run),
attack what the threat model's adversary sees, and print per mechanism the empirical eps
(a lower bound at --confidence, and Andrew et al.'s one-shot estimate) beside the eps the
ledger charged. Exit status 1, with one line naming the mechanism and both figures, when a
lower bound exceeds the charge; 2 on a bad configuration. With --out DIR: DIR/audit.json
(every figure), and an "Empirical privacy audit" section in DIR/summary.json ("audit"),
DIR/privacy_report.md and DIR/report.html; a DIR that holds a privet run of the same config
keeps the run's report, the audit added (one of another config is refused). A later privet
run of the same config into DIR keeps the audit; one of another config leaves it out, renames
audit.json to audit-of-another-config.json and says so in one line.

Configuration: as privet run (defaults < CONFIG.toml < --set KEY=VALUE).

examples:
  privet audit
  privet audit --set dp-mode=update --set num-server-rounds=2 --out results/audit
  privet run my.toml --out results/r1 && privet audit my.toml --out results/r1   (the run's report + audit)
  privet audit experiments/baselines/udp-fedavg.toml --canaries 4000"""


def _cmd_audit(args: argparse.Namespace) -> int:
    """Validate the configuration (a bad one: one line, before any heavy import), then run the audit
    (:func:`privet.audit_cmd.cmd_audit`, imported only now).
    """
    from privet.run_config import load_experiment, validate

    validate(load_experiment(args.config, list(args.set or []), None))
    from privet.audit_cmd import cmd_audit

    return cmd_audit(args)


def add_parser(sub: Any) -> None:
    """Register ``privet audit`` on the CLI's subparsers."""
    parser = sub.add_parser("audit", help="measure each mechanism's privacy empirically (a lower bound on eps)",
                            description=AUDIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="experiment TOML (keys of [tool.flwr.app.config])")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config key (repeatable)")
    parser.add_argument("--out", help="results folder: audit.json, and the audit's section in summary.json, "
                                      "privacy_report.md and report.html (merged into a run's of the same config)")
    parser.add_argument("--client", type=int, default=0, help="partition id of the audited client (default 0)")
    parser.add_argument("--canaries", type=int, default=DEFAULT_CANARIES,
                        help=f"canary clients, or canary records at record level (default {DEFAULT_CANARIES})")
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE,
                        help=f"of the lower bounds (default {DEFAULT_CONFIDENCE})")
    parser.add_argument("--extension", type=int, default=DEFAULT_EXTENSION,
                        help=f"the server asks for this many times the declared rounds (default {DEFAULT_EXTENSION})")
    parser.add_argument("--seed", type=int, help="the auditor's own randomness (never the clients' noise)")
    parser.add_argument("--game", action="append", metavar="NAME",
                        help="run this registered game instead of the mechanism's default (repeatable), e.g. "
                             "dpsgd-steps: every DP-SGD step's noisy sum, white-box")
    parser.add_argument("--runtime", choices=("games", "flower"), default="games",
                        help="games: each mechanism's canary game in this process (default); flower: canary clients "
                             "inside a real run of the configured strategy (privet/audit_flower.py)")
    parser.set_defaults(func=_cmd_audit)
