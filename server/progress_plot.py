"""``progress.png``: test accuracy and the spent ε (max and mean over clients) per round.

Drawn on a bare :class:`matplotlib.figure.Figure` with a fixed layout: no ``pyplot`` (its import and
global backend state) and no ``tight_layout`` (a text-measuring pass), together 0.4 s of a tiny run (#38).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_progress"]


def plot_progress(rounds: list[dict[str, Any]], path: Path) -> None:
    """Accuracy and max/mean spent ε over rounds, written as a PNG to ``path``."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    xs = [r["round"] for r in rounds if r.get("accuracy") is not None]
    acc = [r["accuracy"] for r in rounds if r.get("accuracy") is not None]
    eps_rounds = [r for r in rounds if r.get("epsilon_spent_max") is not None and r.get("num_registered")]
    private = any(r["epsilon_spent_max"] > 0 for r in eps_rounds)
    fig = Figure(figsize=(9, 3.5))
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.14, top=0.96, wspace=0.3)
    ax1, ax2 = fig.subplots(1, 2)
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
    for ax in (ax1, ax2) if private else (ax1,):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
