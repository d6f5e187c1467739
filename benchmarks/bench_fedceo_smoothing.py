"""Cost of the FedCEO server step against FedAvg aggregation and local training.

Times, in one run and on the same random client models:

- FedAvg aggregation: the unweighted mean over clients of every parameter;
- FedCEO smoothing with the full spectrum (K slice SVDs per parameter, as the
  authors' code does) and with the half spectrum (⌊K/2⌋+1 slice SVDs, rfft);
- one local epoch of plain SGD for the MLP-2 on 600 random 28×28 examples, as a
  rough reference for what a client spends per round.

Each time is the median over up to ``--repeats`` runs; a measurement stops repeating
once its runs have taken ``--budget-s`` seconds, so the slow cases (LeNet-5, K = 50)
run fewer times (the table lists how many).

Usage (from the repository root)::

    python benchmarks/bench_fedceo_smoothing.py \\
        --out benchmarks/results/fedceo_smoothing.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Parameter shapes (PyTorch layout), hard-coded so the benchmark does not depend on
# tasks/. Sources: docs/notes/fedceo.md §3.2 and docs/notes/original-code.md "Data and
# models" (authors' models.py).
# MLP-2 ("MLP-2-Layers", EMNIST): Linear(784→64, bias=False), Linear(64→C, bias=False),
# with C = 37 as in the authors' train.sh (--num_classes 37).
MLP2_SHAPES: list[tuple[int, ...]] = [(64, 784), (37, 64)]
# LeNet-5 (the authors' CNNCifar, CIFAR-10): Conv(3→32, 5), Conv(32→64, 5),
# FC 1600→512, FC 512→512, FC 512→10, all with bias.
LENET5_SHAPES: list[tuple[int, ...]] = [
    (32, 3, 5, 5), (32,),
    (64, 32, 5, 5), (64,),
    (512, 1600), (512,),
    (512, 512), (512,),
    (10, 512), (10,),
]  # fmt: skip
MODELS = {"MLP-2": MLP2_SHAPES, "LeNet-5": LENET5_SHAPES}

# Threshold of the CIFAR-10 σg = 2.0 setting (λ = 0.6, ϑ = 1.04, I = 10) at t = I.
# The cost is dominated by the SVDs and hardly depends on it.
LAM, THETA, INTERVAL = 0.6, 1.04, 10


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="markdown output file")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--repeats", type=int, default=5, help="max runs per timing")
    parser.add_argument(
        "--budget-s", type=float, default=5.0, help="stop repeating after this long"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS/LAPACK and torch threads (1 is steadier on a shared machine)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def limit_threads(n: int) -> None:
    """Must run before numpy is imported: OpenBLAS reads these at load time."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def timed(fn: Callable[[], object], repeats: int, budget_s: float) -> tuple[float, int]:
    """Median wall time of ``fn`` in seconds, and the number of runs taken."""
    runs: list[float] = []
    while len(runs) < repeats and sum(runs) < budget_s:
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), len(runs)


def random_clients(rng: Any, shapes: list[tuple[int, ...]], k: int) -> list[list[Any]]:
    """K float32 client models: a shared random model plus independent noise."""
    import numpy as np

    common = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    noise = [[0.1 * rng.standard_normal(c.shape).astype(np.float32) for c in common]
             for _ in range(k)]  # fmt: skip
    return [[c + n for c, n in zip(common, client, strict=True)] for client in noise]


def local_epoch_seconds(repeats: int, seed: int) -> float:
    """One epoch of plain SGD (B = 64) for the MLP-2 on 600 random 28×28 examples."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    (hidden, inputs), (classes, _) = MLP2_SHAPES
    model = nn.Sequential(  # the authors' MLP: Linear → Dropout → ReLU → Linear
        nn.Flatten(),
        nn.Linear(inputs, hidden, bias=False),
        nn.Dropout(0.5),
        nn.ReLU(),
        nn.Linear(hidden, classes, bias=False),
        nn.LogSoftmax(dim=1),
    )
    x = torch.randn(600, 1, 28, 28)
    y = torch.randint(0, classes, (600,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    loss_fn = nn.NLLLoss()

    def epoch() -> None:
        for idx in torch.randperm(600).split(64):
            optimizer.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()

    epoch()  # warm-up
    return timed(epoch, repeats, budget_s=float("inf"))[0]


def main() -> None:
    args = parse_args()
    limit_threads(args.threads)
    sys.path.insert(0, str(ROOT))

    import numpy as np
    import torch

    from strategies.fedceo_smoothing import (
        mean_model,
        smooth_client_models,
        smoothing_threshold,
    )

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    thr = smoothing_threshold(INTERVAL, lam=LAM, theta=THETA, interval=INTERVAL)
    epoch_s = local_epoch_seconds(repeats=7, seed=args.seed)
    wall_start = time.perf_counter()

    budget = (args.repeats, args.budget_s)
    rows = []
    for name, shapes in MODELS.items():
        for k in args.clients:
            clients = random_clients(rng, shapes, k)
            fedavg, n_avg = timed(partial(mean_model, clients), *budget)
            smooth = partial(smooth_client_models, clients, thr)
            full, n_full = timed(partial(smooth, half_spectrum=False), *budget)
            half, n_half = timed(partial(smooth, half_spectrum=True), *budget)
            num_params = sum(int(np.prod(s)) for s in shapes)
            runs = (n_avg, n_full, n_half)
            rows.append((name, num_params, k, fedavg, full, half, runs))
            sys.stderr.write(f"{name} K={k}: {fedavg:.4f}/{full:.3f}/{half:.3f} s\n")

    lines = [
        "# FedCEO smoothing cost",
        "",
        f"Generated by `benchmarks/bench_fedceo_smoothing.py` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"(shared with other jobs), {args.threads} BLAS/torch thread(s), "
        f"numpy {np.__version__}, torch {torch.__version__}.",
        "",
        f"Random float32 client models (shared part + noise); threshold "
        f"thr = ϑ^(t/I)/(2λ) = {thr:.4f} (λ={LAM}, ϑ={THETA}, I={INTERVAL}, t=I). "
        f"Median wall time of up to {args.repeats} runs, stopping after "
        f"{args.budget_s:g} s per measurement; runs column = FedAvg/full/half.",
        "",
        "| model | params | K | FedAvg mean | full-spectrum smoothing "
        "| half-spectrum smoothing | full / FedAvg | half / FedAvg | full / half "
        "| half / local epoch | runs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, num_params, k, fedavg, full, half, runs in rows:
        lines.append(
            f"| {name} | {num_params:,} | {k} | {fedavg * 1e3:.2f} ms "
            f"| {full * 1e3:,.0f} ms | {half * 1e3:,.0f} ms | {full / fedavg:,.0f}× "
            f"| {half / fedavg:,.0f}× | {full / half:.2f} | {half / epoch_s:,.1f}× "
            f"| {'/'.join(map(str, runs))} |"
        )
    lines += [
        "",
        f"Local-training reference: one epoch of plain SGD (B = 64, momentum 0.5) for "
        f"the MLP-2 on 600 random 28×28 examples: {epoch_s * 1e3:.1f} ms "
        "(median of 7). "
        "The last ratio uses this MLP-2 epoch for both models.",
        "",
        "Notes:",
        "",
        "- The smoothing runs only on rounds t with t % I == 0, so its cost per round "
        "is the table value divided by I (10–30 in the paper).",
        "- FedCEO's clients train E = 30 local epochs per round with Opacus per-sample "
        "DP-SGD, each far slower than the plain epoch above; a round's client time is "
        "therefore much larger than this reference.",
        "- Smoothing cost is dominated by the complex slice SVDs of the largest "
        "matrices (LeNet-5 fc1: 1600×512, fc2: 512×512). The half spectrum computes "
        "⌊K/2⌋+1 instead of K of them (ideal full / half: 1.67 at K = 10, 1.92 at "
        "K = 50); single runs on a shared machine scatter around that.",
        f"- Wall time of the smoothing measurements: "
        f"{time.perf_counter() - wall_start:.0f} s.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
