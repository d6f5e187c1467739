"""What a deployed ClientApp message pays to get its shard: dataset vs node-local cache.

In a deployment every message runs the ClientApp in a fresh process. This benchmark starts
fresh Python processes, as the SuperNode does, and times ``client.app._load_local_data``
(the shard a ``train`` or ``evaluate`` message needs) in each:

- **no cache** (``shard-cache=off``): parse the dataset files, import ``flwr_datasets``,
  partition, keep one shard;
- **cache hit**: read ``<shard-cache>/<key>.npz`` written by an earlier message.

The two kinds of process alternate (``--repeats`` of each, after one process that writes
the cache); each figure is the median, and the ratio is taken within this one run. The
import of ``client.app`` itself (Flower, torch) is timed separately: both pay it.

Usage::

    python benchmarks/bench_shard_cache.py --out benchmarks/results/shard_cache.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import client.app as app
from client.profile import resolve_profile
t1 = time.perf_counter()
run_config = json.loads(sys.argv[1])
profile = resolve_profile(json.loads(sys.argv[2]), run_config)
data, _ = app._load_local_data(profile, run_config)
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "shard": t2 - t1, "examples": len(data)}))
"""


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="markdown output file")
    parser.add_argument("--repeats", type=int, default=3, help="processes of each kind")
    parser.add_argument("--num-partitions", type=int, default=10, help="the shard is 1/N of the training set")
    return parser.parse_args()


def one_process(run_config: dict, node_config: dict) -> dict[str, float]:
    """Time one fresh process loading the shard."""
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(run_config), json.dumps(node_config)],
                         cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    args = parse_args()
    run_config = {"dataset": "fashion-mnist", "data-dir": "", "partitioner": "iid", "dirichlet-alpha": 0.5,
                  "shards-per-client": 2, "seed": 0, "max-examples-per-client": 0}
    node = {"partition-id": 0, "num-partitions": args.num_partitions, "epsilon": 1.0}
    with tempfile.TemporaryDirectory(prefix="privet-bench-shards-") as cache:
        cached = {**node, "shard-cache": cache}
        first = one_process(run_config, cached)  # writes the cache
        cold, warm = [], []
        for _ in range(args.repeats):
            cold.append(one_process(run_config, {**node, "shard-cache": "off"}))
            warm.append(one_process(run_config, cached))
    med = {name: {k: statistics.median(r[k] for r in runs) for k in ("import", "shard")}
           for name, runs in (("cold", cold), ("warm", warm))}
    lines = [
        "# Shard loading per deployed ClientApp message",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; Fashion-MNIST IID, shard = 1/"
        f"{args.num_partitions} ({first['examples']} examples); median of {args.repeats} fresh processes each.",
        "",
        "| | get the shard (s) | import client.app (s) |",
        "|---|---:|---:|",
        f"| no cache (`shard-cache=off`) | {med['cold']['shard']:.2f} | {med['cold']['import']:.2f} |",
        f"| cache hit | {med['warm']['shard']:.3f} | {med['warm']['import']:.2f} |",
        f"| first message (writes the cache) | {first['shard']:.2f} | {first['import']:.2f} |",
        "",
        f"Ratio no cache / cache hit for the shard: **{med['cold']['shard'] / med['warm']['shard']:.0f}x**.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
