"""Book-keeping DP-SGD: how a convolution's input patches are gathered, and what it does to the step.

    python benchmarks/bench_bk_patches.py --out benchmarks/results/bk_patches.md
    python benchmarks/bench_bk_patches.py --render benchmarks/results/bk_patches.json

``client/bk_dpsgd.py`` computes a convolution's per-example gradients G_i = g_i a_iᵀ from its
input patches a_i (B, T, d). Three ways to gather them, all exact (the same G_i up to the order
of a patch's d entries, which the weight gradient is permuted back from):

- **channels-last** (what ``client/bk_dpsgd.py`` does): one strided copy of the padded input in
  (B, H, W, C_in) layout viewed as (B, H', W', k_h, k_w, C_in); each patch row's innermost
  k_w·C_in entries are contiguous in memory;
- **channels-first** (the previous version): one strided copy of the (B, C_in, H, W) input viewed
  as (B, H', W', C_in, k_h, k_w); the innermost run is k_w entries;
- **unfold**: ``F.unfold`` transposed to (B, T, C_in·k_h·k_w).

For every convolution-holding model and every variant, in one process with one thread: the
gather alone per convolution, and a whole book-keeping step (forward, one backward, norms,
clipped sum, noise from the client's ``csprng`` source) against a plain SGD step on the same
batches. Within a pass every batch goes through every variant back to back, the order rotating
from batch to batch, so machine load hits them alike; reported: the median over passes of (median ms), and ratios within a pass,
median [min-max] over passes. Before timing, every variant's clipped sum (σ = 0) is checked
against the channels-last one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from records import machine, write  # noqa: E402
from torch import nn  # noqa: E402

import client.bk_dpsgd as bk  # noqa: E402
from privacy.randomness import noise_source  # noqa: E402
from tasks.models import build_model  # noqa: E402

CONV_MODELS = ("cnn", "lenet5", "cnn2")
VARIANTS = ("channels-last", "channels-first", "unfold")
Gather = Callable[[nn.Conv2d, torch.Tensor], torch.Tensor]
AsWeight = Callable[[nn.Conv2d, torch.Tensor], torch.Tensor]


def _padded(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    padding = layer.padding
    assert not isinstance(padding, str), "the project's convolutions give numeric padding"
    pads = [padding[1], padding[1], padding[0], padding[0]]
    return F.pad(x, pads) if any(pads) else x


def channels_first(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The previous ``_patches``: (B, T, C_in·k_h·k_w) from a strided view of the (B, C_in, H, W) input."""
    x = _padded(layer, x)
    batch, channels, height, width = x.shape
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.stride, layer.dilation
    out_h, out_w = (height - dh * (kh - 1) - 1) // sh + 1, (width - dw * (kw - 1) - 1) // sw + 1
    sb, sc, sy, sx = x.stride()
    view = x.as_strided((batch, out_h, out_w, channels, kh, kw), (sb, sy * sh, sx * sw, sc, sy * dh, sx * dw))
    return view.reshape(batch, out_h * out_w, channels * kh * kw)


def unfold(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``F.unfold``'s (B, C_in·k_h·k_w, T), transposed."""
    assert not isinstance(layer.padding, str)
    return F.unfold(x, layer.kernel_size, dilation=layer.dilation, padding=layer.padding,
                    stride=layer.stride).transpose(1, 2)


def weight_order(layer: nn.Conv2d, grad: torch.Tensor) -> torch.Tensor:
    """A gradient already in the weight's (C_out, C_in, k_h, k_w) order."""
    return grad.reshape(layer.weight.shape)


GATHERS: dict[str, tuple[Gather, AsWeight]] = {
    "channels-last": (bk._patches, bk._as_weight),
    "channels-first": (channels_first, weight_order),
    "unfold": (unfold, weight_order),
}


def use(variant: str) -> None:
    """Make ``client.bk_dpsgd`` gather patches the ``variant`` way (module globals its step looks up)."""
    bk._patches, bk._as_weight = GATHERS[variant]  # type: ignore[assignment]


def _batches(batch: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(count)]


def check_exact(name: str, batch: int) -> float:
    """Largest |difference| between a variant's clipped sum (σ = 0) and the channels-last one."""
    xb, yb = _batches(batch, 1)[0]
    grads: dict[str, list[torch.Tensor]] = {}
    for variant in VARIANTS:
        use(variant)
        model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
        bk.BookKeepingDPSGD(model, clip=1.0, noise_multiplier=0.0, expected_batch_size=batch,
                            noise=noise_source("csprng")).batch_gradients(xb, yb)
        grads[variant] = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    use("channels-last")
    worst = max(float((a - b).abs().max()) for v in VARIANTS[1:]
                for a, b in zip(grads["channels-last"], grads[v], strict=True))
    scale = max(float(a.abs().max()) for a in grads["channels-last"])
    if worst > 1e-5 * max(scale, 1.0):
        raise AssertionError(f"{name}: a gather variant's clipped sum differs by {worst:.2e} (scale {scale:.2e})")
    return worst


def _rotated(items: list[str], k: int) -> list[str]:
    return items[k % len(items):] + items[:k % len(items)]


def one_pass(name: str, batch: int, steps: int) -> dict[str, Any]:
    """Median seconds of the gathers alone (per convolution) and of whole steps, step by step interleaved.

    Every batch goes through every variant's step (and the plain step) back to back, the order
    rotating from batch to batch, so a burst of load on the machine hits all of them.
    """
    batches = _batches(batch, steps)
    model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    inputs: list[torch.Tensor] = []
    hooks = [c.register_forward_hook(lambda _m, i, _o: inputs.append(i[0].detach())) for c in convs]
    with torch.no_grad():
        model(batches[0][0])
    for h in hooks:
        h.remove()
    gather_times: dict[str, list[list[float]]] = {v: [[] for _ in convs] for v in VARIANTS}
    for k in range(steps):
        for variant in _rotated(list(VARIANTS), k):
            fn = GATHERS[variant][0]
            for j, (conv, a) in enumerate(zip(convs, inputs, strict=True)):
                t0 = time.perf_counter()
                fn(conv, a).contiguous()
                gather_times[variant][j].append(time.perf_counter() - t0)
    runners: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {}
    for variant in VARIANTS:
        m = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
        stepper = bk.BookKeepingDPSGD(m, clip=1.0, noise_multiplier=1.0, expected_batch_size=batch,
                                      noise=noise_source("csprng"))
        runners[variant] = partial(_dp_step, torch.optim.SGD(m.parameters(), lr=0.05), stepper)
    plain_model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
    runners["plain"] = partial(_plain_step, plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.05))
    step_times: dict[str, list[float]] = {v: [] for v in runners}
    for k, (xb, yb) in enumerate(batches):
        for variant in _rotated(list(runners), k):
            use(variant if variant != "plain" else "channels-last")
            t0 = time.perf_counter()
            runners[variant](xb, yb)
            step_times[variant].append(time.perf_counter() - t0)
    use("channels-last")
    shapes = [f"{c.in_channels}→{c.out_channels}, {c.kernel_size[0]}×{c.kernel_size[1]}" for c in convs]
    return {"gather": {v: [statistics.median(t[2:]) for t in ts] for v, ts in gather_times.items()},
            "step": {v: statistics.median(t[2:]) for v, t in step_times.items()}, "convs": shapes}


def _dp_step(opt: torch.optim.Optimizer, stepper: bk.BookKeepingDPSGD, xb: torch.Tensor, yb: torch.Tensor) -> None:
    opt.zero_grad()
    stepper.batch_gradients(xb, yb)
    opt.step()


def _plain_step(model: nn.Module, opt: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor) -> None:
    opt.zero_grad()
    F.cross_entropy(model(xb), yb).backward()
    opt.step()


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def render(record: dict[str, Any]) -> str:
    """The markdown tables of a record."""
    cfg = record["config"]
    lines = [
        "# Book-keeping DP-SGD: gathering a convolution's patches", "",
        f"`benchmarks/bench_bk_patches.py --passes {cfg['passes']} --steps {cfg['steps']}`, {record['date']}, "
        f"{record['cpus']} CPUs, load average {record['load_start']:.2f} at the start and {record['load_end']:.2f} "
        f"at the end. Batch {cfg['batch']}, 1 thread, one process, {cfg['passes']} passes of {cfg['steps']} batches; "
        "each batch goes through every variant back to back, the order rotating from batch to batch; per pass the "
        f"median of the last {cfg['steps'] - 2} steps; ratios within a pass, median [min-max] over passes. Every variant's clipped sum equals channels-last's (largest "
        f"difference {max(record['exact'].values()):.1e}).", "",
        "## The gather alone, per convolution (ms)", "",
        "| model | convolution | channels-last | channels-first | unfold | channels-first / channels-last "
        "| unfold / channels-last |",
        "|---|---|---:|---:|---:|---:|---:|"]
    for name in cfg["models"]:
        passes = record["passes"][name]
        for k, conv in enumerate(passes[0]["convs"]):
            ms = [statistics.median(p["gather"][v][k] for p in passes) * 1e3 for v in VARIANTS]
            ratios = [_cell([p["gather"][v][k] / p["gather"]["channels-last"][k] for p in passes])
                      for v in VARIANTS[1:]]
            lines.append(f"| {name} | {conv} | " + " | ".join(f"{x:.2f}" for x in ms) + " | "
                         + " | ".join(ratios) + " |")
    lines += ["", "## A whole book-keeping step against a plain SGD step", "",
              "| model | plain ms | bk ms, channels-last | bk / plain, channels-last | bk / plain, channels-first "
              "| bk / plain, unfold | channels-first step / channels-last step |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name in cfg["models"]:
        passes = record["passes"][name]
        plain = statistics.median(p["step"]["plain"] for p in passes) * 1e3
        last = statistics.median(p["step"]["channels-last"] for p in passes) * 1e3
        ratios = [_cell([p["step"][v] / p["step"]["plain"] for p in passes]) for v in VARIANTS]
        gain = _cell([p["step"]["channels-first"] / p["step"]["channels-last"] for p in passes])
        lines.append(f"| {name} | {plain:.2f} | {last:.2f} | " + " | ".join(ratios) + f" | {gain} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Check the variants agree, time them in rotating order, write the record and its tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bk_patches.md",
                        help="the tables; the record goes beside it (.json)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(CONV_MODELS), choices=CONV_MODELS)
    parser.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the tables from this record")
    args = parser.parse_args()
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text())))
        return
    torch.set_num_threads(1)
    from client.allocator import tune_malloc

    tune_malloc()  # as a client process does
    load_start = os.getloadavg()[0]
    exact = {name: check_exact(name, args.batch) for name in args.models}
    passes: dict[str, list[dict[str, Any]]] = {name: [] for name in args.models}
    for k in range(args.passes):
        for name in args.models:
            passes[name].append(one_pass(name, args.batch, args.steps))
            print(k, name, {v: f"{s * 1e3:.1f}" for v, s in passes[name][-1]["step"].items()}, flush=True)
    record = {**machine(load_start), "exact": exact,
              "config": {k: getattr(args, k) for k in ("batch", "steps", "passes", "models")}, "passes": passes}
    write(args.out, record, render)


if __name__ == "__main__":
    main()
