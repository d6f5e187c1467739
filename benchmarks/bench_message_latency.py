"""Deployment message latency: what a round costs over gRPC beyond the clients' own work.

In a deployment every message a SuperNode receives starts a fresh ClientApp process
(Flower's subprocess isolation), which imports the app, loads its shard and only then
trains. This benchmark runs one small workload twice in one tree: on the in-process grid
(no processes, no gRPC) and on a real local deployment (a SuperLink and two SuperNodes on
loopback, ``flwr run``), and reports per round (rounds 2..R, so that the budget handshake and
the FAB's first install are not in it)

    latency per message ≈ deployment per round − in-process per round,

because the two clients of a round run in parallel on their own SuperNodes and do the same
arithmetic as in-process. With ``--trees`` it does so for several checkouts (e.g. a baseline
commit in a git worktree), interleaved, so the reduction is measured in one run::

    git worktree add /tmp/base 532afa6 && ln -s $PWD/.venv /tmp/base/.venv
    python benchmarks/bench_message_latency.py --trees . /tmp/base --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

WORKLOAD: dict[str, Any] = {"num-clients": 2, "num-server-rounds": 4, "model": "logreg", "max-examples-per-client": 500,
                            "batch-size": 64, "min-train-clients": 2, "fraction-train": 1.0, "seed": 3,
                            "noise-multiplier": 1.0, "budget-distribution": "constant", "epsilon": 1e6,
                            "noise-source": "os"}


def per_round(rounds_jsonl: Path) -> float:
    """Mean wall time of rounds 2..R from a results directory's ``rounds.jsonl``."""
    rows = [json.loads(x) for x in rounds_jsonl.read_text().splitlines() if x.strip()]
    elapsed = [r["elapsed_seconds"] for r in rows]  # rows[0]: the initial evaluation
    return statistics.fmean(b - a for a, b in zip(elapsed[2:], elapsed[3:], strict=False))


def child(tree: Path, backend: str) -> float:
    """Run the workload in ``tree`` (this process imports that tree's code); per-round seconds."""
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    out = Path(tempfile.mkdtemp(prefix=f"bench-latency-{backend}-"))
    cfg = {**WORKLOAD, "out-dir": str(out / "results")}
    if backend == "inprocess":
        from client.app import app as client_app
        from privet.cli import app_defaults
        from privet.inprocess import InProcessGrid, simulation_node_configs
        from server.app import run_experiment

        full = {**app_defaults(), **cfg}
        run_experiment(InProcessGrid(client_app, simulation_node_configs(2), full), full, run_id=1)
    else:
        from tests.flower_processes import LocalDeployment

        deployment = LocalDeployment(out / "deploy")
        try:
            deployment.start_superlink()
            for i in range(2):
                deployment.start_supernode(f"node{i}", {"partition-id": i, "num-partitions": 2, "epsilon": 1e6,
                                                        "noise-source": "os",
                                                        "ledger-path": str(out / f"ledger-{i}.json")})
            status = deployment.run_app(cfg, timeout=900)
            if status["status"] != "finished:completed":
                raise RuntimeError(f"deployment run failed: {status}\n{deployment.logs()}")
        finally:
            deployment.stop_all()
    return per_round(out / "results" / "rounds.jsonl")


def measure(tree: Path, backend: str) -> float:
    proc = subprocess.run([sys.executable, __file__, "--child", str(tree), backend], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0"})
    if proc.returncode != 0:
        raise RuntimeError(f"{tree} {backend} failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "message_latency.md")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(child(Path(args.child[0]).resolve(), args.child[1]))
        return 0
    trees = [t.resolve() for t in args.trees]
    results: dict[tuple[Path, str], list[float]] = {}
    load = os.getloadavg()[0]
    for rep in range(args.reps):
        for tree in trees:
            for backend in ("inprocess", "deployment"):
                seconds = measure(tree, backend)
                results.setdefault((tree, backend), []).append(seconds)
                print(f"rep {rep + 1} {tree} {backend}: {seconds:.2f} s/round", flush=True)
    lines = ["# Deployment message latency", "",
             f"`benchmarks/bench_message_latency.py`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average at start "
             f"{load:.2f} on {os.cpu_count()} cores. Workload: 2 clients × {WORKLOAD['max-examples-per-client']} "
             f"examples, `{WORKLOAD['model']}`, one DP-SGD epoch per round, {WORKLOAD['num-server-rounds']} rounds "
             f"(rounds 2..R timed), {args.reps} interleaved repetitions (median).", "",
             "| tree | commit | in-process s/round | deployment s/round | latency per message (difference) |",
             "|---|---|---:|---:|---:|"]
    for tree in trees:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        inproc = statistics.median(results[(tree, "inprocess")])
        deploy = statistics.median(results[(tree, "deployment")])
        lines.append(f"| `{tree}` | {commit} | {inproc:.2f} | {deploy:.2f} | {deploy - inproc:.2f} s |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
