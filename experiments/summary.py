"""One table of the four reproductions, from their run records: the README's headline rows.

Each paper's folder keeps its records and its full, generated tables (``results.md``); this
module reads the same records and picks each paper's headline comparison, so the README's
summary is never a hand copy. ``scripts/write_docs.py`` writes :func:`markdown` into the README.

Every cell is "mean ± sample std (seeds)" of the records that match its regime; a paired gap is
the mean per-seed difference with its 95 % bootstrap interval (:mod:`privet.paired`). A regime
with no records yet reads "not run".
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from privet.paired import bootstrap_interval, paired_gaps  # noqa: E402

__all__ = ["Row", "markdown", "rows"]

#: FedCEO Table 1, EMNIST-letters, MLP-2, σ_g = 2 (docs/notes/fedceo.md §4): UDP-FedAvg, FedCEO
FEDCEO_TABLE_1_SIGMA_2 = (60.32, 64.20)
#: DP-FedC Table I, MNIST: DP-FedC without DP, at ε̄ = 20 (experiments/dpfedc/report.py's TABLE_I)
DPFEDC_TABLE_I = (50.5, 43.1)


@dataclass(frozen=True)
class Row:
    """One headline cell: the paper, its regime, what is measured, ours, the paper's, where the rest is."""

    paper: str
    regime: str
    quantity: str
    ours: str
    theirs: str
    link: str


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _cell(values: Iterable[float], scale: float = 100.0, digits: int = 1) -> str:
    v = [scale * x for x in values]
    if not v:
        return "not run"
    spread = f" ± {statistics.stdev(v):.{digits}f}" if len(v) > 1 else ""
    return f"{statistics.fmean(v):.{digits}f}{spread} ({len(v)})"


def _gap(a: dict[Any, float], b: dict[Any, float], scale: float = 100.0) -> str:
    gaps = [scale * g for g in paired_gaps(a, b).values()]
    if len(gaps) < 2:
        return "not run"
    lo, hi = bootstrap_interval(gaps)
    return f"{statistics.fmean(gaps):+.1f} [{lo:+.1f}, {hi:+.1f}] ({len(gaps)})"


# ---- PFA: experiments/pfa/paper-regime (the paper's regime, rates tuned on validation)

def _pfa_rows() -> list[Row]:
    from experiments.pfa.reproduce import PAPER

    records = _jsonl(HERE / "pfa" / "paper-regime" / "runs.jsonl")
    out = []
    for setting, model, calibration, words in (
            ("paper-logreg-iid-mixgauss1", "logreg", "pfa-closed-form", "LogR, IID, MixGauss1, the authors' σ"),
            ("paper-logreg-iid-mixgauss1", "logreg", "accountant", "LogR, IID, MixGauss1, tight σ"),
            ("paper-cnn-iid-mixgauss1", "cnn", "accountant", "CNN, IID, MixGauss1, tight σ")):
        # the tuned test runs: only the calibration set, the rate from validation (``--tuned``)
        runs = [r for r in records if r["setting"] == setting and r["sets"] == [f"calibration={calibration}"]]
        last10 = {m: {r["seed"]: r["last10_accuracy"] for r in runs if r["method"] == m} for m in ("pfa", "weiavg")}
        paper = PAPER[(model, "iid", "mixgauss1", 20)]
        out += [Row("PFA", f"Fashion-MNIST, {words}", "PFA, last 10 rounds", _cell(last10["pfa"].values()),
                    f"{100 * paper['pfa']:.0f}", "experiments/pfa/README.md"),
                Row("PFA", f"Fashion-MNIST, {words}", "PFA − WeiAvg (pp)", _gap(last10["pfa"], last10["weiavg"]),
                    f"{100 * (paper['pfa'] - paper['weiavg']):+.0f}", "experiments/pfa/README.md")]
    return out


# ---- FedCEO: experiments/fedceo/fair (σ_g = 2, I = 10, λ tuned on validation)

def _fedceo_rows() -> list[Row]:
    records = _jsonl(HERE / "fedceo" / "fair" / "runs.jsonl")

    def test_runs(method: str) -> dict[int, float]:
        # the plain cell's test runs: key "test/<method>/seed<s>/" (other cells carry their overrides)
        return {int(r["key"].split("/")[2].removeprefix("seed")): r["last10_accuracy"] for r in records
                if r["key"].startswith(f"test/{method}/seed") and r["key"].endswith("/")}

    udp, fedceo = test_runs("udp-fedavg"), test_runs("fedceo-global")
    udp_paper, fedceo_paper = FEDCEO_TABLE_1_SIGMA_2
    regime = "MLP-2, σ_g = 2, I = 10 (paper: EMNIST; ours: Fashion-MNIST)"
    return [Row("FedCEO", regime, "UDP-FedAvg, last 10 rounds", _cell(udp.values()), f"{udp_paper:.1f}",
                "experiments/fedceo/README.md"),
            Row("FedCEO", regime, "FedCEO − UDP-FedAvg (pp)", _gap(fedceo, udp),
                f"{fedceo_paper - udp_paper:+.2f}", "experiments/fedceo/README.md")]


# ---- GDPFed: experiments/gdpfed (Table 2, Fashion-MNIST, 6000 clients × 50 rounds)

def _gdpfed_rows() -> list[Row]:
    from experiments.gdpfed.reproduce import METHODS, calibration_of, model_of

    def finals(method: str, extra: dict[str, object]) -> dict[int, float]:
        """Final accuracy per seed of ``method``'s current-regime runs with exactly these run-config changes."""
        return {r["seed"]: r["final_accuracy"] for r in _jsonl(HERE / "gdpfed" / "runs.jsonl")
                if r["method"] == method and r["clients"] == 6000 and r["rounds"] == 50 and model_of(r) == "cnn2"
                and {k: v for k, v in r.get("extra", {}).items() if k != "model"} == extra
                and "before #36" not in calibration_of(r)}

    final = {m: finals(m, {}) for m in ("fedavg", "dp-fedavg", "gdpfed-plus")}
    regime = "Table 2, Fashion-MNIST, 6,000 clients × 50 rounds, McMahan's CNN"
    rows = [Row("GDPFed", regime, f"{METHODS[m][0]}, final round", _cell(final[m].values(), digits=2),
                METHODS[m][1].replace("±", " ± "), "experiments/gdpfed/README.md")
            for m in ("fedavg", "dp-fedavg", "gdpfed-plus")]
    if stepped := finals("dp-fedavg", {"gdpfed.server-step": 0.5}):  # the step chosen on validation (pipeline.py)
        rows.insert(2, Row("GDPFed", regime, "DP-FedAvg, server step 0.5, final round",
                           _cell(stepped.values(), digits=2), METHODS["dp-fedavg"][1].replace("±", " ± "),
                           "experiments/gdpfed/README.md"))
    paper_gap = float(METHODS["gdpfed-plus"][1].split("±")[0]) - float(METHODS["dp-fedavg"][1].split("±")[0])
    gap = _gap(final["gdpfed-plus"], final["dp-fedavg"])
    if len(one := paired_gaps(final["gdpfed-plus"], final["dp-fedavg"])) == 1:  # the queue's first seed: no interval
        gap = f"{100 * next(iter(one.values())):+.1f} (1)"
    rows.append(Row("GDPFed", regime, "GDPFed+ − DP-FedAvg (pp)", gap, f"{paper_gap:+.2f}",
                    "experiments/gdpfed/README.md"))
    if len(paired_gaps(final["gdpfed-plus"], stepped)) > 1:
        rows.append(Row("GDPFed", regime, "GDPFed+ − DP-FedAvg at server step 0.5 (pp)",
                        _gap(final["gdpfed-plus"], stepped), f"{paper_gap:+.2f}", "experiments/gdpfed/README.md"))
    return rows


# ---- DP-FedC: experiments/dpfedc/table.json (Table I, MNIST, raw pixels)

def _dpfedc_rows() -> list[Row]:
    path = HERE / "dpfedc" / "table.json"
    results = json.loads(path.read_text())["results"] if path.exists() else {}
    none, paper = results.get("DP-FedC/none", {}), results.get("DP-FedC/paper", {})
    regime = "Table I, MNIST (10,000 digits), N = 100 clients"
    no_dp, eps_20 = DPFEDC_TABLE_I
    return [Row("DP-FedC", regime, "without DP, one-to-one / majority",
                f"{_cell(none.get('accuracy', []))} / {_cell(none.get('accuracy_majority', []))}", f"{no_dp}",
                "experiments/dpfedc/README.md"),
            Row("DP-FedC", regime, "ε̄ = 20 (eq. 29, nominal), one-to-one / majority",
                f"{_cell(paper.get('accuracy', []))} / {_cell(paper.get('accuracy_majority', []))}", f"{eps_20}",
                "experiments/dpfedc/README.md")]


PAPERS: tuple[Callable[[], list[Row]], ...] = (_pfa_rows, _fedceo_rows, _gdpfed_rows, _dpfedc_rows)


def rows() -> list[Row]:
    """Every paper's headline rows, from the records on disk."""
    return [row for paper in PAPERS for row in paper()]


def markdown(link_prefix: str = "") -> str:
    """The summary table (accuracy in %, ``mean ± std (seeds)``; gaps paired, 95 % bootstrap interval)."""
    lines = ["| paper | regime | quantity | ours | paper's |", "|---|---|---|---:|---:|"]
    previous = ("", "")
    for r in rows():
        paper = f"[{r.paper}]({link_prefix}{r.link})" if r.paper != previous[0] else ""
        regime = r.regime if (r.paper, r.regime) != previous else ""
        previous = (r.paper, r.regime)
        lines.append(f"| {paper} | {regime} | {r.quantity} | {r.ours} | {r.theirs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
