"""FedCEO's claim tested in its own regime (issue 15): MLP-2, 100 clients, 10 % sampled.

The reduced grid of ``reproduce.py`` (I = 1-3, half the clients sampled, one local epoch)
leaves FedCEO nothing to remove: the weight matrices carry no singular value above their
noise bulk. This driver first checks that precondition, then tunes λ and ϑ on the
validation split and compares UDP-FedAvg, FedCEO and the ``restart = global`` ablation on
the test split over several seeds::

    python experiments/fedceo/fair.py precondition --out DIR   # UDP-FedAvg, spectra at 10/50/100
    python experiments/fedceo/fair.py tune --out DIR           # λ × ϑ on the validation split
    python experiments/fedceo/fair.py run --out DIR --seeds 1 2 3 4 5
    python experiments/fedceo/fair.py report --out DIR         # DIR/results.md

Every run's record goes to ``DIR/runs.jsonl`` and its results directory under ``DIR/runs/``;
nothing is written elsewhere. The regime is ``fair-mlp2.toml``; ``--set`` overrides it and names
the variant (its table goes to ``DIR/results-<overrides>.md``). UDP-FedAvg ignores ``fedceo.*``,
so a variant such as ``--set fedceo.interval=20`` reuses its precondition check and runs::

    python experiments/fedceo/fair.py tune --out DIR --set fedceo.interval=20
    python experiments/fedceo/fair.py run --out DIR --set fedceo.interval=20 --methods udp-fedavg fedceo

**Precondition.** FedCEO's global model on a smoothing round is the FedAvg average with its
singular values soft-thresholded by thr(t)/K, layer by layer (notes ``fedceo.md`` §2.3), so it
can only help where a layer holds directions above the noise. For each weight matrix W
(m × n) of the UDP-FedAvg model after rounds 10, 50 and 100 the edge of the DP noise's bulk is
estimated twice: from the mechanism (:func:`analytic_noise_edge`, the noise all DP-SGD steps
so far put into the average), and from W's own median singular value, as Gavish & Donoho
(2014) do for an unknown noise level (an m × n matrix of i.i.d. noise has its largest singular
value at ≈ s_med · r(m, n), r measured on a Gaussian matrix of the same shape; a layer whose
signal has full rank, such as a 10-class output layer, raises its median too). The
precondition holds when some layer's top singular value is at least 1.5 × the DP-noise edge.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per run: the SVDs thrash otherwise
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

REGIME = HERE / "fair-mlp2.toml"
#: a layer "stands clearly above the noise" when its top singular value exceeds this × the bulk edge
CLEARLY_ABOVE = 1.5
CHECK_ROUNDS = (10, 50, 100)
#: the tuning grid, (λ / λ*, ϑ): λ* = 1/(2·K·edge) puts the first threshold thr/K at the median-based
#: bulk edge of the hidden layer measured by ``precondition`` (a smaller λ thresholds higher, and soft
#: thresholding zeroes every singular value of a layer below the threshold: the model collapses);
#: ϑ as in Table 2 (1 = the "FedCEO (ϑ=1)" ablation). ϑ > 1 only raises a threshold, so (f, 1.06)
#: is left out where (f, 1) already smooths too hard: at (1, 1) the output layer is zeroed
#: (validation accuracy 0.10), and every step to a milder threshold (2, 4, 8, 16) did better, so
#: the grid goes on to 128 λ* (a threshold 1/128 of the bulk edge) to find where that stops.
TUNING_GRID = ((1.0, 1.0), (2.0, 1.0), (4.0, 1.0), (8.0, 1.0), (16.0, 1.0), (32.0, 1.0), (64.0, 1.0),
               (128.0, 1.0))
TUNE_SEED = 0
#: what a FedCEO run is tuned by: a test record made at other values is run again
SMOOTHING_KEYS = ("fedceo.lambda", "fedceo.theta")
METHODS = {"udp-fedavg": "UDP-FedAvg", "fedceo": "FedCEO", "fedceo-global": "FedCEO, restart = global"}


# ----------------------------------------------------------------------------- runs

def plain_sets(sets: list[str]) -> list[str]:
    """The overrides UDP-FedAvg sees: ``fedceo.*`` keys change nothing there, so its runs (and the
    precondition check) are shared by every FedCEO variant, e.g. ``--set fedceo.interval=20``."""
    return sorted(s for s in sets if not s.startswith("fedceo."))


def base_config(sets: list[str]) -> dict[str, Any]:
    """App defaults < ``fair-mlp2.toml`` < ``--set``."""
    from privet.cli import load_experiment

    return load_experiment(str(REGIME), sets, None)


def execute(job: tuple[str, dict[str, Any], str]) -> dict[str, Any]:
    """One in-process run (real ServerApp logic and ClientApp); its ``runs.jsonl`` record."""
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    key, cfg, out = job
    started = time.perf_counter()
    grid = InProcessGrid(client_app, simulation_node_configs(int(cfg["num-clients"])), cfg)
    summary = run_experiment(grid, cfg, run_id=1)
    rounds = [json.loads(x) for x in (Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()]
    accuracy = [r["accuracy"] for r in rounds]
    return {"key": key, "config": {k: cfg[k] for k in sorted(cfg) if k != "out-dir"}, "out": out,
            "accuracy_by_round": accuracy, "final_accuracy": accuracy[-1], "best_accuracy": max(accuracy[1:]),
            "last10_accuracy": statistics.fmean(accuracy[-10:]),
            "thresholds": [r["fedceo-threshold"] for r in rounds if r.get("fedceo-smoothed")],
            "within_budget": all(c["within_budget"] for c in summary["clients"]),
            "epsilon_spent_max": max(c["epsilon_spent"] or 0.0 for c in summary["clients"]),
            "seconds": time.perf_counter() - started}


def load_records(out: Path) -> dict[str, dict[str, Any]]:
    path = out / "runs.jsonl"
    records: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records[record["key"]] = record
    return records


def needs_run(done: dict[str, dict[str, Any]], key: str, cfg: dict[str, Any]) -> bool:
    """A job is run unless a record of its key was made at the same λ and ϑ (a re-tuned method's
    test runs are run again; the newer record replaces the older)."""
    return key not in done or any(done[key]["config"].get(k) != cfg[k] for k in SMOOTHING_KEYS if k in cfg)


def run_jobs(out: Path, jobs: list[tuple[str, dict[str, Any]]], workers: int) -> dict[str, dict[str, Any]]:
    """Run the jobs ``out/runs.jsonl`` lacks, or holds at another λ or ϑ (:func:`needs_run`), each
    record appended as it lands."""
    done = load_records(out)
    todo = [(key, {**cfg, "out-dir": str(out / "runs" / key)}, str(out / "runs" / key))
            for key, cfg in jobs if needs_run(done, key, cfg)]
    print(f"{len(todo)} runs to do ({len(jobs) - len(todo)} already in {out / 'runs.jsonl'})", flush=True)
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        for record in pool.map(execute, todo):
            with open(out / "runs.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
            done[record["key"]] = record
            print(f"{record['key']}: final {record['final_accuracy']:.4f} last-10 {record['last10_accuracy']:.4f} "
                  f"({record['seconds']:.0f} s)", flush=True)
    return done


def method_sets(method: str, lam: float, theta: float) -> dict[str, Any]:
    if method == "udp-fedavg":
        return {"strategy": "udp-fedavg"}
    return {"strategy": "fedceo", "fedceo.lambda": lam, "fedceo.theta": theta,
            "fedceo.restart": "global" if method == "fedceo-global" else "own"}


# ----------------------------------------------------------------------------- precondition

def bulk_edge_ratio(m: int, n: int, draws: int = 5) -> float:
    """Largest / median singular value of an m × n i.i.d. Gaussian matrix (seeded, averaged)."""
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(draws):
        s = np.linalg.svd(rng.standard_normal((m, n)), compute_uv=False)
        ratios.append(s[0] / np.median(s))
    return float(np.mean(ratios))


def analytic_noise_edge(cfg: dict[str, Any], rounds: int, m: int, n: int) -> float:
    """The bulk edge s_t(√m + √n) of the DP noise alone in the global model after ``rounds``.

    A second estimate, from the mechanism instead of the spectrum: each DP-SGD step adds
    N(0, (lr·σC/(n_k q))²) per weight (Opacus divides the noisy sum by the expected batch
    n_k q), heavy-ball momentum μ carries each draw on with total weight 1/(1 − μ), a client
    takes E·⌈n_k/B⌉ steps per round, the average over K clients divides the variance by K, and
    rounds add up: s_t = lr·σ·C/(n_k q)/(1 − μ) · √(E·⌈n_k/B⌉·t/K). It ignores what training
    does to the noise (the loss pulls weights back), so it is an upper estimate.
    """
    from privacy.mechanisms import dpsgd_sample_rate, dpsgd_steps_per_round

    examples, batch = int(cfg["max-examples-per-client"]), int(cfg["batch-size"])
    q = dpsgd_sample_rate(examples, batch)
    steps = dpsgd_steps_per_round(examples, batch, int(cfg["local-epochs"]), int(cfg.get("local-steps", 0)))
    k = max(int(cfg["min-train-clients"]), int(float(cfg["fraction-train"]) * int(cfg["num-clients"])))
    per_step = float(cfg["learning-rate"]) * float(cfg["noise-multiplier"]) * float(cfg["clip"]) / (examples * q)
    s = per_step / (1 - float(cfg["momentum"])) * (steps * rounds / k) ** 0.5
    return s * (m ** 0.5 + n ** 0.5)


def spectrum_report(path: Path) -> list[dict[str, Any]]:
    """Per weight matrix: top singular values, the estimated bulk edge and their ratio."""
    rows = []
    with np.load(path) as saved:
        for name in saved.files:
            w = saved[name]
            if w.ndim < 2:
                continue
            w = w.reshape(w.shape[0], -1)
            s = np.linalg.svd(w, compute_uv=False)
            edge = float(np.median(s)) * bulk_edge_ratio(*sorted(w.shape))
            rows.append({"layer": name, "shape": list(w.shape), "top": [float(x) for x in s[:5]],
                         "edge": edge, "ratio": float(s[0] / edge),
                         "above_edge": int(np.sum(s > edge))})
    return rows


def assess(check: dict[str, Any], cfg: dict[str, Any]) -> bool:
    """Add each layer's DP-noise edge (:func:`analytic_noise_edge`) to ``check`` and decide it."""
    ratios = []
    for r, rows in check["rounds"].items():
        for row in rows:
            row["dp_edge"] = analytic_noise_edge(cfg, int(r), *sorted(row["shape"]))
            row["dp_ratio"] = row["top"][0] / row["dp_edge"]
            ratios.append(row["dp_ratio"])
    check["passes"] = bool(ratios) and max(ratios) >= CLEARLY_ABOVE
    return bool(check["passes"])


def precondition(out: Path, sets: list[str]) -> dict[str, Any]:
    sets = plain_sets(sets)
    cfg = base_config(sets + ["strategy=udp-fedavg", f"seed={TUNE_SEED}", "evaluation-split=validation",
                              "checkpoint-rounds=" + ", ".join(map(str, CHECK_ROUNDS))])
    key = "precondition/" + ",".join(sorted(sets))
    record = run_jobs(out, [(key, cfg)], 1)[key]
    run_dir = Path(record["out"])
    check: dict[str, Any] = {"key": key, "local-epochs": cfg["local-epochs"], "rounds": {}}
    for r in CHECK_ROUNDS:
        path = run_dir / f"model-round-{r:04d}.npz"
        if path.exists():
            check["rounds"][r] = spectrum_report(path)
    assess(check, cfg)
    checks = load_checks(out)
    checks[key] = check
    (out / "precondition.json").write_text(json.dumps(checks, indent=1))
    for r, rows in check["rounds"].items():
        for row in rows:
            print(f"round {r} {row['layer']} {row['shape']}: top {row['top'][0]:.3f}, DP-noise edge "
                  f"{row['dp_edge']:.3f} ({row['dp_ratio']:.2f}x), median-based edge {row['edge']:.3f}")
    print("precondition", "holds" if check["passes"] else "FAILS", flush=True)
    return check


# ----------------------------------------------------------------------------- tuning and runs

def load_checks(out: Path) -> dict[str, Any]:
    """Every precondition check run into ``out`` (``precondition.json``), by run key."""
    path = out / "precondition.json"
    return json.loads(path.read_text()) if path.exists() else {}


def lambda_star(out: Path, sets: list[str]) -> float:
    """λ* = 1/(2·K·edge): thr(I)/K = ϑ/(2λK) then sits at the bulk edge of the layer with the
    largest top/edge ratio at the first checked round, in the check run with the same ``--set``."""
    key = "precondition/" + ",".join(plain_sets(sets))
    check = load_checks(out).get(key)
    if check is None:
        raise SystemExit(f"no precondition check for {key} in {out}: run `fair.py precondition` with the same --set")
    first = check["rounds"][str(CHECK_ROUNDS[0])]
    edge = max(first, key=lambda row: row["ratio"])["edge"]
    cfg = base_config([])
    k = max(int(cfg["min-train-clients"]), int(float(cfg["fraction-train"]) * int(cfg["num-clients"])))
    return 1.0 / (2 * k * edge)


def tune(out: Path, sets: list[str], workers: int) -> None:
    star = lambda_star(out, sets)
    jobs = [(f"tune/udp-fedavg{run_suffix('udp-fedavg', sets)}",
             base_config(plain_sets(sets) + ["strategy=udp-fedavg", f"seed={TUNE_SEED}", "evaluation-split=validation"]))]
    for factor, theta in TUNING_GRID:
        lam = float(f"{star * factor:.4g}")
        extra = [f"{k}={v}" for k, v in method_sets("fedceo", lam, theta).items()]
        jobs.append((f"tune/fedceo/lambda{lam:g}/theta{theta:g}{run_suffix('fedceo', sets)}",
                     base_config(sets + extra + [f"seed={TUNE_SEED}", "evaluation-split=validation"])))
    run_jobs(out, jobs, workers)


def run_suffix(method: str, sets: list[str]) -> str:
    """The end of a run's key: the overrides that method's runs were made with."""
    return "/" + ",".join(plain_sets(sets) if method == "udp-fedavg" else sorted(sets))


def tuned(out: Path, sets: list[str]) -> tuple[float, float]:
    """(λ, ϑ) with the best mean validation accuracy over the last 10 rounds (runs with these ``--set``)."""
    runs = [r for k, r in load_records(out).items()
            if k.startswith("tune/fedceo/") and k.endswith(run_suffix("fedceo", sets))]
    if not runs:
        raise SystemExit(f"no tuning runs in {out / 'runs.jsonl'}: run `fair.py tune --out {out}` first")
    best = max(runs, key=lambda r: r["last10_accuracy"])
    return float(best["config"]["fedceo.lambda"]), float(best["config"]["fedceo.theta"])


def run(out: Path, sets: list[str], seeds: list[int], methods: list[str], workers: int) -> None:
    lam, theta = tuned(out, sets)
    print(f"tuned on the validation split: lambda {lam:g}, theta {theta:g}", flush=True)
    jobs = []
    for seed in seeds:
        for method in methods:
            own = plain_sets(sets) if method == "udp-fedavg" else sorted(sets)
            extra = [f"{k}={v}" for k, v in method_sets(method, lam, theta).items()]
            jobs.append((f"test/{method}/seed{seed}{run_suffix(method, sets)}",
                         base_config(own + extra + [f"seed={seed}"])))
    run_jobs(out, jobs, workers)


# ----------------------------------------------------------------------------- report

#: the seeds the first report was written on; later seeds are out of sample for its claims
FIRST_SEEDS = frozenset(f"seed{i}" for i in range(1, 6))


def seed_blocks(by_method: dict[str, dict[str, dict[str, Any]]], base: dict[str, dict[str, Any]]) -> list[str]:
    """The last-10 paired gap on the first seeds (1-5) and on the seeds run after them, apart:
    whether a claim made on seeds 1-5 holds out of sample (empty when no later seed was run)."""
    from privet.paired import bootstrap_interval, paired_gaps

    rows = []
    for method in ("fedceo", "fedceo-global"):
        paired = by_method.get(method, {})
        later = sorted(set(paired) & set(base) - FIRST_SEEDS, key=lambda s: int(s.removeprefix("seed")))
        if not later:
            continue
        for name, block in (("seeds 1-5", sorted(set(paired) & set(base) & FIRST_SEEDS)),
                            (f"seeds {later[0][4:]}-{later[-1][4:]}", later)):
            if not block:
                continue
            gaps = list(paired_gaps({s: 100 * paired[s]["last10_accuracy"] for s in block},
                                    {s: 100 * base[s]["last10_accuracy"] for s in block}).values())
            low, high = bootstrap_interval(gaps)
            rows.append(f"| {METHODS[method]} | {name} ({len(block)}) | {statistics.fmean(gaps):+.2f} "
                        f"[{low:+.2f}, {high:+.2f}] | {sum(g > 0 for g in gaps)} of {len(gaps)} |")
    if not rows:
        return []
    return ["Out of sample: the last-10 paired gap on the first seeds and on the seeds run after them, apart "
            "(percentage points, mean and 95 % bootstrap interval; seeds where FedCEO is ahead):", "",
            "| method | seeds | gap, last 10 (pp) | ahead |", "|---|---|---:|---:|", *rows, ""]


def results_name(sets: list[str]) -> str:
    """``results.md`` for the regime as written, ``results-<overrides>.md`` for a variant of it."""
    return "results.md" if not sets else f"results-{','.join(sorted(sets))}.md"


def report(out: Path, sets: list[str]) -> str:
    from privet.paired import bootstrap_interval, paired_gaps

    records = load_records(out)
    lines = ["# FedCEO in its own regime: MLP-2, 100 clients, 10 % sampled (Fashion-MNIST)", "",
             f"Written by `experiments/fedceo/fair.py report` from `{out / 'runs.jsonl'}`.", ""]
    cfg = base_config(sets)
    lines += [f"Regime (`fair-mlp2.toml`{''.join(f', {s}' for s in sorted(sets))}): N = {cfg['num-clients']}, K = {int(cfg['fraction-train'] * cfg['num-clients'])} "
              f"per round, T = {cfg['num-server-rounds']}, E = {cfg['local-epochs']} local epochs of B = "
              f"{cfg['batch-size']} on {cfg['max-examples-per-client']} examples, lr {cfg['learning-rate']} (momentum "
              f"{cfg['momentum']}), per-example DP-SGD at σ_g = {cfg['noise-multiplier']}, C = {cfg['clip']}, "
              f"I = {cfg['fedceo.interval']}.", ""]
    for key, check in load_checks(out).items():
        if key in records:
            assess(check, records[key]["config"])
        lines += [f"## Precondition: singular values above the noise (UDP-FedAvg, validation run `{key}`, "
                  f"E = {check['local-epochs']})", "",
                  "| round | layer | shape | top 3 singular values | DP-noise edge | top / DP edge | "
                  "median-based edge | top / median edge |", "|---:|---|---|---|---:|---:|---:|---:|"]
        for r, rows in check["rounds"].items():
            for row in rows:
                lines.append(f"| {r} | {row['layer']} | {row['shape'][0]}×{row['shape'][1]} | "
                             f"{', '.join(f'{x:.2f}' for x in row['top'][:3])} | {row.get('dp_edge', float('nan')):.2f} | "
                             f"{row.get('dp_ratio', float('nan')):.2f} | {row['edge']:.2f} | {row['ratio']:.2f} |")
        lines += ["", f"Precondition (top ≥ {CLEARLY_ABOVE} × the DP-noise edge in some layer): "
                  f"**{'holds' if check['passes'] else 'fails'}**.", ""]
    ours = {k: r for k, r in records.items() if k.endswith(run_suffix(k.split("/")[1], sets))}
    tune_runs = {k: r for k, r in ours.items() if k.startswith("tune/")}
    if tune_runs:
        lines += ["## Tuning on the validation split (seed 0)", "",
                  "| run | λ | ϑ | final | last 10 rounds |", "|---|---:|---:|---:|---:|"]
        for k, r in sorted(tune_runs.items()):
            c = r["config"]
            fed = c.get("strategy") == "fedceo"
            lines.append(f"| {k.split('/')[1]} | {c['fedceo.lambda'] if fed else '–'} | "
                         f"{c['fedceo.theta'] if fed else '–'} | {r['final_accuracy']:.4f} | "
                         f"{r['last10_accuracy']:.4f} |")
        lines.append("")
    test_runs = {k: r for k, r in ours.items() if k.startswith("test/")}
    if test_runs:
        by_method: dict[str, dict[str, dict[str, Any]]] = {}
        for k, r in test_runs.items():
            _, method, seed, *_ = k.split("/")
            by_method.setdefault(method, {})[seed] = r
        lines += ["## Test accuracy over seeds", "",
                  "| method | seeds | final | best | mean of last 10 |", "|---|---:|---:|---:|---:|"]
        sd = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0)
        for method, label in METHODS.items():
            runs = list(by_method.get(method, {}).values())
            if not runs:
                continue
            cells = []
            for metric in ("final_accuracy", "best_accuracy", "last10_accuracy"):
                xs = [100 * r[metric] for r in runs]
                cells.append(f"{statistics.fmean(xs):.2f} ± {sd(xs):.2f}")
            lines.append(f"| {label} | {len(runs)} | {' | '.join(cells)} |")
        lines += ["", "Paired gaps to UDP-FedAvg (same seed: same sampling, data and initial model), "
                  "percentage points, mean and 95 % bootstrap interval:", "",
                  "| method | final | best | mean of last 10 |", "|---|---:|---:|---:|"]
        base = by_method.get("udp-fedavg", {})
        for method in ("fedceo", "fedceo-global"):
            paired = by_method.get(method, {})
            seeds = sorted(set(paired) & set(base))
            if not seeds:
                continue
            cells = []
            for metric in ("final_accuracy", "best_accuracy", "last10_accuracy"):
                gaps = list(paired_gaps({s: 100 * r[metric] for s, r in paired.items()},
                                        {s: 100 * r[metric] for s, r in base.items()}).values())
                low, high = bootstrap_interval(gaps)
                cells.append(f"{statistics.fmean(gaps):+.2f} [{low:+.2f}, {high:+.2f}]")
            lines.append(f"| {METHODS[method]} ({len(seeds)} seeds) | {' | '.join(cells)} |")
        lines.append("")
        lines += seed_blocks(by_method, base)
    text = "\n".join(lines)
    (out / results_name(sets)).write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("precondition", "tune", "run", "report"))
    parser.add_argument("--out", type=Path, required=True, help="folder for runs.jsonl, runs/ and results.md")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of fair-mlp2.toml in every run (part of each run's key)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "precondition":
        precondition(args.out, args.set)
    elif args.command == "tune":
        tune(args.out, args.set, args.jobs)
    elif args.command == "run":
        run(args.out, args.set, args.seeds, args.methods, args.jobs)
    print(report(args.out, args.set))
    return 0


if __name__ == "__main__":
    sys.exit(main())
