"""``privet audit``: the empirical privacy of a run config's mechanisms, beside what the ledgers charged.

::

    privet audit                          the embedded default experiment
    privet audit CONFIG.toml --set dp-mode=update --out results/audit
    privet audit --canaries 4000 --confidence 0.99

The audit takes the same configuration as ``privet run`` (defaults < CONFIG < ``--set``, validated
before anything starts), works out which of privet's client mechanisms that run would use, and
runs each of them **in this process** on canaries, through the very objects and functions the
ClientApp runs (:mod:`client.round`): the round's :class:`protocol.train_config.TrainConfig`
(from :func:`server.registry.train_config`, GDPFed's per-node one from the strategy's own
``node_config``), its mechanism (:meth:`TrainConfig.mechanism`), the plan against a fresh
:class:`privacy.ledger.PrivacyLedger` of the client's budget (privet's own calibration: σ is never
recomputed here), the budget check, :meth:`Mechanism.run` with the client's noise source
(:func:`client.seeds.noise_for`), and :meth:`PrivacyLedger.record_release`. Not run: Flower's
messaging, the data set and model of the config, the site floors; the canary "model" is a
stand-in (below). The statistics are :mod:`privacy.auditing`'s via
:func:`privacy.mechanism_audit.assess`: Steinke et al.'s one-run bound and the Clopper–Pearson
threshold tests (a lower bound on ε at ``confidence``), and Andrew et al.'s one-shot estimate.

The modules: this one is the command and the report (:func:`audit`, :class:`AuditReport`);
:mod:`privet.audit_setup` turns the run config into the audited client's setup;
:mod:`privet.audit_games` holds the canary games (what each observes) and the registry that
maps a game's name to it (:data:`privet.audit_games.GAMES`; a new game is a module and one line
there); :func:`client.release.client_release` is the round's privacy steps, the ClientApp's own.

The flag: a lower bound above the charged ε (at δ, or at a δ' of the privacy profile);
``privet audit`` then exits with status 1 and one line naming the mechanism and both figures.
An audit that is not flagged proves nothing beyond "this attack did not refute the charge".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from client.release import client_release
from privacy.auditing import DEFAULT_CONFIDENCE
from privacy.mechanism_audit import AuditResult, assess
from privet.audit_games import CANARY_NORM, RECORD_FEATURE, STAND_IN_DIM, CanaryWork, games, select
from privet.audit_setup import RUN_ID, AuditConfigError, MechanismHook
from privet.audit_setup import setup as audit_setup
from server.audit_merge import audit_merge_refusal
from server.audit_text import AuditedMechanism, AuditSection
from server.results import write_audit

__all__ = ["AuditReport", "MechanismAudit", "audit", "add_parser", "client_release", "cmd_audit"]

#: Importable here as before the split; they live in :mod:`privet.audit_games` and :mod:`privet.audit_setup`.
_REEXPORTED = (CANARY_NORM, RECORD_FEATURE, STAND_IN_DIM, RUN_ID, AuditConfigError, CanaryWork)

#: Default canaries (client-level: canary clients; record-level: canary records in one shard).
DEFAULT_CANARIES: Final = 1000
#: The deviating server asks for this many times the T rounds the run declared.
DEFAULT_EXTENSION: Final = 2


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class MechanismAudit:
    """One mechanism's audit: the statistics and what the game ran and observed.

    Attributes
    ----------
    game : str
        A registered game's name (:data:`privet.audit_games.GAMES`).
    level : str
        ``client`` or ``record``: what one canary is.
    mechanism : str
        The client mechanism's kind (:attr:`privacy.mechanisms.Mechanism.kind`).
    observes : str
        What the game's adversary sees.
    result : AuditResult
        The bounds, the estimate, the charge and the flag.
    noise_multiplier, sample_rate, clip : float
        σ sent, q of one release, C (as the client's plan set them).
    steps, rounds_declared, rounds_requested, releases_per_canary : int
        Steps per release, T, the rounds the server asked for, the most releases one canary made.
    noise_source : str
        The clients' DP randomness (the config's ``noise-source``).
    details : dict
        The game's own figures (:attr:`privet.audit_games.Played.details`), if any.
    """

    game: str
    level: str
    mechanism: str
    observes: str
    result: AuditResult
    noise_multiplier: float
    sample_rate: float
    clip: float
    steps: int
    rounds_declared: int
    rounds_requested: int
    releases_per_canary: int
    noise_source: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the charge."""
        return self.result.flagged

    def line(self) -> str:
        """One line naming the mechanism and both figures (:meth:`AuditResult.line`)."""
        return self.result.line()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record."""
        r = self.result
        return {"game": self.game, "level": self.level, "mechanism": self.mechanism, "observes": self.observes,
                "flagged": self.flagged, "line": self.line(), "lower_bound": _finite(r.lower_bound),
                "one_run_bound": _finite(r.one_run_bound), "threshold_bound": _finite(r.threshold_bound),
                "one_shot_epsilon": _finite(r.one_shot_epsilon), "charged_epsilon": r.charged_epsilon,
                "delta": r.delta, "confidence": r.confidence, "canaries": r.canaries, "releases": r.releases,
                "violation": r.violation, "profile": [list(p) for p in r.profile],
                "charged_history": [list(s) for s in r.history], "relation": r.relation, "seconds": r.seconds,
                "noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate, "clip": self.clip,
                "steps": self.steps, "rounds_declared": self.rounds_declared,
                "rounds_requested": self.rounds_requested, "releases_per_canary": self.releases_per_canary,
                "noise_source": self.noise_source, **({"details": self.details} if self.details else {})}


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True)
class AuditReport:
    """Every audited mechanism of one run config, and what was not audited (with why)."""

    strategy: str
    dp_mode: str
    client: int
    epsilon_budget: float
    audits: tuple[MechanismAudit, ...]
    not_audited: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def flagged(self) -> tuple[MechanismAudit, ...]:
        """The audits whose lower bound exceeds the charge."""
        return tuple(a for a in self.audits if a.flagged)

    def lines(self) -> list[str]:
        """The text report."""
        out = [f"privet audit: {self.strategy}, dp-mode {self.dp_mode}, client {self.client} "
               f"(budget eps={self.epsilon_budget:g}); canary games in this process through privet's client "
               "mechanisms (privet/audit_cmd.py)"]
        for a in self.audits:
            out.append(f"  {a.game} ({a.level} level, mechanism {a.mechanism}, sigma={a.noise_multiplier:.4g}, "
                       f"q={a.sample_rate:.4g}, steps={a.steps}, C={a.clip:g}, T={a.rounds_declared}, server asked "
                       f"for {a.rounds_requested} rounds, a canary released at most {a.releases_per_canary}; "
                       f"noise {a.noise_source})")
            out.append(f"    observes: {a.observes}")
            if a.releases_per_canary == 0:
                out.append("    no canary client released anything (each refused every round): nothing was observed")
            out.append(f"    {a.line()}")
        out += [f"  not audited: {why}" for why in self.not_audited]
        out.append("A lower bound at the stated confidence: above the charge refutes it; below it proves nothing "
                   "beyond 'this attack did not break it'.")
        return out

    def summary_section(self) -> AuditSection:
        """``summary.json``'s ``audit`` section (:class:`server.results.AuditSection`): per mechanism the game,
        canaries, confidence, lower bound, one-shot estimate, charge and flag; ``audit.json`` has the rest.
        """
        mechanisms: list[AuditedMechanism] = [
            {"game": a.game, "level": a.level, "mechanism": a.mechanism, "observes": a.observes,
             "canaries": a.result.canaries, "confidence": a.result.confidence, "delta": a.result.delta,
             "lower_bound": _finite(a.result.lower_bound), "one_shot_epsilon": _finite(a.result.one_shot_epsilon),
             "charged_epsilon": a.result.charged_epsilon, "flagged": a.flagged, "line": a.line()}
            for a in self.audits]
        return {"client": self.client, "strategy": self.strategy, "dp_mode": self.dp_mode,
                "epsilon_budget": _finite(self.epsilon_budget), "flagged": bool(self.flagged),
                "mechanisms": mechanisms, "not_audited": list(self.not_audited),
                "settings": json.loads(json.dumps(self.settings, default=_json_default)), "details": "audit.json"}

    def to_dict(self) -> dict[str, Any]:
        """``audit.json``."""
        return {"strategy": self.strategy, "dp_mode": self.dp_mode, "client": self.client,
                "epsilon_budget": _finite(self.epsilon_budget), "flagged": bool(self.flagged),
                "audits": [a.to_dict() for a in self.audits], "not_audited": list(self.not_audited),
                "settings": self.settings}


# --------------------------------------------------------------------------- the audit
def audit(config: str | None = None, sets: Sequence[str] = (), *, out: str | Path | None = None,
          client: int = 0, canaries: int = DEFAULT_CANARIES, confidence: float = DEFAULT_CONFIDENCE,
          extension: int = DEFAULT_EXTENSION, seed: int | None = None, games: Sequence[str] = (),
          mechanism_hook: MechanismHook | None = None) -> AuditReport:
    """Audit the mechanisms of a run config (module docstring); writes its results into ``out`` if given.

    Parameters
    ----------
    config, sets : str, sequence of str
        As ``privet run``: an experiment TOML and ``key=value`` overrides.
    out : path, optional
        A results folder (created): ``audit.json`` (every figure), and the audit's section in
        ``summary.json``, ``privacy_report.md`` and ``report.html``
        (:func:`server.results.write_audit`). A folder holding a ``privet run`` of the same config
        keeps the run's content, the audit added; one of another config is refused before any work.
        A later ``privet run`` into ``out`` keeps the audit only if it is of the run's config
        (:func:`server.audit_merge.carried_audit`).
    client : int
        The audited client's partition id (its budget, its group).
    canaries : int
        Canary clients (client level) or canary records (record level, at most the shard).
    confidence : float
        Of the lower bounds and the flag.
    extension : int
        The server asks for ``extension`` times the declared T rounds (>= 1).
    seed : int, optional
        The auditor's own randomness (secrets, directions, sampling coins); never the clients' noise.
    games : sequence of str, optional
        Registered games to run instead of the mechanism's default (:data:`privet.audit_games.GAMES`),
        e.g. ``["dpsgd", "dpsgd-steps"]``; each must audit the config's client mechanism.
    mechanism_hook : callable, optional
        **Tests only**: wraps the mechanism of every client round, to check that a broken one is caught.

    Raises
    ------
    privet.cli.CliError
        For a bad configuration or option (one line naming it).
    """
    from privet.run_config import CliError, check_out_dir, load_experiment, validate

    if canaries < 2:
        raise CliError(f"--canaries must be an integer >= 2; found {canaries}")
    if not 0.5 <= confidence < 1:
        raise CliError(f"--confidence must be in [0.5, 1); found {confidence}")
    if extension < 1:
        raise CliError(f"--extension must be an integer >= 1; found {extension}")
    run_config = load_experiment(config, list(sets), None)
    validate(run_config)
    if out is not None:
        check_out_dir(Path(out))
    try:
        setup = audit_setup(run_config, client)
        chosen, skipped = select(setup, games)
    except AuditConfigError as exc:
        raise CliError(str(exc)) from None
    refusal = audit_merge_refusal(out, setup.cfg) if out is not None else None
    if refusal:  # before any game runs
        raise CliError(f"--out: {refusal}")
    rng = np.random.default_rng(seed)
    audits = []
    for game in chosen:
        started = time.perf_counter()
        try:
            played = game.run(setup, canaries=canaries, extension=extension, rng=rng, hook=mechanism_hook)
        except AuditConfigError as exc:
            raise CliError(str(exc)) from None
        result = assess(played.observation, game.name, delta=setup.profile.delta, confidence=confidence,
                        accountant=played.accountant, started=started)
        audits.append(MechanismAudit(
            game=game.name, level=game.level, mechanism=played.mechanism, observes=game.observes, result=result,
            noise_multiplier=float(played.noise_multiplier), sample_rate=float(played.sample_rate),
            clip=float(played.clip), steps=int(played.steps), rounds_declared=setup.train.num_rounds,
            rounds_requested=int(played.rounds_requested), releases_per_canary=int(played.releases_per_canary),
            noise_source=setup.profile.noise_source, details=played.details))
    report = AuditReport(setup.cfg.strategy, setup.train.dp_mode, client, setup.profile.epsilon_budget,
                         tuple(audits), tuple(skipped),
                         {"canaries": canaries, "confidence": confidence, "extension": extension, "seed": seed,
                          "stand_in_dim": STAND_IN_DIM, "config": config, "set": list(sets)})
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "audit.json").write_text(json.dumps(report.to_dict(), indent=1, default=_json_default))
        write_audit(out, report.summary_section(), setup.cfg)
    return report


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


# --------------------------------------------------------------------------- the command
AUDIT_HELP = """\
Measure each privacy mechanism of a run config empirically: run it on canaries (in this
process, through privet's own client mechanisms, calibration and ledger; no Flower run),
attack what the threat model's adversary sees, and print per mechanism the empirical eps
(a lower bound at --confidence, and Andrew et al.'s one-shot estimate) beside the eps the
ledger charged. Exit status 1, with one line naming the mechanism and both figures, when a
lower bound exceeds the charge; 2 on a bad configuration. With --out DIR: DIR/audit.json
(every figure), and an "Empirical privacy audit" section in DIR/summary.json ("audit"),
DIR/privacy_report.md and DIR/report.html; a DIR that holds a privet run of the same config
keeps the run's report, the audit added (one of another config is refused). A later privet run
of the same config into DIR keeps the audit; one of another config leaves it out, renames
audit.json to audit-of-another-config.json and says so in one line.

Configuration: as privet run (defaults < CONFIG.toml < --set KEY=VALUE).

examples:
  privet audit
  privet audit --set dp-mode=update --set num-server-rounds=2 --out results/audit
  privet run my.toml --out results/r1 && privet audit my.toml --out results/r1   (the run's report + audit)
  privet audit experiments/baselines/udp-fedavg.toml --canaries 4000"""


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
    parser.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """``privet audit``: print the report; 1 with the flagged line(s) on stderr when a charge is refuted.

    A bad configuration or option: one line, status 2 (as :func:`privet.cli.main` prints a ``CliError``;
    caught here too, so that ``python -m privet.cli``, whose ``CliError`` is ``__main__``'s, says the same).
    """
    from privet.run_config import CliError

    if getattr(args, "runtime", "games") == "flower":
        from privet.audit_flower import cmd_audit_flower

        return cmd_audit_flower(args)
    try:
        report = audit(args.config, args.set or [], out=args.out, client=args.client, canaries=args.canaries,
                       confidence=args.confidence, extension=args.extension, seed=args.seed,
                       games=args.game or ())
    except CliError as exc:
        print(f"privet: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()), flush=True)
    if args.out:
        print(f"audit.json: {Path(args.out) / 'audit.json'}; report: {Path(args.out) / 'report.html'}")
    for flagged in report.flagged:
        print(f"privet: audit: {flagged.line()}", file=sys.stderr)
    return 1 if report.flagged else 0


def __getattr__(name: str) -> Any:
    """``GAME_OBSERVES`` and ``GAME_LEVEL`` (game name -> what it observes, what one canary is), from the registry."""
    if name == "GAME_OBSERVES":
        return {g.name: g.observes for g in games()}
    if name == "GAME_LEVEL":
        return {g.name: g.level for g in games()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
