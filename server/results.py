"""The results directory of a run: what it holds, written as the run goes (the report: server/privacy_report.py).

::

    <out>/config.json          the resolved run config
    <out>/rounds.jsonl         one JSON object per round (accuracy, loss, ε per client, bytes, drops)
    <out>/summary.json         strategy, rounds, final_accuracy (and personalized), clients[...]
    <out>/privacy_report.md    the report ``privet report <out>`` prints
    <out>/progress.png         accuracy and max/mean ε over rounds
    <out>/report.html          the same, self-contained, with budget bars and the config (server/report_html.py)

``privet audit --out <out>`` adds its figures to the same files (:func:`write_audit`): an
``audit`` section in ``summary.json`` (:class:`AuditSection`), an "Empirical privacy audit"
section in ``privacy_report.md`` and report.html, beside its own ``audit.json``. Into a run's
directory it merges (the run's content is kept); into an empty one it writes those files with
the audit alone. A later run into a directory holding an audit keeps it if it is of the run's
configuration, and otherwise leaves it out, renames its ``audit.json`` and logs one line
(:func:`server.audit_merge.carried_audit`).

ε values are JSON numbers; an unbounded ε (no DP) is written as ``null`` with the client's
``guarantee`` saying so.

Each client's ``epsilon_spent`` is what the server knows for sure (the last accepted reply, or the
handshake); ``epsilon_spent_at_most`` bounds its ledger from above, counting what the rounds it was
sampled in but sent no accepted reply for may have charged (``possibly_charged_rounds``: dropped or
rejected replies, and the round in flight when a run is interrupted; :func:`spend_bound`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from privacy.accountants import BUDGET_RTOL, REPLACE_ONE, Charge, epsilon_of, exceeds_budget
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.mechanisms import Mechanism
from server.audit_merge import carried_audit, config_record
from server.audit_text import AuditSection
from server.config import RunConfig
from server.privacy_report import format_privacy_report
from server.progress_plot import plot_progress
from server.summary_schema import ClientSummary, RunSummary
from server.threat_model import threat_model
from strategies.base import ClientAccount, PrivacyAwareFedAvg
from strategies.catalogue import CATALOGUE
from strategies.gdpfed import GDPFED_STRATEGIES


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunInterrupted(KeyboardInterrupt):
    """Raised in the ServerApp's thread when its process is told to stop (SIGINT, SIGTERM)."""


def _raise_in(thread: threading.Thread, exc_type: type[BaseException]) -> bool:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction (CPython's async exception)."""
    if thread.ident is None:
        return False
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))
    return bool(done == 1)


def interrupt_on_exit_signal(timeout: float = 60.0) -> None:
    """Make Flower's graceful exit of this process interrupt the calling thread, which runs the ServerApp.

    Flower's simulation (``flwr-simulation``) runs the ServerApp in a thread of its own and handles
    SIGINT in the main thread (``flwr.supercore.exit``; SIGTERM there is Ray's, which only calls
    ``sys.exit``, so ``privet run`` stops an interrupted simulation with SIGINT): it stops the
    Simulation Runtime and exits, while the ServerApp thread, waiting for replies, would never hear
    of it. Registered as
    one of Flower's exit handlers that run before its force-exit timer, this raises
    :class:`RunInterrupted` in the ServerApp's thread and waits up to ``timeout`` seconds for it to
    end, so that the ServerApp's handler writes what the server knows (``summary.json`` with
    ``status: interrupted``). Where the ServerApp runs in the main thread (a deployed
    ``flwr-serverapp``, the in-process backend) the signal reaches it directly and nothing is done.
    """
    try:
        from flwr.supercore.exit import add_exit_handler
    except ImportError:  # a Flower without this hook: the signal ends the process as Flower decides
        return
    thread = threading.current_thread()

    def interrupt() -> None:
        if thread is threading.main_thread() or thread is threading.current_thread() or not thread.is_alive():
            return
        if _raise_in(thread, RunInterrupted):
            thread.join(timeout)

    add_exit_handler(interrupt, run_before_force_exit=True)


class ResultsWriter:
    """Writes one run's results directory as the run goes.

    Created in the thread that runs the strategy; from then on a SIGINT or SIGTERM of the process
    interrupts that thread (:func:`interrupt_on_exit_signal`), so an interrupted run still writes
    its summary.

    A directory that holds ``privet audit``'s results of the same configuration keeps them: the
    summary, privacy report and page this run writes carry the audit's section, ``audit.json`` is
    untouched. An audit of another configuration is left out of them, its ``audit.json`` renamed
    ``audit-of-another-config.json``, with one warning line (:func:`server.audit_merge.carried_audit`).
    """

    def __init__(self, out_dir: str | os.PathLike[str], cfg: RunConfig) -> None:
        if threading.current_thread() is not threading.main_thread():
            interrupt_on_exit_signal()
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.rounds: list[dict[str, Any]] = []
        #: the folder's audit of this config, kept in the summary (read before config.json is rewritten)
        self.audit = carried_audit(self.out, cfg)
        _atomic_write(self.out / "config.json", json.dumps(config_record(cfg), indent=2))
        (self.out / "rounds.jsonl").write_text("")

    def write_round(self, line: dict[str, Any]) -> None:
        """Keep one round's record and append it to ``rounds.jsonl`` (one JSON line per round)."""
        self.rounds.append(line)
        with open(self.out / "rounds.jsonl", "a") as fh:
            fh.write(json.dumps(_jsonable(line)) + "\n")

    def save_model(self, server_round: int, weights: dict[str, np.ndarray], final: bool = False) -> None:
        """The global model after ``server_round``: ``model-round-<r>.npz`` (``checkpoint-rounds``),
        and ``model.npz`` for the last round (arrays named as the model's ``state_dict``).
        """
        names = (["model.npz"] if final else []) + (
            [f"model-round-{server_round:04d}.npz"] if server_round in self.cfg.checkpoint_rounds else [])
        for name in names:
            tmp = self.out / f".{name}"
            with open(tmp, "wb") as fh:
                np.savez(fh, **weights)  # type: ignore[arg-type]  # numpy stubs read a name as allow_pickle
            os.replace(tmp, self.out / name)

    def finish(self, strategy: PrivacyAwareFedAvg, elapsed_seconds: float, status: str = "completed") -> RunSummary:
        """Write summary, privacy report and plot; ``status`` says how the run ended
        (:func:`ended_by` gives it for an exception).
        """
        summary = build_summary(self.cfg, strategy, self.rounds, elapsed_seconds)
        if status == "completed" and summary["failed_rounds"]:
            status = (f"incomplete: {len(summary['failed_rounds'])} of {summary['rounds']} rounds failed "
                      f"(rounds {', '.join(str(f['round']) for f in summary['failed_rounds'])})")
        summary["status"] = status
        if self.audit is not None:  # rendered from the summary by the report and the page, as write_audit's
            summary["audit"] = self.audit
        _atomic_write(self.out / "summary.json", json.dumps(summary, indent=2))
        _atomic_write(self.out / "privacy_report.md", format_privacy_report(summary))
        plot_progress(self.rounds, self.out / "progress.png")
        from server.report_html import write_report

        try:  # the page is a view of the files above: a bug in it must not fail the run
            write_report(self.out)
        except Exception as exc:  # noqa: BLE001
            logging.getLogger("privet.server").warning("could not write report.html: %s: %s",
                                                       type(exc).__name__, exc)
        return summary


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _mechanism(strategy: PrivacyAwareFedAvg, account: ClientAccount) -> Mechanism | None:
    """The mechanism the strategy asked this client to run (None: no round was configured).

    That of the last round whose reply from this client was accepted (a GDPFed or secure-sum
    client not sampled in the run's last round has no sum there to build its mechanism from),
    else of the last round.
    """
    rounds = sorted((r for r in strategy.round_log if r.round > 0), key=lambda r: r.round, reverse=True)
    mine = [r.round for r in rounds if account.client_id in r.accepted]
    for server_round in [*mine[:1], max((r.round for r in rounds), default=1)]:
        try:
            return strategy.mechanism(server_round, account)
        except (ValueError, KeyError):
            continue
    return None


def _guarantee(mode: str, account: ClientAccount, noise_shares: int, mechanism: Mechanism | None,
               secure: int = 0, roster: bool = False) -> str:
    """The exact statement one client's ε makes: unit, relation, against whom.

    ``mechanism``: what it ran (its own sentence says how); ``secure``: r_min when the client's
    updates left only inside secure sums (0: none).
    """
    if (mechanism is not None and not mechanism.private) or math.isinf(account.epsilon_budget):
        return "none (non-private)"
    how = mechanism.guarantee() if mechanism is not None else f"dp-mode {mode}"
    unit = ("its whole dataset (client-level)" if account.guarantee_unit == "client"
            else "any one of its records (record-level)")
    if account.noise_source == "seeded":
        against = "no one who knows the run seed: its noise was seeded reproducibly (noise-source = seeded)"
    elif secure and not roster:
        against = ("a server that follows the protocol (no roster authenticates the sum's members: a deviating "
                   "server could expose one update), other clients and observers of the model")
    elif secure:  # secure sums carry update-mode uploads only (config validation)
        left = (f"the charge of {secure}-k noise shares" if mechanism is not None and mechanism.kind == "secure-ddg"
                else f"sigma*sqrt(({secure}-k)/{noise_shares})")
        against = ("the server, even one that deviates from the protocol, and other clients, as long as no sum "
                   f"member colludes with it (k colluding members who reveal their noise leave {left}), "
                   "and observers of the model")
    else:
        against = "anyone who sees what it sends (the server, other clients, observers of the model)"
    return (f"(eps, delta)-DP of {unit} under replace-one (the dataset size is public), via {how}; "
            f"holds against {against}")


def _outside(account: ClientAccount) -> list[str]:
    """What this client released that its ε does not cover."""
    out = []
    if account.client_evaluation:
        out.append("evaluation loss/accuracy on its private data (its operator allowed evaluation)")
    if account.train_metrics:
        out.append("training loss, time and update norm (its operator enabled report-train-metrics)")
    if account.noise_source == "seeded":
        out.append("its noise: regenerable from the run seed")
    return out


def unaccepted_rounds(strategy: PrivacyAwareFedAvg, account: ClientAccount, last_round: int) -> list[int]:
    """The rounds ``account`` was sampled in without an accepted reply: dropped, rejected, or in flight."""
    return [r for r in range(1, last_round + 1)
            if account.node_id in strategy.book.sampled(r) and r not in account.rounds]


def spend_bound(strategy: PrivacyAwareFedAvg, account: ClientAccount, last_round: int) -> tuple[float, list[int]]:
    """An upper bound on the ε in ``account``'s ledger, and the rounds that may have cost it more than
    the server knows.

    The server knows for sure ε_known, the cumulative ε of the client's last accepted reply (or its
    handshake). A round it was sampled in without an accepted reply may have charged the ledger with
    the mechanism the server asked for there (:meth:`~strategies.base.PrivacyAwareFedAvg.mechanism`):
    σ fixed by the server, or the σ the client calibrated once for the run (the one its accepted
    replies of this run reported). With H the charges the server verified this run and E those of
    the unaccepted rounds, the ledger holds the client's history before the run (ε_0) composed with
    a subset of H ∪ E, so

        ε_ledger <= min(ε_0 ⊕ ε(H ∪ E), ε_known + ε(E), cap),

    where ε_0 ⊕ x is x when ε_0 = 0 (the same accountant over the same charges: exact) and ε_0 + x
    otherwise (composition is subadditive at a fixed δ: for RDP because the conversion term is paid
    once; the PRV accountant's ε is an upper bound on the same profile), and cap = the client's
    budget, or its run's cap ε_0 + run-epsilon for a calibrated run with a target: an honest client's
    ledger refuses any charge beyond them (``BUDGET_RTOL`` slack). Where σ cannot be known (a
    calibrated client without an accepted reply this run) only the cap bounds the ledger.
    """
    known = account.epsilon_spent
    rounds = unaccepted_rounds(strategy, account, last_round)
    if not rounds or not math.isfinite(known):
        return known, rounds
    limit = account.epsilon_budget
    extra: list[Charge] = []
    derivable = True
    for j, server_round in enumerate(rounds):
        try:
            mechanism = strategy.mechanism(server_round, account)
        except ValueError:  # a config no client can run: each refuses it before charging
            continue
        if not mechanism.private:
            return math.inf, rounds
        target = mechanism.calibration.target_epsilon if mechanism.calibration is not None else 0.0
        if mechanism.noise_multiplier <= 0 and target > 0:
            limit = min(limit, account.epsilon_at_start + target)
        sigma = mechanism.noise_multiplier
        if sigma <= 0:  # calibrated once per run: what its accepted replies of this run reported
            last = account.server_history[-1] if account.server_history else None
            if last is None or not isinstance(last, tuple):  # none, or a curve step: no σ to read back
                derivable = False
                continue
            sigma = last[0] / mechanism.scale
        try:
            extra.extend(mechanism.release(sigma, len(account.rounds) + j).charges)
        except PrivacyBudgetExhausted:  # a release the mechanism allows no more of: the client refuses it
            continue
    cap = limit * (1.0 + BUDGET_RTOL)
    if not derivable:
        return max(known, cap), rounds
    if not extra:
        return known, rounds
    this_run = epsilon_of([*account.server_history, *extra], account.delta, strategy.accountant)
    from_start = this_run if account.epsilon_at_start == 0 else account.epsilon_at_start + this_run
    from_known = known + epsilon_of(extra, account.delta, strategy.accountant)
    return max(known, min(cap, from_start, from_known)), rounds


def ended_by(exc: BaseException, strategy: PrivacyAwareFedAvg) -> str:
    """The ``status`` of a run that ``exc`` ended: "interrupted: …" for a signal (Ctrl-C, SIGTERM) or a
    stop from Flower, with the round in flight; "failed: …" otherwise.
    """
    if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return f"failed: {type(exc).__name__}: {exc}"
    last = max((r.round for r in strategy.round_log), default=0) + 1  # a round in flight has no result yet
    in_flight = [r for r in range(1, last + 1) if strategy.book.sampled(r) and strategy.round_result(r) is None]
    where = f"during round {in_flight[-1]}" if in_flight else "between rounds"
    return (f"interrupted {where} (stopped by a signal or by Flower); spend shown as known for sure, "
            "plus at most what unanswered rounds may have charged")


def build_summary(
    cfg: RunConfig, strategy: PrivacyAwareFedAvg, rounds: list[dict[str, Any]], elapsed: float
) -> RunSummary:
    """``summary.json``: the run's outcome and every client's privacy position."""
    evaluated = [r for r in rounds if r.get("accuracy") is not None]
    mode = cfg.resolved_dp_mode
    secure = cfg.secure_aggregation != "none"
    secure_floor = (cfg.secagg.min_survivors or cfg.noise_shares) if secure and cfg.strategy not in GDPFED_STRATEGIES \
        else 0
    clients: list[ClientSummary] = []
    for a in sorted(strategy.accounts.values(), key=lambda a: (len(a.client_id), a.client_id)):
        server_eps = a.server_epsilon(cfg.accountant)
        at_most, unanswered = spend_bound(strategy, a, cfg.num_server_rounds)
        clients.append({
            "client_id": a.client_id,
            # the identity Flower authenticated (with SuperNode authentication: bound to its key);
            # client_id is what the node declared, unique per run (duplicates are refused)
            "node_id": a.node_id,
            "epsilon_budget": _finite(a.epsilon_budget),
            "epsilon_spent": _finite(a.epsilon_spent),
            "epsilon_spent_before_run": _finite(a.epsilon_at_start),
            "epsilon_server_recomputed_this_run": _finite(server_eps),
            # an upper bound on its ledger: what unanswered rounds may have charged too (spend_bound)
            "epsilon_spent_at_most": _finite(at_most),
            "possibly_charged_rounds": unanswered,
            "delta": a.delta,
            "num_examples": a.num_examples,
            "rounds_joined": list(a.rounds),
            "dropped_rounds": list(a.dropped_rounds),
            "rejections": [{"round": r, "reason": why} for r, why in a.rejections],
            "exhausted": a.exhausted,
            "within_budget": not exceeds_budget(a.epsilon_spent, a.epsilon_budget),
            "relation": REPLACE_ONE,
            "guarantee_unit": a.guarantee_unit,
            "noise_source": a.noise_source,
            "guarantee": _guarantee(mode, a, cfg.noise_shares, _mechanism(strategy, a), secure_floor,
                                    bool(cfg.roster))
            + (f"; {strategy.guarantee_note}" if strategy.guarantee_note else ""),  # GDPFed
            "not_covered": _outside(a),
        })
    personal = [r for r in rounds if r.get("personalized_accuracy") is not None]
    summary: RunSummary = {
        "strategy": cfg.strategy,
        "dp_mode": mode,
        "dataset": cfg.dataset,
        "evaluation_split": cfg.evaluation_split,
        "model": cfg.model,
        "rounds": cfg.num_server_rounds,
        # rounds that produced a new global model (a failed round is evaluated, but completed nothing)
        "rounds_completed": len({r["round"] for r in rounds if r["round"] > 0} - set(strategy.failed_rounds)),
        "final_accuracy": evaluated[-1]["accuracy"] if evaluated else None,
        "best_accuracy": max((r["accuracy"] for r in evaluated), default=None),
        "final_loss": evaluated[-1]["loss"] if evaluated else None,
        # PPSGD / CENTAUR: the clients' personal models on their held-out 20 % (None otherwise)
        "final_personalized_accuracy": personal[-1]["personalized_accuracy"] if personal else None,
        "best_personalized_accuracy": max((r["personalized_accuracy"] for r in personal), default=None),
        "accountant": cfg.accountant,
        "clip": cfg.clip,
        "noise_multiplier": ("none (non-private)" if mode == "none"
                             else cfg.noise_multiplier or "calibrated per client"),
        "noise_shares": cfg.noise_shares,
        # who sees individual updates: the trust model every client's epsilon holds under
        "secure_aggregation": ({"protocol": "SecAgg (Bonawitz et al., malicious-server variant; ChaCha20 masks)",
                                "mode": cfg.secure_aggregation,
                                **cfg.secagg.model_dump(by_alias=True),
                                "roster": bool(cfg.roster),
                                "trust_model": "the server sees only sums of at least r_min updates"
                                + ("; members' keys and survivors authenticated against the roster" if cfg.roster
                                   else "; without a roster, against a server that follows the protocol only")}
                               if secure else "none: the server sees every client's upload"),
        "threat_model": threat_model(private=mode != "none", secure=secure, roster=bool(cfg.roster),
                                     group_sums=CATALOGUE[cfg.strategy].group_sums,
                                     nominal=CATALOGUE[cfg.strategy].calibrates_without_budget(cfg),
                                     seeded=any(c["noise_source"] == "seeded" for c in clients)),
        "elapsed_seconds": elapsed,
        "dropped": sorted({c["client_id"] for c in clients if c["dropped_rounds"]}),
        "failed_rounds": [{"round": r, "reason": why} for r, why in sorted(strategy.failed_rounds.items())],
        "refused": [{"node_id": n, "client_id": r.client_id, "reason": r.reason}
                    for n, r in sorted(strategy.refused.items())],
        "clients": clients,
    }
    if hasattr(strategy, "describe"):  # GDPFed family: the group plan and "aggregation": "trusted aggregator"
        summary["group_dp"] = strategy.describe()
    return summary


def write_audit(out: str | os.PathLike[str], audit: AuditSection, cfg: RunConfig) -> dict[str, Any]:
    """Add ``privet audit``'s section, of an audit of ``cfg``, to ``out``'s ``summary.json``,
    ``privacy_report.md`` and ``report.html``.

    A run's ``summary.json`` keeps every key (its ``audit`` is replaced); the report and the page
    are rewritten from it (:func:`format_privacy_report`, :func:`server.report_html.write_report`),
    so they show the run as before plus the audit. The section records ``cfg`` as its
    ``audited_config``, by which a later run into ``out`` keeps it or leaves it out
    (:func:`server.audit_merge.carried_audit`). Check :func:`server.audit_merge.audit_merge_refusal`
    first. Returns the summary as written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    summary: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    summary["audit"] = {**audit, "audited_config": config_record(cfg)}
    _atomic_write(path, json.dumps(summary, indent=2))
    _atomic_write(out / "privacy_report.md", format_privacy_report(summary))  # type: ignore[arg-type]
    from server.report_html import write_report

    write_report(out)
    return summary
