"""Cost of the PFA / PFA+ server step against FedAvg aggregation.

Times, in one run and on the same random client updates (M = 30 clients, 3 public and
27 private, as in the paper's M = 30 setting with the top 10% by ε public):

- FedAvg aggregation: the unweighted mean over clients of every parameter tensor;
- PFA (Alg. 3) with the subspace from the exact thin SVD of the public updates;
- PFA with the randomized range finder instead (``method="randomized"``);
- PFA+ server step (Alg. 5): reconstruct the private ε-weighted mean from the
  coordinates with the previous subspace, and fit the next subspace;
- PFA+ client step: encoding one private update as k coordinates per tensor.

for the paper's MNIST logistic regression and 2-layer CNN and k ∈ {1, 5}, all with the
default centring (authors' code). Each time is the median over ``--repeats`` runs,
interleaved across the steps, after one warm-up run.

Usage::

    python benchmarks/bench_pfa_subspace.py --out benchmarks/results/pfa_subspace.md
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Parameter shapes (TensorFlow/Keras layout: dense (in, out), conv (h, w, in, out)),
# hard-coded so the benchmark does not depend on tasks/. Source:
# docs/notes/pfa.md §3.2 (authors' modules/logistic_reg.py and modules/cnn.py).
# LogR: W 784×10 and b 10, p = 7,850 (Table 5).
LOGR_SHAPES: list[tuple[int, ...]] = [(784, 10), (10,)]
# "2-layer CNN", the TF-Privacy tutorial CNN, p = 26,010 (Table 5), 8 tensors:
# Conv 16 8×8 s2 'same' → MaxPool 2 s1 → Conv 32 4×4 s2 'valid' → MaxPool 2 s1 →
# Flatten (512) → Dense 32 → Dense 10.
CNN_SHAPES: list[tuple[int, ...]] = [
    (8, 8, 1, 16), (16,),
    (4, 4, 16, 32), (32,),
    (512, 32), (32,),
    (32, 10), (10,),
]  # fmt: skip
MODELS = {"MNIST LogR": LOGR_SHAPES, "MNIST CNN": CNN_SHAPES}
NUM_CLIENTS, NUM_PUBLIC = 30, 3
K_VALUES = (1, 5)


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="markdown output file")
    parser.add_argument("--repeats", type=int, default=101, help="runs per timing")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS/LAPACK threads (1 is steadier on a shared machine)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def limit_threads(n: int) -> None:
    """Must run before numpy is imported: OpenBLAS reads these at load time."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def timed(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time in seconds of each function over ``repeats`` rounds.

    The functions run interleaved (one call of each per round, after one warm-up
    round), so load from other jobs on a shared machine hits all of them alike and
    the ratios stay meaningful even when absolute times drift.
    """
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if round_ > 0:
                runs[name].append(time.perf_counter() - start)
    return {name: statistics.median(r) for name, r in runs.items()}


def random_updates(shapes: list[tuple[int, ...]], eps: Any, seed: int) -> list[Any]:
    """Float32 updates: a shared signal plus noise of std 1/ε_m (DP-like)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    signal = [rng.standard_normal(s) for s in shapes]
    return [
        [(g + rng.standard_normal(g.shape) / e).astype(np.float32) for g in signal]
        for e in eps
    ]


def measure(
    updates: list[Any], eps: Any, public_mask: Any, k: int, repeats: int
) -> dict[str, float]:
    """Median seconds of every timed step for one model and one k."""
    from protocol import pfa_plus
    from strategies import layers, pfa_plus_projection
    from strategies import pfa_projection as pfa

    public = [u for u, p in zip(updates, public_mask, strict=True) if p]
    private = [u for u, p in zip(updates, public_mask, strict=True) if not p]
    _, subspaces, diag = pfa.pfa_aggregate(updates, eps, k=k, public_mask=public_mask)

    def encode(update: list[Any]) -> list[Any]:
        return [
            pfa_plus.encode_coordinates(layer, s.basis, center=s.center)
            for layer, s in zip(update, subspaces, strict=True)
        ]

    coords = [encode(u) for u in private]
    ones = [1.0] * len(eps)
    eps_public, eps_private = eps[public_mask], eps[~public_mask]
    steps: dict[str, Callable[[], object]] = {
        "fedavg": lambda: layers.weighted_mean(updates, ones),
        "exact": lambda: pfa.pfa_aggregate(updates, eps, k=k, public_mask=public_mask),
        "randomized": lambda: pfa.pfa_aggregate(
            updates, eps, k=k, public_mask=public_mask, method="randomized"
        ),
        "plus": lambda: pfa_plus_projection.pfa_plus_aggregate(
            public, coords, eps_public, eps_private, subspaces, k=k
        ),
        "encode": lambda: encode(private[0]),
    }
    return {"k_eff": diag[pfa.DIAG_K_MAX], **timed(steps, repeats)}


def main() -> None:
    """Time every step, print the markdown table and write it to ``--out``."""
    args = parse_args()
    limit_threads(args.threads)
    sys.path.insert(0, str(ROOT))

    import numpy as np

    from strategies import pfa_plus_projection

    rng = np.random.default_rng(args.seed)
    # MixGauss1-like budgets: 3 public clients at ε ≈ 10, 27 private at ε ≈ 0.1
    n_private = NUM_CLIENTS - NUM_PUBLIC
    eps = np.concatenate(
        [rng.normal(10.0, 0.1, NUM_PUBLIC), rng.normal(0.1, 0.01, n_private)]
    )
    public_mask = np.arange(NUM_CLIENTS) < NUM_PUBLIC
    wall_start = time.perf_counter()

    rows = []
    for name, shapes in MODELS.items():
        sizes = [math.prod(s) for s in shapes]
        updates = random_updates(shapes, eps, args.seed)
        for k in K_VALUES:
            times = measure(updates, eps, public_mask, k, args.repeats)
            uplink = pfa_plus_projection.uplink_floats(sizes, k, private=True, plus=True)
            rows.append((name, sum(sizes), k, uplink, times))
            print(f"{name} k={k}: {times}", file=sys.stderr)

    lines = [
        "# PFA / PFA+ server cost",
        "",
        f"Generated by `benchmarks/bench_pfa_subspace.py` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"(shared with other jobs), {args.threads} BLAS thread(s), "
        f"numpy {np.__version__}.",
        "",
        f"M = {NUM_CLIENTS} random float32 client updates ({NUM_PUBLIC} public at "
        f"ε ≈ 10, {n_private} private at ε ≈ 0.1), per-tensor subspaces, "
        f"centred (authors' code). Median wall time of {args.repeats} interleaved "
        "runs after one warm-up; ratios are against the FedAvg mean of the same "
        "updates.",
        "",
        "| model | params | k (effective) | FedAvg mean | PFA exact SVD "
        "| PFA randomized | PFA+ server | PFA+ client encode | exact / FedAvg "
        "| randomized / FedAvg | PFA+ / FedAvg | private uplink floats |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, n, k, uplink, t in rows:
        lines.append(
            f"| {name} | {n:,} | {k} ({t['k_eff']:.0f}) | {t['fedavg'] * 1e3:.2f} ms "
            f"| {t['exact'] * 1e3:.2f} ms | {t['randomized'] * 1e3:.2f} ms "
            f"| {t['plus'] * 1e3:.2f} ms | {t['encode'] * 1e3:.3f} ms "
            f"| {t['exact'] / t['fedavg']:.1f}× | {t['randomized'] / t['fedavg']:.1f}× "
            f"| {t['plus'] / t['fedavg']:.1f}× | {uplink} of {n:,} |"
        )
    lines += [
        "",
        "Notes:",
        "",
        "- k (effective): with 3 public clients the centred public matrix has "
        "rank ≤ 2, "
        "so k = 5 is clipped to 2 (and k ≥ 3 directions would be arbitrary).",
        "- With n_pub = 3 the randomized range finder sketches min(k + 5, n_pub) = 3 "
        "directions, i.e. the whole row space: it is exact here and cannot be cheaper "
        "than the thin SVD of a 3 × d matrix; it pays off only with many public "
        "clients.",
        "- PFA+ server: the private mean is rebuilt from k coordinates per tensor, so "
        "the 27 private updates are never stacked; the time is dominated by the public "
        "mean and by fitting the next subspace.",
        "- Private uplink floats: what one private PFA+ client sends after the warm-up "
        "round (`uplink_floats`, nominal k, min(k, d) per tensor), against the full "
        "update.",
        f"- Wall time of all measurements: {time.perf_counter() - wall_start:.1f} s.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
