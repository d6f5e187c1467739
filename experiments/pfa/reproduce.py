"""Reproduce PFA's key comparison (Fig. 3, 10, 11, 12) at a scale a small CPU finishes.

For every chosen setting (a TOML file in this folder: Fashion-MNIST, LogR or CNN, IID
or label shards, MixGauss1 or MixGauss3), every method and every seed, run the real
ServerApp logic and ClientApp in one process (``run_experiment`` on ``InProcessGrid``),
then write a markdown table of the final test accuracy (mean ± std over the seeds)
beside the paper's values as read from its figures (``docs/notes/pfa.md`` §4,
±0.02 by eye, at round ≈ 95). Raw results are appended to ``runs.jsonl`` next to the
output, so grids run at different times end up in one table.

Methods: ``fedavg`` (non-private, budget-distribution "none"), ``maximum`` (everyone at
the largest ε; an oracle), ``pfa``, ``pfa-plus``, ``weiavg``, ``fedavg-hdp``,
``minimum`` (everyone at the smallest ε).

The ``paper-*`` settings run the paper's own regime (M = 20, K = 16, τ = 100 steps of batch 4,
1,200 examples per client, 50 rounds, a fixed number of high-ε clients, no-public redraw); tune
the learning rate on the validation split, then run the test seeds with ``--tuned``::

    python experiments/pfa/reproduce.py --settings paper-logreg-iid-mixgauss1 --seeds 0 \
        --set evaluation-split=validation --set num-server-rounds=50 --set learning-rate=0.01 \
        --out tune/results.md                      # once per rate and calibration
    python experiments/pfa/reproduce.py --settings paper-logreg-iid-mixgauss1 --seeds 1 2 3 \
        --set calibration=pfa-closed-form --tuned tune/runs.jsonl --out final/results.md

``--tuned`` compares rates within one tuning horizon (``num-server-rounds``) and lets the longest
one tuned decide: a rate that wins over 25 rounds can lose over 50.

Differences from the paper's runs in the ``fmnist-*`` settings (deliberate, for a 2-core CPU,
or for correctness):

- 10 rounds of one local epoch (≈ 31 DP-SGD steps of batch 32 on 1000 examples)
  instead of ≈ 95 rounds of 100 steps of batch 4;
- σ calibrated with a real RDP accountant and Poisson sampling for the whole run (the
  authors' closed form over-noises by 2–5×, docs/notes/pfa.md §1.5);
- one learning rate (0.05, plain SGD) for every method instead of the best of a grid
  picked on test accuracy;
- non-IID = 2 label shards per client (the authors' code: 10 shards of 60000/(10 M));
- public = the top 10 % by ε over all clients, k = 1, centred (authors' code); a round
  whose sample holds no public client falls back to WeiAvg (the code redraws it);
- 2–3 seeds instead of 5 repeats.

Usage::

    python experiments/pfa/reproduce.py --settings fmnist-logreg-iid-mixgauss1 --seeds 1 2
    python experiments/pfa/reproduce.py --settings fmnist-cnn-iid-mixgauss1 \\
        --methods pfa weiavg fedavg-hdp --set num-server-rounds=5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import tomllib
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

METHODS = {  # run-config strategy -> the paper's legend
    "fedavg": "NP-FedAvg",
    "maximum": "Maximum",
    "pfa": "PFA",
    "pfa-plus": "PFA+",
    "weiavg": "WeiAvg",
    "fedavg-hdp": "FedAvg (HDP)",
    "minimum": "Minimum",
}

# The paper's Fashion-MNIST values, (model, partitioner, budgets, M) -> method -> acc.
# Read by eye from the figures (docs/notes/pfa.md §4.1 Fig. 3, §4.8 Fig. 10-12), ±0.02.
_ORDER = ("pfa", "pfa-plus", "weiavg", "fedavg-hdp", "minimum", "maximum", "fedavg")
_PAPER_ROWS = {
    ("logreg", "iid", "mixgauss1", 20): (0.69, 0.71, 0.53, 0.20, 0.17, 0.76, 0.81),
    ("logreg", "iid", "mixgauss1", 30): (0.73, 0.73, 0.67, 0.19, 0.21, 0.77, 0.81),
    ("cnn", "iid", "mixgauss1", 20): (0.65, 0.64, 0.26, 0.15, 0.17, 0.67, 0.83),
    ("cnn", "iid", "mixgauss1", 30): (0.67, 0.66, 0.56, 0.14, 0.16, 0.70, 0.84),
    ("logreg", "iid", "mixgauss3", 20): (0.70, 0.71, 0.55, 0.57, 0.58, 0.76, 0.81),
    ("logreg", "iid", "mixgauss3", 30): (0.73, 0.72, 0.61, 0.63, 0.59, 0.77, 0.81),
    ("cnn", "iid", "mixgauss3", 20): (0.65, 0.64, 0.57, 0.44, 0.33, 0.67, 0.83),
    ("cnn", "iid", "mixgauss3", 30): (0.66, 0.66, 0.61, 0.51, 0.36, 0.70, 0.84),
    ("logreg", "shards", "mixgauss3", 20): (0.63, 0.67, 0.67, 0.69, 0.67, 0.79, 0.81),
    ("logreg", "shards", "mixgauss3", 30): (0.66, 0.66, 0.59, 0.65, 0.65, 0.78, 0.81),
    ("cnn", "shards", "mixgauss3", 20): (0.59, 0.59, 0.55, 0.60, 0.57, 0.69, 0.83),
    ("cnn", "shards", "mixgauss3", 30): (0.57, 0.55, 0.56, 0.55, 0.48, 0.65, 0.83),
}
PAPER = {key: dict(zip(_ORDER, row, strict=True)) for key, row in _PAPER_ROWS.items()}
#: the paper's claims as paired comparisons (a, b): a − b on the seeds both ran
PAIRS = (("pfa", "weiavg"), ("pfa-plus", "pfa"))
PAPER_SOURCE = {"iid-mixgauss1": "Fig. 3", "iid-mixgauss3": "Fig. 10",
                "shards-mixgauss1": "Fig. 11 (fMNIST panels duplicate MNIST's: not reported)",
                "shards-mixgauss3": "Fig. 12"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=["fmnist-logreg-iid-mixgauss1"],
                        help="TOML names in experiments/pfa (without .toml)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key for every run")
    parser.add_argument("--out", type=Path, default=HERE / "results.md",
                        help="the markdown table; runs.jsonl (every run's record) goes beside it")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--tuned", type=Path, default=None,
                        help="a runs.jsonl of validation runs (--set evaluation-split=validation) over several "
                             "--set learning-rate=...: each method runs at the rate with the best mean accuracy "
                             "over the last 10 rounds there, among the runs of the longest num-server-rounds tuned "
                             "(PFA+ at PFA's if it was not tuned itself)")
    return parser.parse_args()


class TuningCaveat(UserWarning):
    """A learning rate picked on validation that its tuning horizon cannot vouch for."""


def tuned_learning_rates(records: list[dict[str, Any]],
                         requested: set[tuple[str, str, str]] | None = None) -> dict[tuple[str, str, str], float]:
    """(setting, method, calibration) -> the learning rate whose validation runs had the best
    mean accuracy over their last 10 rounds (averaged over the seeds run).

    Rates are compared only within one tuning horizon (``num-server-rounds``), and the longest
    horizon tuned decides: the best rate for 25 rounds need not be the best for 50, and averaging
    runs of different lengths would compare a rate's early accuracy with another's late one.
    A :class:`TuningCaveat` warns where that horizon cannot vouch for a pick: a single rate
    tuned (nothing was compared), or a pick at the edge of the rates tuned (one beyond it may do
    better, so the method's accuracy is a lower estimate). With ``requested`` (the keys a run
    will use) only their picks are vouched for, PFA's where PFA+ borrows its rate; else every one.
    """
    scores: dict[tuple[str, str, str], dict[int, dict[float, list[float]]]] = {}
    for r in records:
        cfg = r["config"]
        if cfg.get("evaluation-split") != "validation" or "last10_accuracy" not in r:
            continue
        key = (r["setting"], r["method"], str(cfg.get("calibration", "accountant")))
        by_horizon = scores.setdefault(key, {}).setdefault(int(cfg["num-server-rounds"]), {})
        by_horizon.setdefault(float(cfg["learning-rate"]), []).append(r["last10_accuracy"])
    best: dict[tuple[str, str, str], float] = {}
    caveats: dict[tuple[str, str, str], str] = {}
    for key, horizons in scores.items():
        rounds = max(horizons)
        by_lr = horizons[rounds]
        best[key] = max(by_lr, key=lambda lr: statistics.fmean(by_lr[lr]))
        where = f"{' / '.join(key)}: learning rate {best[key]:g}"
        if len(by_lr) == 1:
            caveats[key] = f"{where} is the only rate tuned over {rounds} rounds; nothing was compared"
        elif best[key] in (min(by_lr), max(by_lr)):
            edge = "smallest" if best[key] == min(by_lr) else "largest"
            caveats[key] = (f"{where} is the {edge} of the rates tuned over {rounds} rounds "
                            f"({', '.join(f'{lr:g}' for lr in sorted(by_lr))}); one beyond it may do better")
    borrowed: dict[tuple[str, str, str], tuple[str, str, str]] = {}
    for (setting, method, calibration), lr in list(best.items()):
        plus = (setting, "pfa-plus", calibration)
        if method == "pfa" and plus not in best:
            best[plus] = lr
            borrowed[plus] = (setting, method, calibration)
    vouched = best if requested is None else requested
    for key in sorted({borrowed.get(k, k) for k in vouched} & caveats.keys()):
        warnings.warn(caveats[key], TuningCaveat, stacklevel=2)
    return best


def run_config(setting: str, method: str, seed: int, sets: list[str], out_dir: str,
               tuned: dict[tuple[str, str, str], float] | None = None) -> dict[str, Any]:
    """pyproject defaults < the setting's TOML < --set < (strategy, seed, out-dir) < tuned lr."""
    from privet.cli import app_defaults, flatten, parse_assignment

    cfg = app_defaults()
    with open(HERE / f"{setting}.toml", "rb") as fh:
        cfg.update(flatten(tomllib.load(fh)))
    cfg.update(dict(parse_assignment(s) for s in sets))
    cfg.update({"strategy": method, "seed": seed, "out-dir": out_dir})
    if method == "fedavg":
        cfg["budget-distribution"] = "none"
    if tuned is not None:
        key = _tuning_key(setting, cfg)
        if key not in tuned:
            raise SystemExit(f"--tuned has no validation runs for {key}; tune it first")
        cfg["learning-rate"] = tuned[key]
    return cfg


def run_one(cfg: dict[str, Any]) -> dict[str, Any]:
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    grid = InProcessGrid(client_app, simulation_node_configs(int(cfg["num-clients"])), cfg)
    started = time.perf_counter()
    summary = run_experiment(grid, cfg, run_id=1)
    logging.getLogger("privet").setLevel(logging.WARNING)
    with open(Path(cfg["out-dir"]) / "rounds.jsonl") as fh:
        rows = [json.loads(line) for line in fh]
    accuracies = [row["accuracy"] for row in rows]
    return {
        "final_accuracy": summary["final_accuracy"],
        "last3_accuracy": statistics.fmean(accuracies[-3:]),
        "last10_accuracy": statistics.fmean(accuracies[-10:]),
        "accuracies": accuracies,
        "fallback_rounds": sum(1 for row in rows if row.get("pfa-fallback-weiavg")),
        "within_budget": all(c["within_budget"] for c in summary["clients"]),
        "seconds": time.perf_counter() - started,
    }


def run_job(job: tuple[str, str, int, list[str], str, dict[tuple[str, str, str], float] | None]) -> dict[str, Any]:
    """One (setting, method, seed) run in a worker process; returns its ``runs.jsonl`` record."""
    import torch

    # One intra-op thread: on a small, shared CPU torch's thread pool spins and makes
    # the tiny per-client steps tens of times slower; results do not change.
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    setting, method, seed, sets, out_dir, tuned = job
    cfg = run_config(setting, method, seed, sets, out_dir, tuned)
    result = run_one(cfg)
    with open(HERE / f"{setting}.toml", "rb") as fh:
        budgets = tomllib.load(fh)["budget-distribution"]
    return {"setting": setting, "sets": sorted(sets), "method": method, "seed": seed,
            "config": {**cfg, "setting-budgets": budgets}, **result}


def _tuning_key(setting: str, cfg: dict[str, Any]) -> tuple[str, str, str]:
    """What a tuned learning rate is looked up by: (setting, method, calibration)."""
    return setting, str(cfg["strategy"]), str(cfg.get("calibration", "accountant"))


def _group_key(record: dict[str, Any]) -> tuple[str, str]:
    return record["setting"], " ".join(record["sets"])


def _sigma_caption(cfg: dict[str, Any]) -> str:
    """σ per ε of the setting's two budget levels under its calibration (DP-SGD, whole run)."""
    from privacy.calibration import noise_multiplier_for, pfa_closed_form_sigma
    from privacy.mechanisms import dpsgd_sample_rate, dpsgd_steps_per_round

    if cfg.get("budget-distribution") in (None, "none") or not str(cfg["budget-distribution"]).startswith("mixgauss"):
        return ""
    from privacy.budgets import MIXTURES

    q = dpsgd_sample_rate(int(cfg["max-examples-per-client"]), int(cfg["batch-size"]))
    steps = dpsgd_steps_per_round(int(cfg["max-examples-per-client"]), int(cfg["batch-size"]),
                                  int(cfg["local-epochs"]), int(cfg.get("local-steps", 0))) * int(cfg["num-server-rounds"])
    parts = []
    for _, eps, _ in MIXTURES[str(cfg["budget-distribution"])]:
        sigma = noise_multiplier_for(eps, float(cfg["delta"]), q, steps, accountant=str(cfg["accountant"]))
        if cfg.get("calibration") == "pfa-closed-form":
            sigma = max(sigma, pfa_closed_form_sigma(eps, float(cfg["delta"]), q, steps))
        parts.append(f"σ = {sigma:.2f} at ε = {eps:g}")
    return f" Noise ({cfg.get('calibration', 'accountant')}, planned for every round): {', '.join(parts)}."


def render(records: list[dict[str, Any]]) -> str:
    """Tables of mean ± std over seeds, grouped by setting (and overrides)."""
    lines = [
        "# PFA reproduction: test accuracy (Fashion-MNIST)",
        "",
        "Written by `experiments/pfa/reproduce.py` from `runs.jsonl` beside it. Ours: mean ± std over "
        "seeds of the final-round accuracy and of the mean over the last 10 rounds (the last 3 for "
        "older runs); on the validation split for tuning runs (`evaluation-split=validation`), "
        "else on the test split. Paper: read by eye from its figures at round ≈ 95 (±0.02; notes "
        "`pfa.md` §4).",
        "",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(_group_key(r), []).append(r)
    sd = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0)
    for (setting, sets), rows in groups.items():
        cfg = rows[0]["config"]
        m = int(cfg["num-clients"])
        key = (cfg["model"], cfg["partitioner"], cfg["setting-budgets"], m)
        paper = PAPER.get(key, {})
        source = PAPER_SOURCE.get(f"{key[1]}-{key[2]}", "")
        work = (f"τ = {cfg['local-steps']} steps" if int(cfg.get("local-steps", 0)) else
                f"{cfg['local-epochs']} epoch(s)")
        lines += [
            f"## {setting}{f' ({sets})' if sets else ''}",
            "",
            f"M = {m}, {cfg['num-server-rounds']} rounds, fraction {cfg['fraction-train']}, "
            f"{cfg['max-examples-per-client']} examples/client, {work} of batch {cfg['batch-size']} per round, "
            f"budgets {cfg['setting-budgets']} ({cfg.get('budget-components', 'drawn')} components); "
            f"paper: {source}, M = {m}.{_sigma_caption(cfg)}",
            "",
            "| method | lr | ours: final | ours: last 10 (3) rounds | seeds | no-public fallbacks | all within budget "
            "| paper |",
            "|---|---:|---:|---:|---:|---:|:---:|---:|",
        ]
        for method, label in METHODS.items():
            runs = [r for r in rows if r["method"] == method]
            if not runs:
                continue
            final = [r["final_accuracy"] for r in runs]
            last = [r.get("last10_accuracy", r["last3_accuracy"]) for r in runs]
            lrs = sorted({float(r["config"]["learning-rate"]) for r in runs})
            ref = paper.get(method)
            lines.append(
                f"| {label} | {', '.join(f'{lr:g}' for lr in lrs)} | {statistics.fmean(final):.3f} ± {sd(final):.3f} | "
                f"{statistics.fmean(last):.3f} ± {sd(last):.3f} | {len(runs)} | "
                f"{sum(r.get('fallback_rounds', 0) for r in runs)} | "
                f"{'yes' if all(r['within_budget'] for r in runs) else 'NO'} | "
                f"{f'{ref:.2f}' if ref is not None else 'n/a'} |"
            )
        lines += paired_lines(rows)
        lines.append("")
    return "\n".join(lines)


def paired_lines(rows: list[dict[str, Any]]) -> list[str]:
    """For each of :data:`PAIRS` run on at least 2 common seeds: the mean gap a − b in percentage
    points of the final and the last-10 accuracy, with its 95 % bootstrap interval (privet.paired),
    and the per-seed last-10 gaps."""
    from privet.paired import bootstrap_interval, paired_gaps

    lines: list[str] = []
    for a, b in PAIRS:
        # older records kept only the last 3 rounds: they are not paired
        by_seed = {m: {r["seed"]: r for r in rows if r["method"] == m and "last10_accuracy" in r} for m in (a, b)}
        gaps = {metric: paired_gaps({s: 100 * r[metric] for s, r in by_seed[a].items()},
                                    {s: 100 * r[metric] for s, r in by_seed[b].items()})
                for metric in ("final_accuracy", "last10_accuracy")}
        if len(gaps["final_accuracy"]) < 2:
            continue
        cells = []
        for metric, name in (("final_accuracy", "final"), ("last10_accuracy", "last 10")):
            xs = list(gaps[metric].values())
            low, high = bootstrap_interval(xs)
            cells.append(f"{name} {statistics.fmean(xs):+.1f} [{low:+.1f}, {high:+.1f}]")
        per_seed = ", ".join(f"{g:+.1f}" for g in gaps["last10_accuracy"].values())
        lines += ["", f"{METHODS[a]} − {METHODS[b]}, paired on seeds {', '.join(map(str, gaps['final_accuracy']))} "
                      f"(pp, mean [95 % bootstrap]): {'; '.join(cells)}; last 10 per seed: {per_seed}."]
    return lines


def main() -> int:
    args = parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw = args.out.with_name("runs.jsonl")
    records = [json.loads(line) for line in raw.read_text().splitlines()] if raw.exists() else []
    with tempfile.TemporaryDirectory(prefix="pfa-repro-") as tmp:
        tuned = None
        if args.tuned is not None:
            requested = {_tuning_key(setting, run_config(setting, method, 0, list(args.set), tmp))
                         for setting in args.settings for method in args.methods}
            tuned = tuned_learning_rates([json.loads(line) for line in args.tuned.read_text().splitlines()],
                                         requested)
        jobs = [(setting, method, seed, list(args.set), f"{tmp}/{setting}-{method}-{seed}", tuned)
                for setting in args.settings for method in args.methods for seed in args.seeds]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for record in pool.map(run_job, jobs):
                records = [r for r in records if (_group_key(r), r["method"], r["seed"])
                           != (_group_key(record), record["method"], record["seed"])] + [record]
                with open(raw, "w") as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in records)
                print(f"{record['setting']} {' '.join(record['sets'])} {record['method']} seed {record['seed']}: "
                      f"final {record['final_accuracy']:.4f} ({record['seconds']:.0f} s)", flush=True)
                args.out.write_text(render(records))
    args.out.write_text(render(records))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    logging.getLogger("flwr").setLevel(logging.WARNING)
    sys.exit(main())
