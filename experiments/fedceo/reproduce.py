"""Reproduce FedCEO's Table 1 comparison at a reduced scale, in-process.

For one model (``mlp2`` or ``lenet5``), every noise level σ_g of ``grid.toml`` and every
seed, run UDP-FedAvg, FedCEO (ϑ = 1) and FedCEO (ϑ > 1) with the real ServerApp logic
and ClientApp on the in-process grid (``InProcessGrid`` + ``run_experiment``), then
write ``results.md`` beside this file: our accuracies next to the paper's.

::

    python experiments/fedceo/reproduce.py run --model mlp2            # the grid
    python experiments/fedceo/reproduce.py tune --model mlp2           # λ sweep, tune seed
    python experiments/fedceo/reproduce.py report                      # results.md only

Each run's results directory goes under ``results/fedceo/`` (ignored by git); the
numbers the report needs are collected in ``experiments/fedceo/runs.json``. A run
already in ``runs.json`` is not repeated unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS_JSON = HERE / "runs.json"
OUT_ROOT = ROOT / "results" / "fedceo"
METHODS = ("udp-fedavg", "ppsgd", "centaur", "fedceo-theta1", "fedceo")
LABELS = {"udp-fedavg": "UDP-FedAvg", "ppsgd": "PPSGD", "centaur": "CENTAUR",
          "fedceo-theta1": "FedCEO (ϑ=1)", "fedceo": "FedCEO (ϑ>1)"}
PERSONALIZED = ("ppsgd", "centaur")  # judged by the clients' personal models (held-out 20 %)

sys.path.insert(0, str(ROOT))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per run: the SVDs thrash otherwise


def load_grid() -> dict[str, Any]:
    with open(HERE / "grid.toml", "rb") as fh:
        return tomllib.load(fh)


def run_key(dataset: str, model: str, method: str, sigma: float, seed: int, lam: float | None = None) -> str:
    key = f"{dataset}/{model}/{method}/sigma{sigma:g}/seed{seed}"
    return key if lam is None else f"{key}/lambda{lam:g}"


def run_config(model: str, method: str, sigma: float, seed: int, fedceo: dict[str, Any],
               overrides: dict[str, Any]) -> dict[str, Any]:
    """App defaults < ``<model>.toml`` < this run's strategy, σ_g, seed and ``fedceo.*``."""
    from privet.cli import load_experiment

    sets = {"strategy": "fedceo" if method.startswith("fedceo") else method,
            "noise-multiplier": float(sigma), "seed": int(seed)}
    if method.startswith("fedceo"):
        sets.update({"fedceo.lambda": float(fedceo["lambda"]), "fedceo.interval": int(fedceo["interval"]),
                     "fedceo.theta": 1.0 if method == "fedceo-theta1" else float(fedceo["theta"])})
    if method in PERSONALIZED:  # judged on the clients' held-out data: an uncharged release they allow
        sets["client-evaluation"] = "on"
    cfg = load_experiment(str(HERE / f"{model}.toml"), [], None)
    cfg.update({**sets, **overrides})  # --set wins
    return cfg


def execute(key: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One in-process run; the numbers the report needs."""
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.INFO)  # Flower and privet log every round at INFO
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    started = time.perf_counter()
    grid = InProcessGrid(client_app, simulation_node_configs(int(cfg["num-clients"])), cfg)
    summary = run_experiment(grid, cfg, run_id=1)
    rounds = [json.loads(x) for x in (Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()]
    spent = [c["epsilon_spent"] or 0.0 for c in summary["clients"]]  # None: no bound (a non-private run)
    smoothing = [r for r in rounds if r.get("fedceo-smoothed")]
    return {
        "key": key,
        "config": {k: cfg[k] for k in sorted(cfg) if k != "out-dir"},
        "dp_mode": summary["dp_mode"],
        "final_accuracy": summary["final_accuracy"],
        "best_accuracy": summary["best_accuracy"],
        "accuracy_by_round": [r["accuracy"] for r in rounds],
        "personalized_by_round": (personal := [r["personalized_accuracy"] for r in rounds
                                               if "personalized_accuracy" in r]),
        "personalized_final_accuracy": personal[-1] if personal else None,
        "personalized_best_accuracy": max(personal) if personal else None,
        "epsilon_spent_max": max(spent),
        "epsilon_spent_mean": statistics.fmean(spent),
        "within_budget": all(c["within_budget"] for c in summary["clients"]),
        "smoothing_rounds": [r["round"] for r in smoothing],
        "thresholds": [r["fedceo-threshold"] for r in smoothing],
        "smoothing_seconds": sum(r["fedceo-smoothing-seconds"] for r in smoothing),
        "aggregation_seconds": sum(r.get("aggregation_seconds", 0.0) for r in rounds[1:]),
        "wall_seconds": time.perf_counter() - started,
    }


def _load_runs(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def run_all(jobs: list[tuple[str, dict[str, Any]]], workers: int, force: bool, runs_json: Path = RUNS_JSON) -> None:
    """Run what ``runs_json`` lacks; each result is merged into the file as it lands (the
    file is re-read first, so results that another invocation wrote meanwhile stay)."""
    done = _load_runs(runs_json)
    out_root = OUT_ROOT if runs_json == RUNS_JSON else runs_json.parent / "runs"  # elsewhere: all beside it
    todo = [(k, {**c, "out-dir": str(out_root / k)}) for k, c in jobs if force or k not in done]
    print(f"{len(todo)} runs to do ({len(jobs) - len(todo)} already in {runs_json.name})", flush=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(execute, *zip(*todo, strict=True)) if todo else []:
            done = {**_load_runs(runs_json), result["key"]: result}
            tmp = runs_json.with_suffix(".tmp")
            tmp.write_text(json.dumps(done, indent=1, sort_keys=True))
            tmp.replace(runs_json)
            print(f"{result['key']}: final {result['final_accuracy']:.4f} best {result['best_accuracy']:.4f} "
                  f"eps {result['epsilon_spent_max']:.3g} ({result['wall_seconds']:.0f}s)", flush=True)


def _job(model, method, sigma, seed, fedceo, overrides, lam=None):
    """(key, config); ``--set`` overrides other than the dataset are appended to the key."""
    cfg = run_config(model, method, sigma, seed, fedceo, overrides)
    extra = sorted((k, v) for k, v in overrides.items() if k not in ("dataset", "data-dir"))
    key = run_key(cfg["dataset"], model, method, sigma, seed, lam)
    return (key + "/" + ",".join(f"{k}={v}" for k, v in extra) if extra else key), cfg


def seeds_of(model: str, grid: dict[str, Any]) -> list[int]:
    """The evaluation seeds of a model (its own ``seeds`` if the grid gives them)."""
    return list(grid[model].get("seeds", grid["seeds"]))


def grid_jobs(model: str, grid: dict[str, Any], overrides: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every method at every σ_g with the grid's λ, ϑ, I, on the evaluation seeds."""
    spec = grid[model]
    return [
        _job(model, method, sigma, seed, {name: spec[name][i] for name in ("lambda", "theta", "interval")}, overrides)
        for seed in seeds_of(model, grid)
        for i, sigma in enumerate(spec["sigma"])
        for method in METHODS
    ]


def tune_jobs(model: str, grid: dict[str, Any], overrides: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """UDP-FedAvg, and FedCEO (ϑ>1) over the λ grid, on the tuning seed only."""
    spec, seed = grid[model], grid["tune-seed"]
    jobs = []
    for i, sigma in enumerate(spec["sigma"]):
        jobs.append(_job(model, "udp-fedavg", sigma, seed, {}, overrides))
        for factor in spec["tune-factors"]:
            lam = spec["table2-lambda"][i] * factor
            fedceo = {"lambda": lam, "theta": spec["theta"][i], "interval": spec["interval"][i]}
            jobs.append(_job(model, "fedceo", sigma, seed, fedceo, overrides, lam))
    return jobs


# ------------------------------------------------------------------------------ report
def _stats(values: list[float], signed: bool = False) -> str:
    """Mean ± sample std over seeds, in percent (one value: itself)."""
    pct = [100 * v for v in values]
    if not pct:
        return "–"
    mean = f"{statistics.fmean(pct):+.2f}" if signed else f"{statistics.fmean(pct):.2f}"
    return mean if len(pct) == 1 else f"{mean} ± {statistics.stdev(pct):.2f}"


def accuracy(run: dict[str, Any], method: str, metric: str) -> float:
    """The run's ``metric``; PPSGD and CENTAUR are judged by their clients' personal models."""
    return run[f"personalized_{metric}"] if method in PERSONALIZED else run[metric]


#: The ``--set`` suffix of the runs with the paper's own mechanism (Algorithm 1, K = 10)
UPDATE_MODE = "/dp-mode=update,noise-shares=10"


def results_table(dataset: str, model: str, grid: dict[str, Any], done: dict[str, Any], metric: str,
                  suffix: str = "") -> str:
    """Ours (mean ± std over seeds), the FedCEO − UDP-FedAvg gap per seed, ε, the paper's row.

    ``suffix``: the runs whose key ends so (e.g. :data:`UPDATE_MODE`); default the grid's own.
    """
    spec, paper = grid[model], grid[model]["paper"]
    rows = ["| σ_g | " + " | ".join(f"{LABELS[m]}" for m in METHODS) + " | FedCEO − UDP (pp) | max ε spent (UDP, FedCEO) "
            "| paper: UDP-FedAvg | PPSGD | CENTAUR | FedCEO (ϑ=1) | FedCEO (ϑ>1) | paper gap (pp) |",
            "|---|" + "---:|" * (len(METHODS) + 2) + "---:|---:|---:|---:|---:|---:|"]
    for i, sigma in enumerate(spec["sigma"]):
        cells, by_seed, eps = [], {}, []
        for method in METHODS:
            runs = [r for s in seeds_of(model, grid)
                    if (r := done.get(run_key(dataset, model, method, sigma, s) + suffix))]
            by_seed[method] = {r["config"]["seed"]: accuracy(r, method, metric) for r in runs}
            if method not in PERSONALIZED:  # they spend more: see global_model_table
                eps += [r["epsilon_spent_max"] for r in runs]
            cells.append(_stats(list(by_seed[method].values())))
        gaps = [v - by_seed["udp-fedavg"][s] for s, v in by_seed["fedceo"].items() if s in by_seed["udp-fedavg"]]
        theirs_cells = [f"{paper[m][i]:.2f}" for m in ("udp-fedavg", "ppsgd", "centaur", "fedceo-theta1", "fedceo")]
        rows.append(f"| {sigma:.1f} | " + " | ".join(cells) + f" | {_stats(gaps, signed=True)} | "
                    + (f"{max(eps):.2f}" if eps else "–") + " | " + " | ".join(theirs_cells)
                    + f" | {paper['fedceo'][i] - paper['udp-fedavg'][i]:+.2f} |")
    return "\n".join(rows)


def global_model_table(dataset: str, model: str, grid: dict[str, Any], done: dict[str, Any]) -> str:
    """PPSGD's and CENTAUR's *global* model on the test set (final / best), beside their
    clients' personal accuracy: what the main table would show if judged like the others."""
    rows = ["| σ_g | method | global model: final | global model: best | personal: final | max ε spent |",
            "|---|---|---:|---:|---:|---:|"]
    for sigma in grid[model]["sigma"]:
        for method in PERSONALIZED:
            runs = [r for s in seeds_of(model, grid) if (r := done.get(run_key(dataset, model, method, sigma, s)))]
            if runs:
                rows.append(f"| {sigma:.1f} | {LABELS[method]} | {_stats([r['final_accuracy'] for r in runs])} | "
                            f"{_stats([r['best_accuracy'] for r in runs])} | "
                            f"{_stats([r['personalized_final_accuracy'] for r in runs])} | "
                            f"{max(r['epsilon_spent_max'] for r in runs):.2f} |")
    return "\n".join(rows) if len(rows) > 2 else "not run"


def tune_table(dataset: str, model: str, grid: dict[str, Any], done: dict[str, Any]) -> str:
    spec, seed = grid[model], grid["tune-seed"]
    factors = spec["tune-factors"]
    rows = ["| σ_g | UDP-FedAvg | " + " | ".join(f"FedCEO λ = {f:g} × Table 2" for f in factors) + " |",
            "|---|---:|" + "---:|" * len(factors)]
    for i, sigma in enumerate(spec["sigma"]):
        lams = [spec["table2-lambda"][i] * f for f in factors]
        udp = done.get(run_key(dataset, model, "udp-fedavg", sigma, seed))
        cells = [udp] + [done.get(run_key(dataset, model, "fedceo", sigma, seed, lam)) for lam in lams]
        rows.append(f"| {sigma:.1f} | " + " | ".join(
            (f"{100 * r['final_accuracy']:.2f} / {100 * r['best_accuracy']:.2f}" if r else "–")
            + ("" if lam is None else f" (λ={lam:g})") for r, lam in zip(cells, [None, *lams], strict=True)) + " |")
    return "\n".join(rows)


def other_runs_table(dataset: str, grid: dict[str, Any], done: dict[str, Any]) -> str:
    """Runs with extra ``--set`` overrides (e.g. dp-mode = update): one row per run."""
    rows = ["| run | dp-mode | final acc. (%) | best acc. (%) | max ε spent |", "|---|---|---:|---:|---:|"]
    for key, r in sorted(done.items()):
        parts = key.split("/")
        if (parts[0] == dataset and len(parts) > 5 and not parts[5].startswith("lambda")
                and not key.endswith(UPDATE_MODE)):
            final, best = (100 * accuracy(r, parts[2], m) for m in ("final_accuracy", "best_accuracy"))
            rows.append(f"| `{'/'.join(parts[1:])}` | {r['dp_mode']} | {final:.2f} | "
                        f"{best:.2f} | {r['epsilon_spent_max']:.4g} |")
    return "\n".join(rows) if len(rows) > 2 else "none"


def write_report(grid: dict[str, Any], dataset: str, runs_json: Path = RUNS_JSON) -> None:
    """Fill ``results.template.md`` with the tables of every model in ``runs_json`` that has runs;
    ``results.md`` is written beside ``runs_json`` (so a run elsewhere writes nothing here)."""
    done = json.loads(runs_json.read_text()) if runs_json.exists() else {}
    tables = {}
    for model in ("mlp2", "lenet5"):
        for metric in ("final_accuracy", "best_accuracy"):
            tables[f"{model}_{metric}"] = results_table(dataset, model, grid, done, metric)
        tables[f"{model}_tune"] = tune_table(dataset, model, grid, done)
        tables[f"{model}_update"] = results_table(dataset, model, grid, done, "final_accuracy", UPDATE_MODE)
        tables[f"{model}_global"] = global_model_table(dataset, model, grid, done)
        runs = [r for k, r in done.items() if k.startswith(f"{dataset}/{model}/")]
        tables[f"{model}_runs"] = (f"{len(runs)} runs (grid, λ sweep and other runs), "
                                   f"{sum(r['wall_seconds'] for r in runs) / 60:.0f} min of wall time on a shared "
                                   "2-core CPU" if runs else "not run")
    tables["other_runs"] = other_runs_table(dataset, grid, done)
    template = (HERE / "results.template.md").read_text()
    (runs_json.parent / "results.md").write_text(template.format(dataset=dataset, **tables))
    print(f"wrote {runs_json.parent / 'results.md'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "tune", "report"))
    parser.add_argument("--model", choices=("mlp2", "lenet5"), default="mlp2")
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (processes)")
    parser.add_argument("--force", action="store_true", help="repeat runs already in runs.json")
    parser.add_argument("--sigma", type=float, action="append", help="only these σ_g (repeatable)")
    parser.add_argument("--seed", type=int, action="append", help="only these seeds (repeatable)")
    parser.add_argument("--method", choices=METHODS, action="append", help="only these methods (repeatable)")
    parser.add_argument("--runs-json", type=Path, default=RUNS_JSON,
                        help="where results are merged (default runs.json); results.md is written beside it, "
                             "and, for another path than the default, each run's results directory under runs/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key for every run (e.g. dataset=emnist)")
    args = parser.parse_args(argv)
    from privet.cli import parse_assignment

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    grid = load_grid()
    overrides = dict(parse_assignment(s) for s in args.set)
    if args.command != "report":
        jobs = (grid_jobs if args.command == "run" else tune_jobs)(args.model, grid, overrides)
        jobs = [(k, c) for k, c in jobs
                if (not args.sigma or c["noise-multiplier"] in args.sigma)
                and (not args.seed or c["seed"] in args.seed)
                and (not args.method or any(f"/{m}/" in k for m in args.method))]
        run_all(jobs, args.jobs, args.force, args.runs_json)
    with open(HERE / f"{args.model}.toml", "rb") as fh:
        dataset = str(overrides.get("dataset", tomllib.load(fh)["dataset"]))
    write_report(grid, dataset, args.runs_json)


if __name__ == "__main__":
    main()
