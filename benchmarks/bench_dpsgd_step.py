"""Cost of an Opacus DP-SGD step relative to a plain SGD step, per model, in one run.

    python benchmarks/bench_dpsgd_step.py --out benchmarks/results/dpsgd_step.md

For each model the same batches go through: plain SGD, Opacus with per-sample gradient
hooks (``grad_sample_mode="hooks"``), Opacus ghost clipping (``"ghost"``, fast gradient
clipping), ``"functorch"`` (vmap) and, for Linear-only models, privet's closed form
(``"linear"``, ``client/linear_dpsgd.py``). Every DP mode draws its noise from the same
source a client uses (``--noise``, default ``csprng``). The variants are interleaved: ``--repeats`` passes,
each timing every model × mode once, so machine load hits all of them alike (issue 11).
Reported per model × mode: the median over passes of (median ms/step), and the DP / plain
ratio as the median over passes with its min-max spread. glibc malloc is tuned as at client
start (``client/allocator.py``). Only ratios are meant to be compared across machines.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from client.linear_dpsgd import LinearDPSGD
from privacy.randomness import NOISE_SOURCES, noise_source
from tasks.models import LINEAR_MODE, LINEAR_MODELS, MODELS, build_model

MODES = ("plain", "hooks", "ghost", "functorch", LINEAR_MODE)


def _loader(shape: tuple[int, int, int], n: int, batch: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, generator=g)


def _time_steps(step: Callable[[torch.Tensor, torch.Tensor], None], loader: DataLoader, steps: int) -> list[float]:
    times = []
    it = iter(loader)
    for _ in range(steps):
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        t0 = time.perf_counter()
        step(xb, yb)
        times.append(time.perf_counter() - t0)
    return times[2:]  # drop warm-up


def _step_of(model: nn.Module, optimizer: torch.optim.Optimizer,
             criterion: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        optimizer.zero_grad()
        criterion(model(xb), yb).backward()
        optimizer.step()
    return step


def _linear_step_of(stepper: LinearDPSGD,
                    optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        optimizer.zero_grad()
        stepper.batch_gradients(xb, yb)
        optimizer.step()
    return step


def bench_model(name: str, shape: tuple[int, int, int], batch: int, steps: int, noise: str) -> dict[str, float]:
    """Median seconds per step of every mode that applies to ``name`` (NaN where one does not)."""
    from opacus import PrivacyEngine

    from client.training import _private_noise

    out: dict[str, float] = {}
    for mode in MODES:
        if mode == LINEAR_MODE and name not in LINEAR_MODELS:
            out[mode] = float("nan")
            continue
        torch.manual_seed(0)
        model = build_model(name, input_shape=shape, num_classes=10, seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        criterion = nn.CrossEntropyLoss()
        loader = _loader(shape, batch * 8, batch)
        if mode == LINEAR_MODE:
            step = _linear_step_of(LinearDPSGD(model, clip=1.0, noise_multiplier=1.0, expected_batch_size=batch,
                                               noise=noise_source(noise)), optimizer)
        elif mode == "plain":
            step = _step_of(model, optimizer, criterion)
        else:
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
            _private_noise(optimizer, noise_source(noise))  # the noise a client draws, as in training
            step = _step_of(model, optimizer, criterion)
        out[mode] = statistics.median(_time_steps(step, loader, steps))
    return out


def main() -> None:
    """Time every model × mode in interleaved passes; write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/dpsgd_step.md")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--noise", choices=NOISE_SOURCES, default="csprng",
                        help="where every DP mode draws its noise (a client's default: csprng)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from client.allocator import tune_malloc

    tune_malloc()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.models}
    for rep in range(args.repeats):
        for name in args.models:
            r = bench_model(name, (1, 28, 28), args.batch, args.steps, args.noise)
            runs[name].append(r)
            print(rep, name, {k: f"{v * 1e3:.2f} ms" for k, v in r.items()}, flush=True)
    lines = [
        f"DP-SGD step vs plain SGD step (batch {args.batch}, 1 thread, median of {args.steps - 2} steps, "
        f"{args.repeats} interleaved passes, noise from the {args.noise} source; ratio: median over passes "
        "[min-max]; linear: the closed form for Linear-only models)",
        "",
        "| model | " + " | ".join(f"{m} ms" for m in MODES) + " | " + " | ".join(f"{m} / plain" for m in MODES[1:]) + " |",
        "|---" * (2 * len(MODES)) + "|",
    ]
    for name, rs in runs.items():
        ms = {m: statistics.median(r[m] for r in rs) * 1e3 for m in MODES}
        ratios = {m: [r[m] / r["plain"] for r in rs] for m in MODES[1:]}
        lines.append(f"| {name} | " + " | ".join("–" if math.isnan(ms[m]) else f"{ms[m]:.2f}" for m in MODES)
                     + " | " + " | ".join("–" if math.isnan(v[0]) else
                                         f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
                                         for v in ratios.values()) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
