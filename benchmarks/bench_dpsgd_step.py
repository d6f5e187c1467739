"""Cost of a DP-SGD step relative to a plain SGD step, per model and mode, with and without malloc tuning.

    python benchmarks/bench_dpsgd_step.py --out benchmarks/results/dpsgd_step.md
    python benchmarks/bench_dpsgd_step.py --render benchmarks/results/dpsgd_step.json   # tables from the record

For each model the same batches go through: plain SGD, Opacus with per-sample gradient
hooks (``grad_sample_mode="hooks"``), Opacus ghost clipping (``"ghost"``, fast gradient
clipping: two backward passes), ``"functorch"`` (vmap), privet's book-keeping clipping
(``"bk"``, ``client/bk_dpsgd.py``: one backward pass) and, for Linear-only models, its Linear-only
form (``"linear"``, ``client/linear_dpsgd.py``). Every DP mode draws its noise from the same
source a client uses (``--noise``, default ``csprng``).

Each pass runs in two fresh processes, one with glibc malloc tuned as at client start
(``client/allocator.py``) and one with glibc's defaults (``PRIVET_MALLOC_TUNE=0``; mallopt cannot
be undone in a process). Within a process every batch goes through every mode's step back to
back, the order rotating from batch to batch, so machine load hits all modes alike (issue 11); the
two processes of a pass run back to back, their order alternating. Reported per malloc setting,
model and mode: the median over passes of (median ms/step), and the DP / plain ratio (both from the same process) as the median over passes with its
min-max spread. The record (``.json`` beside ``--out``) holds every pass; ``--render`` rebuilds the
tables from it. Only ratios are meant to be compared across machines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


import torch  # noqa: E402
from records import machine, write  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from client.bk_dpsgd import BookKeepingDPSGD  # noqa: E402
from client.linear_dpsgd import LinearDPSGD  # noqa: E402
from privacy.randomness import NOISE_SOURCES, noise_source  # noqa: E402
from tasks.model_names import BK_MODE, LINEAR_MODE, LINEAR_MODELS, MODELS  # noqa: E402
from tasks.models import build_model  # noqa: E402

MODES = ("plain", "hooks", "ghost", "functorch", LINEAR_MODE, BK_MODE)


def _loader(shape: tuple[int, int, int], n: int, batch: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, generator=g)


def _step_of(model: nn.Module, optimizer: torch.optim.Optimizer,
             criterion: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        optimizer.zero_grad()
        criterion(model(xb), yb).backward()
        optimizer.step()
    return step


def _linear_step_of(stepper: BookKeepingDPSGD,
                    optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor, torch.Tensor], None]:
    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        optimizer.zero_grad()
        stepper.batch_gradients(xb, yb)
        optimizer.step()
    return step


def _mode_step(name: str, mode: str, shape: tuple[int, int, int], batch: int,
               noise: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One step of ``mode`` on a fresh ``name`` model (seed 0), as a client would take it."""
    from opacus import PrivacyEngine

    from client.training import _private_noise

    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=10, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    if mode in (LINEAR_MODE, BK_MODE):
        kind = LinearDPSGD if mode == LINEAR_MODE else BookKeepingDPSGD
        return _linear_step_of(kind(model, clip=1.0, noise_multiplier=1.0, expected_batch_size=batch,
                                    noise=noise_source(noise)), optimizer)
    if mode == "plain":
        return _step_of(model, optimizer, criterion)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = PrivacyEngine().make_private(
            module=model, optimizer=optimizer, criterion=criterion, data_loader=_loader(shape, batch * 2, batch),
            noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False, grad_sample_mode=mode,
        )
    if len(made) == 4:
        model, optimizer, criterion, _ = made
    else:
        model, optimizer, _ = made
    _private_noise(optimizer, noise_source(noise))  # the noise a client draws, as in training
    return _step_of(model, optimizer, criterion)


def bench_model(name: str, shape: tuple[int, int, int], batch: int, steps: int,
                noise: str = "csprng") -> dict[str, float]:
    """Median seconds per step of every mode that applies to ``name`` (NaN where one does not).

    Every batch goes through every mode's step back to back, the order rotating from batch to
    batch, so a burst of load on the shared machine hits every mode alike; the first two steps
    of each mode warm up and are not counted.
    """
    modes = [m for m in MODES if m != LINEAR_MODE or name in LINEAR_MODELS]
    runners = {mode: _mode_step(name, mode, shape, batch, noise) for mode in modes}
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, *shape, generator=g), torch.randint(0, 10, (batch,), generator=g))
               for _ in range(steps)]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for k, (xb, yb) in enumerate(batches):
        for mode in modes[k % len(modes):] + modes[:k % len(modes)]:
            t0 = time.perf_counter()
            runners[mode](xb, yb)
            times[mode].append(time.perf_counter() - t0)
    return {mode: statistics.median(times[mode][2:]) if mode in times else float("nan") for mode in MODES}


def _child(args: argparse.Namespace) -> None:
    """One pass in this process: every model × mode once; prints the seconds per step as JSON."""
    torch.set_num_threads(1)
    from client.allocator import tune_malloc

    tuned = tune_malloc()  # a no-op under PRIVET_MALLOC_TUNE=0
    out = {name: bench_model(name, (1, 28, 28), args.batch, args.steps, args.noise) for name in args.models}
    print(json.dumps({"malloc_tuned": tuned, "seconds": out}))


def _pass(args: argparse.Namespace, tuned: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", "--batch", str(args.batch), "--steps", str(args.steps),
           "--noise", args.noise, "--models", *args.models]
    env = {**os.environ, "PRIVET_MALLOC_TUNE": "1" if tuned else "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench pass failed\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["malloc_tuned"] != tuned:
        raise RuntimeError(f"asked for malloc tuning {tuned}, the child had {result['malloc_tuned']}")
    return result


def _cell(values: list[float]) -> str:
    return "–" if any(math.isnan(v) for v in values) else \
        f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def render(record: dict) -> str:
    """The markdown tables of a record: one per malloc setting, then tuned / default per mode."""
    cfg = record["config"]
    passes = record["passes"]
    models = cfg["models"]
    lines = [
        "# DP-SGD step vs plain SGD step, with and without malloc tuning", "",
        f"`benchmarks/bench_dpsgd_step.py --repeats {cfg['repeats']} --steps {cfg['steps']}`, {record['date']}, "
        f"{record['cpus']} CPUs, load average {record['load_start']:.2f} at the start and {record['load_end']:.2f} at "
        f"the end. Batch {cfg['batch']}, 1 thread, {cfg['steps']} batches per model and pass, each through every mode "
        f"back to back (the order rotating), median of the last {cfg['steps'] - 2} steps per mode and pass; "
        f"{cfg['repeats']} passes, each a fresh process per malloc setting; noise from the {cfg['noise']} "
        "source. Ratio: DP / plain within one process, median over passes [min-max]. linear: Linear-only models; "
        "bk: book-keeping clipping.", ""]
    for tuned, title in ((True, "glibc malloc tuned (client/allocator.py, what a client runs)"),
                         (False, "glibc malloc defaults (PRIVET_MALLOC_TUNE=0)")):
        runs = [p["seconds"] for p in passes if p["malloc_tuned"] == tuned]
        if not runs:
            continue
        lines += [f"## {title}", "",
                  "| model | " + " | ".join(f"{m} ms" for m in MODES) + " | "
                  + " | ".join(f"{m} / plain" for m in MODES[1:]) + " |",
                  "|---" * (2 * len(MODES)) + "|"]
        for name in models:
            ms = [statistics.median(r[name][m] for r in runs) * 1e3 for m in MODES]
            ratios = [_cell([r[name][m] / r[name]["plain"] for r in runs]) for m in MODES[1:]]
            lines.append(f"| {name} | " + " | ".join("–" if math.isnan(v) else f"{v:.2f}" for v in ms)
                         + " | " + " | ".join(ratios) + " |")
        lines.append("")
    tuned_runs = [p["seconds"] for p in passes if p["malloc_tuned"]]
    default_runs = [p["seconds"] for p in passes if not p["malloc_tuned"]]
    if tuned_runs and default_runs:
        lines += ["## Tuned / default step time (pass k tuned over pass k default, median [min-max])", "",
                  "| model | " + " | ".join(MODES) + " |", "|---" * (len(MODES) + 1) + "|"]
        for name in models:
            cells = [_cell([t[name][m] / d[name][m] for t, d in zip(tuned_runs, default_runs, strict=True)])
                     for m in MODES]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Time every model × mode in interleaved passes, tuned and default malloc; write record and tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dpsgd_step.md",
                        help="the tables; the record goes beside it (.json)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--noise", choices=NOISE_SOURCES, default="csprng",
                        help="where every DP mode draws its noise (a client's default: csprng)")
    parser.add_argument("--malloc", choices=("both", "tuned", "default"), default="both")
    parser.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the tables from this record")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    if args.render:
        record = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(render(record))
        print(render(record))
        return
    settings = {"both": [True, False], "tuned": [True], "default": [False]}[args.malloc]
    load_start = os.getloadavg()[0]
    passes = []
    for rep in range(args.repeats):
        for tuned in settings if rep % 2 == 0 else settings[::-1]:
            result = _pass(args, tuned)
            passes.append({"pass": rep, **result})
            print(rep, "tuned" if tuned else "default",
                  {n: {m: f"{v * 1e3:.2f}" for m, v in r.items()} for n, r in result["seconds"].items()}, flush=True)
    record = {**machine(load_start),
              "config": {k: getattr(args, k) for k in ("batch", "steps", "repeats", "models", "noise")},
              "passes": passes}
    write(args.out, record, render)


if __name__ == "__main__":
    main()
