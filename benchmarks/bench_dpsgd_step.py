"""Cost of an Opacus DP-SGD step relative to a plain SGD step, per model, in one run.

    python benchmarks/bench_dpsgd_step.py --out benchmarks/results/dpsgd_step.md

For each model the same batches go through: plain SGD, Opacus with per-sample gradient
hooks (``grad_sample_mode="hooks"``), Opacus ghost clipping (``"ghost"``, fast gradient
clipping) and ``"functorch"`` (vmap). The variants are interleaved: ``--repeats`` passes,
each timing every model × mode once, so machine load hits all of them alike (issue 11).
Reported per model × mode: the median over passes of (median ms/step), and the DP / plain
ratio as the median over passes with its min-max spread. glibc malloc is tuned as at client
start (``client/allocator.py``). Only ratios are meant to be compared across machines.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tasks.models import MODELS, build_model

MODES = ("plain", "hooks", "ghost", "functorch")


def _loader(shape: tuple[int, int, int], n: int, batch: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, generator=g)


def _time_steps(model, optimizer, criterion, loader, steps: int) -> list[float]:
    times = []
    it = iter(loader)
    for _ in range(steps):
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return times[2:]  # drop warm-up


def bench_model(name: str, shape: tuple[int, int, int], batch: int, steps: int) -> dict[str, float]:
    from opacus import PrivacyEngine

    out: dict[str, float] = {}
    for mode in MODES:
        torch.manual_seed(0)
        model = build_model(name, input_shape=shape, num_classes=10, seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        criterion = nn.CrossEntropyLoss()
        loader = _loader(shape, batch * 8, batch)
        if mode != "plain":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                made = PrivacyEngine().make_private(
                    module=model, optimizer=optimizer, criterion=criterion, data_loader=loader,
                    noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False,
                    grad_sample_mode=mode,
                )
            if len(made) == 4:
                model, optimizer, criterion, loader = made
            else:
                model, optimizer, loader = made
        out[mode] = statistics.median(_time_steps(model, optimizer, criterion, loader, steps))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/dpsgd_step.md")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from client.allocator import tune_malloc

    tune_malloc()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.models}
    for rep in range(args.repeats):
        for name in args.models:
            r = bench_model(name, (1, 28, 28), args.batch, args.steps)
            runs[name].append(r)
            print(rep, name, {k: f"{v * 1e3:.2f} ms" for k, v in r.items()}, flush=True)
    lines = [
        f"DP-SGD step vs plain SGD step (batch {args.batch}, 1 thread, median of {args.steps - 2} steps, "
        f"{args.repeats} interleaved passes; ratio: median over passes [min-max])",
        "",
        "| model | plain ms | hooks ms | ghost ms | functorch ms | hooks / plain | ghost / plain | functorch / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in runs.items():
        ms = {m: statistics.median(r[m] for r in rs) * 1e3 for m in MODES}
        ratios = {m: [r[m] / r["plain"] for r in rs] for m in MODES[1:]}
        lines.append(f"| {name} | " + " | ".join(f"{ms[m]:.2f}" for m in MODES) + " | " + " | ".join(
            f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" for v in ratios.values()) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
