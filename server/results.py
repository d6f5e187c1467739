"""The results directory of a run, and the privacy report.

::

    <out>/config.json          the resolved run config
    <out>/rounds.jsonl         one JSON object per round (accuracy, loss, ε per client, bytes, drops)
    <out>/summary.json         strategy, rounds, final_accuracy (and personalized), clients[...]
    <out>/privacy_report.md    the report ``privet report <out>`` prints
    <out>/progress.png         accuracy and max/mean ε over rounds
    <out>/report.html          the same, self-contained, with budget bars and the config (server/report_html.py)

ε values are JSON numbers; an unbounded ε (no DP) is written as ``null`` with the client's
``guarantee`` saying so.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from privacy.accountants import REPLACE_ONE, exceeds_budget
from privacy.dp_modes import DP_MODES
from server.config import RunConfig
from strategies.base import ClientAccount, PrivacyAwareFedAvg
from strategies.gdpfed import GDPFED_STRATEGIES


class ClientSummary(TypedDict):
    """One client's privacy position in ``summary.json`` (every key spelled here once)."""

    client_id: str
    node_id: int
    epsilon_budget: float | None
    epsilon_spent: float | None
    epsilon_spent_before_run: float | None
    epsilon_server_recomputed_this_run: float | None
    delta: float
    num_examples: int
    rounds_joined: list[int]
    dropped_rounds: list[int]
    rejections: list[dict[str, Any]]
    exhausted: bool
    within_budget: bool
    relation: str
    guarantee_unit: str
    noise_source: str
    guarantee: str
    not_covered: list[str]


class RunSummary(TypedDict):
    """``summary.json``: what a run achieved and every client's position; experiment drivers read it
    with these keys (``None`` where a figure does not exist, e.g. accuracy before any round)."""

    strategy: str
    dp_mode: str
    dataset: str
    evaluation_split: str
    model: str
    rounds: int
    rounds_completed: int
    final_accuracy: float | None
    best_accuracy: float | None
    final_loss: float | None
    final_personalized_accuracy: float | None
    best_personalized_accuracy: float | None
    accountant: str
    clip: float
    noise_multiplier: float | str
    noise_shares: int
    secure_aggregation: dict[str, Any] | str
    elapsed_seconds: float
    dropped: list[str]
    failed_rounds: list[dict[str, Any]]
    refused: list[dict[str, Any]]
    clients: list[ClientSummary]
    group_dp: NotRequired[dict[str, Any]]  # GDPFed family: the group plan, the aggregation
    dpfedc: NotRequired[dict[str, Any]]  # DP-FedC: what its ε means under its calibration
    status: NotRequired[str]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ResultsWriter:
    """Writes one run's results directory as the run goes."""

    def __init__(self, out_dir: str | os.PathLike[str], cfg: RunConfig) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.rounds: list[dict[str, Any]] = []
        _atomic_write(self.out / "config.json", json.dumps(cfg.model_dump(by_alias=True), indent=2))
        (self.out / "rounds.jsonl").write_text("")

    def write_round(self, line: dict[str, Any]) -> None:
        self.rounds.append(line)
        with open(self.out / "rounds.jsonl", "a") as fh:
            fh.write(json.dumps(_jsonable(line)) + "\n")

    def save_model(self, server_round: int, weights: dict[str, np.ndarray], final: bool = False) -> None:
        """The global model after ``server_round``: ``model-round-<r>.npz`` (``checkpoint-rounds``),
        and ``model.npz`` for the last round (arrays named as the model's ``state_dict``)."""
        names = (["model.npz"] if final else []) + (
            [f"model-round-{server_round:04d}.npz"] if server_round in self.cfg.checkpoint_rounds else [])
        for name in names:
            tmp = self.out / f".{name}"
            with open(tmp, "wb") as fh:
                np.savez(fh, **weights)  # type: ignore[arg-type]  # numpy stubs read a name as allow_pickle
            os.replace(tmp, self.out / name)

    def finish(self, strategy: PrivacyAwareFedAvg, elapsed_seconds: float, status: str = "completed") -> RunSummary:
        """Write summary, privacy report and plot; ``status`` says how the run ended."""
        summary = build_summary(self.cfg, strategy, self.rounds, elapsed_seconds)
        if status == "completed" and summary["failed_rounds"]:
            status = (f"incomplete: {len(summary['failed_rounds'])} of {summary['rounds']} rounds failed "
                      f"(rounds {', '.join(str(f['round']) for f in summary['failed_rounds'])})")
        summary["status"] = status
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


def _guarantee(mode: str, account: ClientAccount, noise_shares: int, secure: int = 0) -> str:
    """The exact statement one client's ε makes: unit, relation, against whom.

    ``secure``: r_min when the client's updates left only inside secure sums (0: none).
    """
    if mode in DP_MODES and not DP_MODES[mode].private or math.isinf(account.epsilon_budget):
        return "none (non-private)"
    unit = ("its whole dataset (client-level)" if account.guarantee_unit == "client"
            else "any one of its records (record-level)")
    how = DP_MODES[mode].mechanism(noise_shares, secure) if mode in DP_MODES else mode
    if account.noise_source == "seeded":
        against = "no one who knows the run seed: its noise was seeded reproducibly (noise-source = seeded)"
    elif secure:  # secure sums carry update-mode uploads only (config validation)
        against = ("the server and other clients, as long as no sum member colludes with the server (k colluding "
                   f"members who reveal their noise leave sigma*sqrt(({secure}-k)/{noise_shares})), and observers "
                   "of the model")
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
        clients.append({
            "client_id": a.client_id,
            # the identity Flower authenticated (with SuperNode authentication: bound to its key);
            # client_id is what the node declared, unique per run (duplicates are refused)
            "node_id": a.node_id,
            "epsilon_budget": _finite(a.epsilon_budget),
            "epsilon_spent": _finite(a.epsilon_spent),
            "epsilon_spent_before_run": _finite(a.epsilon_at_start),
            "epsilon_server_recomputed_this_run": _finite(server_eps),
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
            "guarantee": _guarantee(mode, a, cfg.noise_shares, secure_floor)
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
        "secure_aggregation": ({"protocol": "SecAgg+ (Flower's stages; ChaCha20 masks)",
                                **cfg.secagg.model_dump(by_alias=True),
                                "trust_model": "the server sees only sums of at least r_min updates"}
                               if secure else "none: the server sees every client's upload"),
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


def format_privacy_report(summary: RunSummary) -> str:
    """The human-readable privacy report of a run (markdown)."""
    def eps(x: float | None) -> str:
        return "inf" if x is None else f"{x:.4f}"

    lines = [
        f"# Privacy report: {summary['strategy']} ({summary['dp_mode']})",
        "",
        f"Dataset {summary['dataset']}, model {summary['model']}, "
        f"{summary['rounds_completed']}/{summary['rounds']} rounds, accountant {summary['accountant']}, "
        f"clip {summary['clip']}, noise multiplier {summary['noise_multiplier']}.",
        f"Run status: {summary.get('status', 'completed')}.",
        f"Final {summary.get('evaluation_split', 'test')} accuracy: {summary['final_accuracy']}"
        + (f"; clients' personal models: {summary['final_personalized_accuracy']}"
           if summary.get("final_personalized_accuracy") is not None else ""),
        "",
        "| client | budget eps | spent eps | before run | server check (this run) | delta | rounds | dropped | within budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["clients"]:
        lines.append(
            f"| {c['client_id']} | {eps(c['epsilon_budget'])} | {eps(c['epsilon_spent'])} | "
            f"{eps(c['epsilon_spent_before_run'])} | {eps(c['epsilon_server_recomputed_this_run'])} | "
            f"{c['delta']:g} | {len(c['rounds_joined'])} | {len(c['dropped_rounds'])} | "
            f"{'n/a (no budget)' if c['epsilon_budget'] is None else 'yes' if c['within_budget'] else 'NO'} |"
        )
    over = [c["client_id"] for c in summary["clients"] if c["epsilon_budget"] is not None and not c["within_budget"]]
    lines += ["", f"Clients over budget: {', '.join(over) if over else 'none'}."]
    if summary["dropped"]:
        lines.append(f"Clients that dropped out of at least one round: {', '.join(summary['dropped'])}.")
    rejected = [(c["client_id"], r) for c in summary["clients"] for r in c["rejections"]]
    for cid, r in rejected:
        lines.append(f"- round {r['round']}: client {cid}: {r['reason']}")
    if summary.get("refused"):
        lines += ["", "## Sites refused at the handshake (never scheduled, no budget spent here)", ""]
        lines += [f"- {r['client_id']} (node {r['node_id']}): {r['reason']}" for r in summary["refused"]]
    if summary.get("failed_rounds"):
        lines += ["", "## Failed rounds (no new global model; what clients spent in them is counted above)", ""]
        lines += [f"- round {f['round']}: {f['reason']}" for f in summary["failed_rounds"]]
    guarantees: dict[str, list[str]] = {}
    for c in summary["clients"]:
        guarantees.setdefault(c["guarantee"], []).append(str(c["client_id"]))
    if guarantees:
        lines += ["", "## What each client's epsilon guarantees", ""]
        for text, ids in guarantees.items():
            lines.append(f"- clients {', '.join(ids)}: {text}.")
    uncovered = [(c["client_id"], what) for c in summary["clients"] for what in c.get("not_covered", [])]
    lines += ["", "## Not covered by any client's epsilon", ""]
    lines += [f"- client {cid}: {what}" for cid, what in uncovered] or ["- nothing beyond what every reply carries:"]
    lines += [
        "- every reply also carries the client's example count (public under replace-one), its budget, delta and",
        "  spent epsilon, and the mechanism's sigma, q and step count: functions of public figures only;",
        *_secure_lines(summary.get("secure_aggregation")),
        "- floating-point attacks on the Gaussian sampler are not countered.",
        "",
        "'spent eps' is the client's own ledger (cumulative over all runs it took part in); 'server check' is",
        "recomputed by the server from the mechanism each accepted reply reported, after checking what it can",
        "derive itself (example count, the sigma it set, DP-SGD's q and steps); a reply whose claimed epsilon is",
        "below that recomputation is rejected. The server cannot see the noise a client actually added.",
    ]
    return "\n".join(lines) + "\n"


def _secure_lines(secure: Any) -> list[str]:
    """The report's lines on who saw individual uploads."""
    if not isinstance(secure, dict):
        return ["- secure aggregation is not used: the server sees every upload, and each is charged on its own;"]
    return [
        f"- secure aggregation ({secure['protocol']}, threshold {secure['threshold']}, r_min "
        f"{secure['min-survivors'] or 'noise-shares'}, {secure['bits']} bits): {secure['trust_model']};",
        "  it cannot stop a malicious client from sending an unclipped update (only a gross one fails the sum's",
        "  norm check), and the quantisation before the sum is outside the accounting;",
    ]


def plot_progress(rounds: list[dict[str, Any]], path: Path) -> None:
    """Accuracy and max/mean spent ε over rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["round"] for r in rounds if r.get("accuracy") is not None]
    acc = [r["accuracy"] for r in rounds if r.get("accuracy") is not None]
    eps_rounds = [r for r in rounds if r.get("epsilon_spent_max") is not None and r.get("num_registered")]
    private = any(r["epsilon_spent_max"] > 0 for r in eps_rounds)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.plot(xs, acc, marker="o")
    ax1.set_xlabel("round")
    ax1.set_ylabel("test accuracy")
    ax1.grid(alpha=0.3)
    if private:  # statistics over every registered client, written with each round
        ex = [r["round"] for r in eps_rounds]
        ax2.plot(ex, [r["epsilon_spent_max"] for r in eps_rounds], marker="o", label="max over clients")
        ax2.plot(ex, [r["epsilon_spent_mean"] for r in eps_rounds], marker="s", label="mean over clients")
        ax2.legend()
    else:  # a non-private run: nothing to draw, and no axis pretending otherwise
        ax2.text(0.5, 0.5, "non-private run:\nno epsilon spent or bounded", ha="center", va="center",
                 transform=ax2.transAxes)
        ax2.set_xticks([])
        ax2.set_yticks([])
    ax2.set_xlabel("round")
    ax2.set_ylabel("cumulative epsilon spent")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2) if private else (ax1,):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
