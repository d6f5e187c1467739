"""GDPFed's server-side cost, as ratios measured in one run (same process, same inputs).

1. **Server step** of GDPFed+ (per-group sums of the uploads, magnitude top-k of each noisy
   sum, ω_m reweighting: ``GDPFedStrategy.aggregate_models``) against FedAvg's aggregation
   (``weighted_mean`` of the same uploads), at the paper's FMNIST scale: r = (14, 38, 68)
   uploads of the 2-layer CNN (26,010 parameters). Also GDPFed without top-k.
2. **Optimal-q solve** (Problem 1, scipy SLSQP; once per run) against the FedAvg aggregation
   (once per round).

Usage: ``python benchmarks/bench_gdpfed.py [--repeats 7]``; writes benchmarks/results/gdpfed.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privacy.group_calibration import paper_delta  # noqa: E402
from strategies.base import AcceptedReply  # noqa: E402
from strategies.gdpfed import GDPFED_STRATEGIES, GDPFedConfig, plan_groups  # noqa: E402
from strategies.gdpfed_math import optimal_sampling  # noqa: E402
from strategies.layers import weighted_mean  # noqa: E402
from tasks.models import build_model, get_weights  # noqa: E402


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=0)
    glob = [w.astype(np.float32) for w in get_weights(model)]
    counts = (14, 38, 68)
    budgets = [(e, 6000 ** -1.1) for e in (0.5, 1.5, 3.0) for _ in range(2000)]
    replies, group_of = [], {}
    node = 0
    for m, r in enumerate(counts):
        for _ in range(r):
            arrays = [g + rng.normal(scale=0.01, size=g.shape).astype(np.float32) for g in glob]
            replies.append(AcceptedReply(node, str(node), arrays, {"num-examples": 10}, {}))
            group_of[node] = m
            node += 1

    def strategy(name: str):
        params = GDPFedConfig(sample_rates=(0.0069, 0.0189, 0.0342))
        s = GDPFED_STRATEGIES[name](params=params)
        s.plan, _ = plan_groups(s.variant, params, budgets, 50, 1.5)
        s.group_of, s._global = group_of, glob
        return s

    plus, plain = strategy("gdpfed-plus"), strategy("gdpfed-op")
    assert plus.plan.counts == list(counts)
    t_fedavg = _median_seconds(lambda: weighted_mean([r.arrays for r in replies], [10] * len(replies)), args.repeats)
    t_plus = _median_seconds(lambda: plus.aggregate_models(1, replies), args.repeats)
    t_plain = _median_seconds(lambda: plain.aggregate_models(1, replies), args.repeats)
    delta = paper_delta(6000)
    t_solve = _median_seconds(lambda: optimal_sampling([2000] * 3, [0.5, 1.5, 3.0], 0.02, delta, 50), args.repeats)
    d = sum(g.size for g in glob)
    text = "\n".join([
        "# GDPFed server-side cost (benchmarks/bench_gdpfed.py)",
        "",
        f"FMNIST scale: {len(replies)} uploads in groups r = {counts}, d = {d} (2-layer CNN), median of "
        f"{args.repeats} repeats, one process (shared 2-core CPU: ratios, not absolute times).",
        "",
        "| Step | median seconds | ratio |",
        "|---|---|---|",
        f"| FedAvg aggregation (weighted mean of {len(replies)} models) | {t_fedavg:.4f} | 1.00 |",
        f"| GDPFed/-op server step (3 group sums + ω_m) | {t_plain:.4f} | {t_plain / t_fedavg:.2f} × FedAvg |",
        f"| GDPFed+ server step (3 group sums + top-k (0.7,0.8,0.9) + ω_m) | {t_plus:.4f} | "
        f"{t_plus / t_fedavg:.2f} × FedAvg |",
        f"| Problem 1 solve (SLSQP, 3 groups; once per run) | {t_solve:.4f} | {t_solve / t_fedavg:.2f} × FedAvg |",
        "",
    ])
    out = ROOT / "benchmarks" / "results" / "gdpfed.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
