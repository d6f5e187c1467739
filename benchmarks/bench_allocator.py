"""glibc malloc tuning (client/allocator.py) vs default, DP-SGD step time, interleaved.

Each variant runs in a fresh process (mallopt cannot be undone), alternating
default/tuned ``--repeats`` times; reported: median ms/step per run, and the ratio
tuned/default of the medians with the min-max spread of per-pair ratios.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_allocator.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, resource, statistics, sys, torch
torch.set_num_threads(1)
from client.allocator import tune_malloc
tuned = tune_malloc()
sys.path.insert(0, 'benchmarks')
import bench_dpsgd_step as b
r = b.bench_model(sys.argv[1], (1, 28, 28), 64, int(sys.argv[2]))
print(json.dumps({"tuned": tuned, **r}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["cnn", "mlp2"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "allocator.md"))
    args = ap.parse_args()
    lines = ["# glibc malloc tuning vs default (DP-SGD step, batch 64, 1 thread, interleaved)", "",
             "| model | mode | default ms (runs) | tuned ms (runs) | tuned / default (median, min-max over pairs) |",
             "|---|---|---|---|---|"]
    for model in args.models:
        runs: dict[str, list[dict]] = {"0": [], "1": []}
        for _ in range(args.repeats):
            for flag in ("0", "1"):
                out = subprocess.run([sys.executable, "-c", CHILD, model, str(args.steps)], check=True,
                                     capture_output=True, text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT), "PRIVET_MALLOC_TUNE": flag})
                runs[flag].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for mode in ("plain", "hooks", "ghost"):
            d = [r[mode] * 1e3 for r in runs["0"]]
            t = [r[mode] * 1e3 for r in runs["1"]]
            pairs = [b / a for a, b in zip(d, t, strict=True)]
            lines.append(f"| {model} | {mode} | {statistics.median(d):.2f} ({', '.join(f'{x:.1f}' for x in d)}) | "
                         f"{statistics.median(t):.2f} ({', '.join(f'{x:.1f}' for x in t)}) | "
                         f"{statistics.median(t) / statistics.median(d):.2f} ({min(pairs):.2f}-{max(pairs):.2f}) |")
            print(lines[-1], flush=True)
    lines += ["", "Shared 2-core machine loaded by other jobs; runs alternate default/tuned so load hits both."]
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
