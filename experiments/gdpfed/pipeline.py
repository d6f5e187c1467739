"""A bare FedAvg loop in GDPFed's Fashion-MNIST regime: a fast proxy for one-factor experiments.

Why: a real privet run of Table 2's setting (n = 6000 clients × 10 examples, T = 50, q = 2 %)
takes 5-30 min through Flower; the non-private gap (P-FedAvg 73.7 against the paper's 78.96)
needs dozens of runs. This loop keeps what decides accuracy and drops the rest:

* the same data: ``tasks.datasets.load_dataset`` and the same IID partition
  (``tasks.partition.partition_indices``, seeded with the run seed, over the training pool of
  ``evaluation-split``: all 60,000 images, or the 50,000 outside the validation split);
* the same models (``tasks.models.build_model``, seeded with the run seed as the server does)
  and the same local training (``tasks.models.train_plain``: τ SGD steps of batch B, each
  client's shuffling seeded per (run seed, client, round) as ``client.round_plan.client_seed``);
* FedAvg: round t samples ⌊q·n⌋ clients uniformly without replacement and replaces θ by the
  example-weighted mean of their local models; optionally η_t = η·decay^(t−1).

No Flower, no ledgers, one process. With ``--method dp-fedavg | gdpfed | gdpfed-op |
gdpfed-plus`` the loop adds GDPFed's group mechanism as privet runs it: the plan (groups,
r_m, σ_m, ω_m, k_m/d) from ``strategies.gdpfed.plan_groups`` (σ_m calibrated by the ledgers'
accountant), each sampled client's update clipped to C with its share N(0, C²σ_m²/r_m) added by
``privacy.mechanisms.privatize_update``, each group's sum top-k sparsified (GDPFed+) and
θ ← θ + Σ_m ω_m ỹ_m. These are **bare-loop estimates**: no client checks, no accounting
(the plan's σ_m are what the ledgers would charge), noise from a seeded numpy generator.

One-factor knobs beyond the run config (each recorded): ``--norm`` (the project's standard
normalisation, pixels in [0, 1], or in [-1, 1]), ``--init`` (PyTorch's default or Glorot
uniform with zero biases), ``--model`` (tasks.models or a candidate defined here).

Every run appends one JSON line to ``pipeline/runs.jsonl`` (settings, accuracy after every
``--eval-every`` rounds and the last, seconds); ``--table`` renders ``pipeline/results.md``
from the records only.

Usage::

    nice -n 10 .venv/bin/python experiments/gdpfed/pipeline.py --seeds 1 2 3           # baseline, validation
    nice -n 10 .venv/bin/python experiments/gdpfed/pipeline.py --model cnn2 --seeds 1 2
    nice -n 10 .venv/bin/python experiments/gdpfed/pipeline.py --table
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
OUT = HERE / "pipeline"

from tasks.array_dataset import ArrayDataset  # noqa: E402
from tasks.datasets import load_dataset  # noqa: E402
from tasks.models import MODELS, build_model, evaluate, get_weights, seeded_torch, set_weights, train_plain  # noqa: E402
from tasks.partition import partition_indices  # noqa: E402
from tasks.validation_split import evaluation_set, training_pool  # noqa: E402

#: Table 2 (FMNIST) of the paper, for the table.
PAPER = {"fedavg": 78.96, "dp-fedavg": 71.88, "gdpfed": 73.97, "gdpfed-op": 75.65, "gdpfed-plus": 75.83}
#: Table 1's q_m (GDPFed-op / GDPFed+).
PAPER_Q = (0.0069, 0.0189, 0.0342)
#: Fashion-MNIST's standard constants (tasks.normalization.NORMALIZATION), to undo them.
FMNIST_MEAN, FMNIST_STD = 0.2860, 0.3530
NORMS = ("standard", "unit", "symmetric")
INITS = ("torch", "glorot")
METHODS = ("fedavg", "dp-fedavg", "gdpfed", "gdpfed-op", "gdpfed-plus")


# ------------------------------------------------------------------ candidate models
class CNNBN(nn.Module):
    """Candidate "2-layer CNN" with batch normalisation (Lockdown's ``CNN_MNIST``).

    The FMNIST model of the code base the GDPFed authors' group builds on (their AlignIns code
    acknowledges Lockdown): Conv(3x3, 32, no bias) -> BN -> ReLU -> MaxPool 2 -> Conv(3x3, 64, no bias) -> BN -> ReLU ->
    MaxPool 2 -> FC 128 (no bias) -> ReLU -> FC C (no bias). BN keeps no running statistics
    (``track_running_stats=False``), so it normalises with the batch's statistics in training and
    evaluation alike and has no buffers.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(input_shape[0], 32, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(32, track_running_stats=False)
        self.conv2 = nn.Conv2d(32, 64, 3, bias=False)
        self.bn2 = nn.BatchNorm2d(64, track_running_stats=False)
        side = ((input_shape[1] - 2) // 2 - 2) // 2
        self.fc1 = nn.Linear(64 * side * side, 128, bias=False)
        self.fc2 = nn.Linear(128, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        out: torch.Tensor = self.fc2(F.relu(self.fc1(x.flatten(1))))
        return out


class CNNNoBN(CNNBN):
    """:class:`CNNBN` without the batch normalisation (the ablation that tells BN from the layout)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        out: torch.Tensor = self.fc2(F.relu(self.fc1(x.flatten(1))))
        return out


CANDIDATES = {"cnn-bn": CNNBN, "cnn-nobn": CNNNoBN}


def make_model(name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int, init: str) -> nn.Module:
    """A model of tasks.models or a candidate, seeded like the server's initial model."""
    model: nn.Module
    if name in CANDIDATES:
        with seeded_torch(seed):
            model = CANDIDATES[name](input_shape, num_classes)
    else:
        model = build_model(name, input_shape=input_shape, num_classes=num_classes, seed=seed)
    if init == "glorot":  # Keras/TF defaults: Glorot-uniform kernels, zero biases
        with seeded_torch(seed), torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.Conv2d | nn.Linear):
                    nn.init.xavier_uniform_(m.weight)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
    return model


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Setting:
    """One run's settings (every field recorded). Defaults: privet's current P-FedAvg."""

    method: str = "fedavg"
    model: str = "cnn"
    norm: str = "standard"
    init: str = "torch"
    tau: int = 5
    batch: int = 10
    lr: float = 0.1
    lr_decay: float = 1.0
    momentum: float = 0.0
    rounds: int = 50
    q: float = 0.02
    clients: int = 6000
    split: str = "validation"
    clip: float = 1.5
    accountant: str = "prv"
    server_step: float = 1.0  # η_s: θ ← θ + η_s·(the round's aggregate); GDPFed+'s Σ ω_m r_m ≈ 0.5 acts as one
    noise_scale: float = 1.0  # a diagnostic only: σ_m × this (≠ 1: not the private run the ε says)
    seed: int = 1

    def factors(self) -> dict[str, Any]:
        """The fields that differ from the defaults of ``method`` (the run's one factor), seed excluded."""
        base = Setting(method=self.method, lr_decay=default_decay(self.method))
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("seed", "method", "split") and getattr(self, f.name) != getattr(base, f.name)}


def default_decay(method: str) -> float:
    """Decay per round as privet runs it: P-FedAvg (``fedavg``) none, the GDPFed family 0.99."""
    return 1.0 if method == "fedavg" else 0.99


# ------------------------------------------------------------------ data
def renormalise(x: np.ndarray, norm: str) -> np.ndarray:
    """Images normalised with the standard constants -> the ``norm`` scale (float32)."""
    if norm == "standard":
        return x
    unit = x * np.float32(FMNIST_STD) + np.float32(FMNIST_MEAN)  # pixels in [0, 1]
    return unit if norm == "unit" else (unit - np.float32(0.5)) / np.float32(0.5)


def federation(s: Setting) -> tuple[list[ArrayDataset], ArrayDataset]:
    """The clients' shards (privet's IID partition of the training pool) and the evaluation set."""
    splits = load_dataset("fashion-mnist")
    pool = training_pool(splits, s.split)
    x = renormalise(np.asarray(splits.train.x), s.norm)
    labels = splits.train.y[pool]
    shards = []
    for cid in range(s.clients):
        rows = pool[partition_indices(labels, s.clients, cid, method="iid", seed=s.seed)]
        shards.append(ArrayDataset(x[rows], splits.train.y[rows], splits.train.num_classes, f"client-{cid}"))
    held = evaluation_set(splits, s.split)
    evaluation = ArrayDataset(renormalise(np.asarray(held.x), s.norm), held.y, held.num_classes, held.name)
    return shards, evaluation


def client_seed(run_seed: int, partition_id: int, server_round: int) -> int:
    """``client.round_plan.client_seed`` (restated: experiments import nothing above tasks/strategies)."""
    return int(np.random.SeedSequence([run_seed, partition_id, server_round]).generate_state(1)[0])


# ------------------------------------------------------------------ the loop
@dataclass
class GroupRound:
    """The group mechanism of a DP method (from privet's own planner)."""

    members: list[np.ndarray]  # client ids of each group
    counts: list[int]
    sigmas: list[float]
    weights: list[float]
    sparsity: list[float]
    clip: float


def group_round(s: Setting) -> GroupRound:
    """The plan privet makes for ``s.method`` at Table 2's groups.

    ε = 0.5, 1.5, 3 in equal contiguous groups, δ = n^-1.1, σ_m from ``s.accountant`` (the ledgers').
    """
    from strategies.gdpfed import GDPFED_STRATEGIES, GDPFedConfig, plan_groups

    delta = s.clients ** -1.1
    third = s.clients // 3
    eps = [0.5] * third + [1.5] * third + [3.0] * (s.clients - 2 * third)
    rates = PAPER_Q if s.method in ("gdpfed-op", "gdpfed-plus") else ()
    params = GDPFedConfig(q=s.q, sample_rates=rates)
    plan, assign = plan_groups(GDPFED_STRATEGIES[s.method].variant, params, [(e, delta) for e in eps], s.rounds,
                               s.clip, lr=s.lr, local_steps=s.tau, accountant=s.accountant)
    groups = np.asarray(assign)
    return GroupRound([np.flatnonzero(groups == m) for m in range(len(plan.counts))], plan.counts, plan.sigmas,
                      plan.weights, plan.sparsity, s.clip)


def run(s: Setting, eval_every: int = 5) -> dict[str, Any]:
    """One run; the record appended to runs.jsonl."""
    started = time.perf_counter()
    shards, evaluation = federation(s)
    shape = tuple(int(v) for v in evaluation.x.shape[1:])
    model = make_model(s.model, shape, evaluation.num_classes, s.seed, s.init)  # type: ignore[arg-type]
    theta = [w.astype(np.float64) for w in get_weights(model)]
    plan = group_round(s) if s.method != "fedavg" else None
    noise = np.random.default_rng([s.seed, 0xD9])  # bare-loop estimate: seeded, never a deployment's noise
    curve: list[tuple[int, float]] = []
    per_round = max(1, int(s.q * s.clients))
    for t in range(1, s.rounds + 1):
        lr = s.lr * s.lr_decay ** (t - 1)
        rng = np.random.default_rng([s.seed, t])
        if plan is None:
            sampled = [sorted(rng.choice(s.clients, size=per_round, replace=False).tolist())]
        else:
            sampled = [sorted(rng.choice(g, size=r, replace=False).tolist()) for g, r in zip(plan.members, plan.counts,
                                                                                                 strict=True)]
        start = [w.astype(np.float32) for w in theta]
        step = [np.zeros_like(w) for w in theta]
        total = sum(len(shards[c]) for group in sampled for c in group)
        for m, group in enumerate(sampled):
            group_sum = [np.zeros_like(w) for w in theta]
            for c in group:
                set_weights(model, start)
                train_plain(model, shards[c], epochs=1, batch_size=s.batch, lr=lr, momentum=s.momentum,
                            seed=client_seed(s.seed, c, t), steps=s.tau)
                update = [w.astype(np.float64) - w0 for w, w0 in zip(get_weights(model), theta, strict=True)]
                if plan is None:  # FedAvg: the example-weighted mean of the local models
                    for acc, u in zip(step, update, strict=True):
                        acc += u * (len(shards[c]) / total)
                    continue
                from privacy.mechanisms import privatize_update

                noisy, _ = privatize_update(update, clip=plan.clip, noise_multiplier=plan.sigmas[m] * s.noise_scale,
                                            noise_shares=plan.counts[m], rng=noise)
                for acc, u in zip(group_sum, noisy, strict=True):
                    acc += u
            if plan is not None:
                from strategies.gdpfed_math import sparsify_top_k

                if plan.sparsity[m] < 1.0:
                    group_sum = sparsify_top_k(group_sum, plan.sparsity[m])
                for acc, y in zip(step, group_sum, strict=True):
                    acc += plan.weights[m] * np.asarray(y, np.float64)
        theta = [w + s.server_step * u for w, u in zip(theta, step, strict=True)]
        if t % eval_every == 0 or t == s.rounds:
            set_weights(model, [w.astype(np.float32) for w in theta])
            _, accuracy = evaluate(model, evaluation)
            curve.append((t, float(accuracy)))
            print(f"  round {t}: {evaluation.name} accuracy {accuracy:.4f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)
    return {**dataclasses.asdict(s), "factors": s.factors(), "curve": curve, "final": curve[-1][1],
            "best": max(a for _, a in curve), "seconds": time.perf_counter() - started,
            "sigmas": plan.sigmas if plan else None, "counts": plan.counts if plan else None,
            "commit": _commit()}


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ------------------------------------------------------------------ table
def _spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown, from the records only: one line per (method, split, factors).

    Final accuracy after T rounds (mean ± std over seeds), the best evaluated round, and the
    difference to the split's baseline.
    """
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    names = {f.name for f in dataclasses.fields(Setting)}
    for r in rows:
        factors = Setting(**{k: v for k, v in r.items() if k in names}).factors()
        groups.setdefault((r["method"], r["split"], json.dumps(factors, sort_keys=True)), []).append(r)
    base = {(m, sp): statistics.mean(100 * r["final"] for r in rs)
            for (m, sp, f), rs in groups.items() if f == "{}"}
    lines = ["| method | split | change from privet's setting | seeds | final acc. (%) | Δ to baseline | "
             "best evaluated round (%) | paper Table 2 | s / run |", "|---|---|---|---|---|---|---|---|---|"]
    for (method, split, key), rs in sorted(groups.items(), key=lambda kv: (METHODS.index(kv[0][0]), kv[0][1],
                                                                               kv[0][2] != "{}", kv[0][2])):
        final = [100 * r["final"] for r in rs]
        best = [100 * r["best"] for r in rs]
        ref = base.get((method, split))
        delta = f"{statistics.mean(final) - ref:+.2f}" if ref is not None and key != "{}" else ""
        change = ", ".join(f"{k} = {v}" for k, v in json.loads(key).items()) or "(baseline)"
        seeds = ",".join(str(r["seed"]) for r in sorted(rs, key=lambda r: r["seed"]))
        lines.append(f"| {method} | {split} | {change} | {seeds} | {_spread(final)} | {delta} | {_spread(best)} | "
                     f"{PAPER.get(method, '–')} | {statistics.mean(r['seconds'] for r in rs):.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the seeds of one setting (or none with ``--table``), then render results.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = Setting()
    parser.add_argument("--method", choices=METHODS, default=d.method)
    parser.add_argument("--model", choices=[*MODELS, *CANDIDATES], default=d.model)
    parser.add_argument("--norm", choices=NORMS, default=d.norm)
    parser.add_argument("--init", choices=INITS, default=d.init)
    parser.add_argument("--tau", type=int, default=d.tau)
    parser.add_argument("--batch", type=int, default=d.batch)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--lr-decay", type=float, default=None, help="default: privet's for the method")
    parser.add_argument("--momentum", type=float, default=d.momentum)
    parser.add_argument("--rounds", type=int, default=d.rounds)
    parser.add_argument("--q", type=float, default=d.q)
    parser.add_argument("--clients", type=int, default=d.clients)
    parser.add_argument("--split", choices=("validation", "test"), default=d.split)
    parser.add_argument("--clip", type=float, default=d.clip)
    parser.add_argument("--accountant", choices=("prv", "rdp"), default=d.accountant)
    parser.add_argument("--server-step", type=float, default=d.server_step,
                        help="server learning rate on the round's aggregate (default 1: the plain step)")
    parser.add_argument("--noise-scale", type=float, default=d.noise_scale,
                        help="diagnostic: multiply every sigma_m (1: the calibrated run; else not the stated eps)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT / "runs.jsonl")
    parser.add_argument("--table", action="store_true", help="only render results.md from the records")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small models on a shared 2-core machine
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    if not args.table:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            s = Setting(method=args.method, model=args.model, norm=args.norm, init=args.init, tau=args.tau,
                        batch=args.batch, lr=args.lr,
                        lr_decay=default_decay(args.method) if args.lr_decay is None else args.lr_decay,
                        momentum=args.momentum, rounds=args.rounds, q=args.q, clients=args.clients,
                        split=args.split, clip=args.clip, accountant=args.accountant,
                        server_step=args.server_step, noise_scale=args.noise_scale, seed=seed)
            print(f"{s}", flush=True)
            row = run(s, args.eval_every)
            print(json.dumps({k: row[k] for k in ("method", "factors", "seed", "final", "best", "seconds")}),
                  flush=True)
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()] if args.out.exists() else []
    text = table(rows)
    (args.out.parent / "results.md").write_text(
        "Bare-loop runs (experiments/gdpfed/pipeline.py), generated from runs.jsonl; final = accuracy after T "
        "rounds on the split named; seeds = run seeds (data partition, initialisation, sampling).\n\n" + text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
