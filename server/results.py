"""The results directory of a run, and the privacy report.

::

    <out>/config.json          the resolved run config
    <out>/rounds.jsonl         one JSON object per round (accuracy, loss, ε per client, bytes, drops)
    <out>/summary.json         strategy, rounds, final_accuracy (and personalized), clients[...]
    <out>/privacy_report.md    the report ``privet report <out>`` prints
    <out>/progress.png         accuracy and max/mean ε over rounds

ε values are JSON numbers; an unbounded ε (no DP) is written as ``null`` with the client's
``guarantee`` saying so.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from server.config import RunConfig
from strategies.base import PrivacyAwareFedAvg


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

    def finish(self, strategy: PrivacyAwareFedAvg, elapsed_seconds: float) -> dict[str, Any]:
        summary = build_summary(self.cfg, strategy, self.rounds, elapsed_seconds)
        _atomic_write(self.out / "summary.json", json.dumps(summary, indent=2))
        _atomic_write(self.out / "privacy_report.md", format_privacy_report(summary))
        plot_progress(self.rounds, self.out / "progress.png")
        return summary


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _guarantee(mode: str, budget: float, noise_shares: int) -> str:
    if mode == "none" or math.isinf(budget):
        return "none (non-private)"
    if mode == "dpsgd":
        return "sample-level (eps, delta)-DP of the client's data (DP-SGD, add/remove one example)"
    local = "local" if noise_shares == 1 else f"per-upload, noise shared by m={noise_shares}"
    return f"client-level (eps, delta)-DP of each upload ({local})"


def build_summary(
    cfg: RunConfig, strategy: PrivacyAwareFedAvg, rounds: list[dict[str, Any]], elapsed: float
) -> dict[str, Any]:
    """``summary.json``: the run's outcome and every client's privacy position."""
    evaluated = [r for r in rounds if r.get("accuracy") is not None]
    mode = cfg.resolved_dp_mode
    clients = []
    for a in sorted(strategy.accounts.values(), key=lambda a: (len(a.client_id), a.client_id)):
        server_eps = a.server_epsilon(cfg.accountant)
        clients.append({
            "client_id": a.client_id,
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
            "within_budget": bool(a.epsilon_spent <= a.epsilon_budget * (1 + 1e-6)),
            "guarantee": _guarantee(mode, a.epsilon_budget, cfg.noise_shares),
        })
    personal = [r for r in rounds if r.get("personalized_accuracy") is not None]
    return {
        "strategy": cfg.strategy,
        "dp_mode": mode,
        "dataset": cfg.dataset,
        "model": cfg.model,
        "rounds": cfg.num_server_rounds,
        "rounds_completed": max((r["round"] for r in rounds), default=0),
        "final_accuracy": evaluated[-1]["accuracy"] if evaluated else None,
        "best_accuracy": max((r["accuracy"] for r in evaluated), default=None),
        "final_loss": evaluated[-1]["loss"] if evaluated else None,
        # PPSGD / CENTAUR: the clients' personal models on their held-out 20 % (None otherwise)
        "final_personalized_accuracy": personal[-1]["personalized_accuracy"] if personal else None,
        "best_personalized_accuracy": max((r["personalized_accuracy"] for r in personal), default=None),
        "accountant": cfg.accountant,
        "clip": cfg.clip,
        "noise_multiplier": cfg.noise_multiplier or "calibrated per client",
        "noise_shares": cfg.noise_shares,
        "elapsed_seconds": elapsed,
        "dropped": sorted({c["client_id"] for c in clients if c["dropped_rounds"]}),
        "clients": clients,
    }


def format_privacy_report(summary: dict[str, Any]) -> str:
    """The human-readable privacy report of a run (markdown)."""
    def eps(x: float | None) -> str:
        return "inf" if x is None else f"{x:.4f}"

    lines = [
        f"# Privacy report: {summary['strategy']} ({summary['dp_mode']})",
        "",
        f"Dataset {summary['dataset']}, model {summary['model']}, "
        f"{summary['rounds_completed']}/{summary['rounds']} rounds, accountant {summary['accountant']}, "
        f"clip {summary['clip']}, noise multiplier {summary['noise_multiplier']}.",
        f"Final test accuracy: {summary['final_accuracy']}"
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
            f"{'yes' if c['within_budget'] else 'NO'} |"
        )
    over = [c["client_id"] for c in summary["clients"] if not c["within_budget"]]
    lines += ["", f"Clients over budget: {', '.join(over) if over else 'none'}."]
    if summary["dropped"]:
        lines.append(f"Clients that dropped out of at least one round: {', '.join(summary['dropped'])}.")
    rejected = [(c["client_id"], r) for c in summary["clients"] for r in c["rejections"]]
    for cid, r in rejected:
        lines.append(f"- round {r['round']}: client {cid}: {r['reason']}")
    if summary["clients"]:
        lines += ["", f"Guarantee: {summary['clients'][0]['guarantee']}."]
    lines += [
        "",
        "'spent eps' is the client's own ledger (cumulative over all runs it took part in);",
        "'server check' is recomputed by the server from the mechanism parameters each reply reported.",
    ]
    return "\n".join(lines) + "\n"


def plot_progress(rounds: list[dict[str, Any]], path: Path) -> None:
    """Accuracy and max/mean spent ε over rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["round"] for r in rounds if r.get("accuracy") is not None]
    acc = [r["accuracy"] for r in rounds if r.get("accuracy") is not None]
    eps_rounds = [r for r in rounds if r.get("epsilon_spent")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.plot(xs, acc, marker="o")
    ax1.set_xlabel("round")
    ax1.set_ylabel("test accuracy")
    ax1.grid(alpha=0.3)
    if eps_rounds:
        finite = [[v for v in r["epsilon_spent"].values() if v is not None and math.isfinite(v)] for r in eps_rounds]
        ex = [r["round"] for r, f in zip(eps_rounds, finite) if f]
        ax2.plot(ex, [max(f) for f in finite if f], marker="o", label="max over clients")
        ax2.plot(ex, [sum(f) / len(f) for f in finite if f], marker="s", label="mean over clients")
        ax2.legend()
    ax2.set_xlabel("round")
    ax2.set_ylabel("cumulative epsilon spent")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
