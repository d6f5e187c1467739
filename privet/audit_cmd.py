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
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from client.release import client_release
from privacy.auditing import DEFAULT_CONFIDENCE
from privacy.mechanism_audit import assess
from privet.audit_defaults import DEFAULT_CANARIES, DEFAULT_EXTENSION
from privet.audit_dpsgd import RECORD_FEATURE
from privet.audit_games import CANARY_NORM, STAND_IN_DIM, CanaryWork, games, select
from privet.audit_setup import RUN_ID, AuditConfigError, MechanismHook
from privet.audit_setup import setup as audit_setup
from server.audit_merge import audit_merge_refusal
from server.audit_text import AuditRecord, AuditSection, json_epsilon
from server.results import write_audit

__all__ = ["AuditReport", "MechanismAudit", "audit", "client_release", "cmd_audit"]

#: Importable here as before the splits; they live in :mod:`privet.audit_games`, :mod:`privet.audit_setup` and
#: :mod:`privet.audit_cli` (the command line: options, defaults and help).
_REEXPORTED = (CANARY_NORM, RECORD_FEATURE, STAND_IN_DIM, RUN_ID, AuditConfigError, CanaryWork, DEFAULT_CANARIES,
               DEFAULT_EXTENSION)



# --------------------------------------------------------------------------- results
@dataclass(frozen=True, kw_only=True)
class MechanismAudit(AuditRecord):
    """One mechanism's audit by a canary game in this process: the statistics and what the game ran and observed.

    The result, mechanism, σ, C, releases per canary and noise source, the flag and the line are
    :class:`server.audit_text.AuditRecord`'s (shared with the real-run audit's records).

    Attributes
    ----------
    game : str
        A registered game's name (:data:`privet.audit_games.GAMES`).
    level : str
        ``client`` or ``record``: what one canary is.
    observes : str
        What the game's adversary sees.
    sample_rate : float
        q of one release (as the client's plan set it).
    steps, rounds_declared, rounds_requested : int
        Steps per release, T, the rounds the server asked for.
    details : dict
        The game's own figures (:attr:`privet.audit_games.Played.details`), if any.
    """

    game: str
    level: str
    observes: str
    sample_rate: float
    steps: int
    rounds_declared: int
    rounds_requested: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record (``audit.json``)."""
        return {"game": self.game, "level": self.level, "mechanism": self.mechanism, "observes": self.observes,
                **self.result_record(), "noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate,
                "clip": self.clip, "steps": self.steps, "rounds_declared": self.rounds_declared,
                "rounds_requested": self.rounds_requested, "releases_per_canary": self.releases_per_canary,
                "noise_source": self.noise_source, **({"details": self.details} if self.details else {})}


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
            out.append(f"    charged: {a.result.describe_charges()}")
            if a.releases_per_canary == 0:
                out.append("    no canary client released anything (each refused every round): nothing was observed")
            out.append(f"    {a.line()}")
        out += [f"  not audited: {why}" for why in self.not_audited]
        out.append("A lower bound at the stated confidence: above the charge refutes it; below it proves nothing "
                   "beyond 'this attack did not break it'.")
        return out

    def summary_section(self) -> AuditSection:
        """``summary.json``'s ``audit`` section (:class:`server.audit_text.AuditSection`): per mechanism the game,
        canaries, confidence, lower bound, one-shot estimate, charge and flag; ``audit.json`` has the rest.
        """
        mechanisms = [a.summary_entry(a.game, a.level, a.observes) for a in self.audits]
        return {"client": self.client, "strategy": self.strategy, "dp_mode": self.dp_mode,
                "epsilon_budget": json_epsilon(self.epsilon_budget), "flagged": bool(self.flagged),
                "mechanisms": mechanisms, "not_audited": list(self.not_audited),
                "settings": json.loads(json.dumps(self.settings, default=_json_default)), "details": "audit.json"}

    def to_dict(self) -> dict[str, Any]:
        """``audit.json``."""
        return {"strategy": self.strategy, "dp_mode": self.dp_mode, "client": self.client,
                "epsilon_budget": json_epsilon(self.epsilon_budget), "flagged": bool(self.flagged),
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
