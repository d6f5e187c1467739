"""Cost versus the number of clients N, with a fixed share sampled per round.

GDPFed's Fashion-MNIST regime: N clients with 10 examples each, the 2-layer CNN (``cnn2``),
DP-SGD with batch 10; the same number of clients sampled per round at every N (GDPFed samples
2%: 120 of 6,000), so that what grows with N is only what the framework does per client. For each N this starts ``privet run`` in a fresh
process (the in-process backend, or Flower's Ray simulation with ``--backend simulation``) and
reads back, from the run's ``rounds.jsonl``:

- **handshake**: the budget handshake of round 1 (every client declares its budget once);
- **per round**: the mean wall time of rounds 2..R (sampling, training the sampled clients,
  validation, aggregation, evaluation on the 10,000 test images);
- **peak memory**: the run's maximum resident set size (``/usr/bin/time``-style, from
  ``resource.getrusage`` of the child).

Sizes run one after another; the machine's load is reported with the results, because a
2-core machine shared with other jobs moves every figure. Ratios to the smallest N are taken
within this one run.

Usage::

    python benchmarks/bench_scale.py --sizes 100 1000 6000 --sampled 20 --rounds 3 --out benchmarks/results/scale.md
    python benchmarks/bench_scale.py --plot benchmarks/results/scale.json benchmarks/results/scale_simulation.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRIVET = Path(sys.executable).parent / "privet"


def run_once(n: int, rounds: int, backend: str, sampled: int) -> dict[str, float]:
    """One ``privet run`` at N = n with ``sampled`` clients per round; timings from rounds.jsonl."""
    out = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
    sets = {"num-clients": n, "fraction-train": sampled / n, "num-server-rounds": rounds, "model": "cnn2",
            "max-examples-per-client": 10, "batch-size": 10, "min-train-clients": sampled}
    cmd = [str(PRIVET), "run", "--backend", backend, "--out", str(out / "r")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"N={n}: privet run failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "r" / "rounds.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["round"] >= 1]
    elapsed = [r["elapsed_seconds"] for r in rows]
    per_round = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "n": n,
        "sampled": len(rows[-1]["sampled"]),
        "wall_s": wall,
        "handshake_s": rows[0].get("handshake_seconds", float("nan")),
        "round1_s": elapsed[0],
        "per_round_s": sum(per_round) / len(per_round) if per_round else float("nan"),
        "peak_rss_mb": max(peak, before) / 1024,  # ru_maxrss is in KiB on Linux (max over children so far)
        "row_bytes": len(json.dumps(rows[-1])),
    }


def render(results: list[dict[str, float]], args: argparse.Namespace) -> str:
    base = results[0]
    lines = [
        "# Cost versus the number of clients",
        "",
        f"`python benchmarks/bench_scale.py --sizes {' '.join(map(str, args.sizes))} --rounds {args.rounds} "
        f"--sampled {args.sampled} --backend {args.backend}` on {datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the end. Model `cnn2`, 10 examples per "
        f"client, {args.sampled} clients sampled per round at every N, DP-SGD batch 10, backend `{args.backend}`.",
        "",
        "| N | sampled / round | handshake (s) | per round, rounds 2..R (s) | vs smallest N | peak RSS (MB) "
        "| round row (bytes) | whole run (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['n']:,} | {r['sampled']} | {r['handshake_s']:.1f} | {r['per_round_s']:.2f} | "
            f"{r['per_round_s'] / base['per_round_s']:.2f}x | {r['peak_rss_mb']:.0f} | {r['row_bytes']:,} | "
            f"{r['wall_s']:.0f} |"
        )
    lines += ["", "Peak RSS is the maximum over the child processes started so far (a running maximum); in "
              "Ray simulation that is the `privet run` / `flwr run` side only (Ray's workers are not its children)."]
    return "\n".join(lines) + "\n"


def plot(result_files: list[Path], png: Path) -> None:
    """Handshake and per-round time against N, one line per results file (backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for path in result_files:
        data = json.loads(path.read_text())
        ns = [r["n"] for r in data["results"]]
        label = {"inprocess": "in-process", "simulation": "Ray simulation"}[data["backend"]]
        axes[0].plot(ns, [r["per_round_s"] for r in data["results"]], marker="o", label=label)
        axes[1].plot(ns, [r["handshake_s"] for r in data["results"]], marker="o", label=label)
    for ax, title in zip(axes, ("per round (s), 120 clients sampled", "handshake, once (s)"), strict=True):
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(ns, [f"{n:,}" for n in ns])
        ax.set_xlabel("N clients")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 6000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sampled", type=int, default=20, help="clients per round, the same at every N")
    p.add_argument("--backend", choices=("inprocess", "simulation"), default="inprocess")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale.md",
                   help="the markdown table; the numbers also go beside it as JSON (same name, .json)")
    p.add_argument("--plot", type=Path, nargs="+", metavar="JSON",
                   help="only draw these results files (one line per backend) into benchmarks/results/scale.png")
    args = p.parse_args(argv)
    if args.plot:
        plot(args.plot, ROOT / "benchmarks" / "results" / "scale.png")
        return 0
    results = []
    for n in args.sizes:
        results.append(run_once(n, args.rounds, args.backend, args.sampled))
        print(json.dumps(results[-1]), flush=True)
    args.out.write_text(render(results, args))
    args.out.with_suffix(".json").write_text(json.dumps({"backend": args.backend, "sampled": args.sampled,
                                                         "rounds": args.rounds, "results": results}, indent=1))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
