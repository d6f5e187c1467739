"""Framework overhead: privet's per-round time against a bare PyTorch + Opacus FedAvg loop.

The same workload three ways, each in a fresh process, interleaved over ``--reps``:

- **bare**: this file's :func:`bare_loop`, nothing but PyTorch and Opacus: for every client,
  copy the global model, ``PrivacyEngine.make_private`` (Poisson sampling, noise multiplier σ,
  clip C, the same per-sample-gradient mode) and one local epoch; average the weights; evaluate
  on the test split. No budgets, no ledger, no messages, no validation;
- **inprocess**: ``privet run --backend inprocess`` (the real ServerApp logic and ClientApp,
  in one process);
- **simulation**: ``privet run`` (Flower's Ray simulation engine, a SuperLink and Ray actors).

Clients hold the same shards in all three (privet's partitioner), σ is fixed (no calibration)
and every client is sampled in every round, so the three do the same arithmetic. Per-round
time is the mean of rounds 2..R (round 1 holds privet's budget handshake and the first
imports; it is reported apart as start-up), and the ratios to the bare loop are taken within
one run.

Usage::

    python benchmarks/bench_overhead.py --reps 3 --out benchmarks/results/overhead.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PRIVET = Path(sys.executable).parent / "privet"

#: the workload: README's "same 3-round workload" of issue 11, one more round to average over
WORKLOAD: dict[str, Any] = {"num-clients": 10, "max-examples-per-client": 1000, "model": "cnn", "batch-size": 64,
            "local-epochs": 1, "learning-rate": 0.05, "momentum": 0.9, "noise-multiplier": 1.0,
            "clip": 1.0, "fraction-train": 1.0, "min-train-clients": 10, "seed": 7}


def bare_loop(rounds: int) -> list[float]:
    """The workload in plain PyTorch + Opacus; returns the wall time of each round."""
    import copy

    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from tasks.datasets import load_dataset
    from tasks.models import build_model, evaluate, resolve_grad_sample_mode
    from tasks.partition import client_data

    torch.set_num_threads(1)
    w = WORKLOAD
    splits = load_dataset("fashion-mnist")
    shards = [client_data(splits, i, int(w["num-clients"]), seed=int(w["seed"]),
                          max_examples=int(w["max-examples-per-client"])) for i in range(int(w["num-clients"]))]
    model = build_model(str(w["model"]), input_shape=tuple(splits.train.x.shape[1:]), num_classes=10,
                        seed=int(w["seed"]))
    mode = resolve_grad_sample_mode("auto", str(w["model"]))
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        states = []
        for shard in shards:
            local = copy.deepcopy(model)
            loader = DataLoader(TensorDataset(torch.from_numpy(shard.x), torch.from_numpy(shard.y)),
                                batch_size=int(w["batch-size"]))
            optimizer = torch.optim.SGD(local.parameters(), lr=float(w["learning-rate"]),
                                        momentum=float(w["momentum"]))
            criterion = torch.nn.CrossEntropyLoss()
            private = PrivacyEngine(accountant="rdp").make_private(
                module=local, optimizer=optimizer, data_loader=loader, criterion=criterion,
                noise_multiplier=float(w["noise-multiplier"]), max_grad_norm=float(w["clip"]),
                poisson_sampling=True, grad_sample_mode=mode)
            dp_model, dp_optimizer, dp_loader = private[0], private[1], private[-1]
            dp_criterion = private[2] if len(private) == 4 else criterion
            for x, y in dp_loader:
                dp_optimizer.zero_grad()
                if len(y) == 0:
                    continue
                loss = dp_criterion(dp_model(x), y)
                loss.backward()
                dp_optimizer.step()
            dp_model.to_standard_module()
            states.append({k: v.detach().clone() for k, v in local.state_dict().items()})
        model.load_state_dict({k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]})
        evaluate(model, splits.test)
        times.append(time.perf_counter() - started)
    return times


def run_bare(rounds: int) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--bare", str(rounds)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"bare loop failed\n{proc.stderr[-3000:]}")
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"first": times[0], "per_round": statistics.fmean(times[1:]), "wall": time.perf_counter() - started}


def run_privet(rounds: int, backend: str) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix=f"bench-overhead-{backend}-")) / "r"
    sets = {**WORKLOAD, "num-server-rounds": rounds, "budget-distribution": "constant", "epsilon": 1e6}
    cmd = [str(PRIVET), "run", "--backend", backend, "--out", str(out)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"privet run --backend {backend} failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines() if x.strip()]
    elapsed = [r["elapsed_seconds"] for r in rows]  # round 0 is the initial evaluation
    per_round = [b - a for a, b in zip(elapsed[1:], elapsed[2:], strict=False)]
    return {"first": elapsed[1] - elapsed[0], "per_round": statistics.fmean(per_round),
            "wall": time.perf_counter() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["bare", "inprocess", "simulation"],
                        choices=["bare", "inprocess", "simulation"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "overhead.md")
    parser.add_argument("--bare", type=int, default=0, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.bare:
        print(json.dumps(bare_loop(args.bare)))
        return 0
    results: dict[str, list[dict[str, float]]] = {b: [] for b in args.backends}
    load = os.getloadavg()[0]
    for rep in range(args.reps):
        for backend in args.backends:
            result = run_bare(args.rounds) if backend == "bare" else run_privet(args.rounds, backend)
            results[backend].append(result)
            print(f"rep {rep + 1} {backend}: round 1 {result['first']:.2f} s, then {result['per_round']:.2f} s/round",
                  flush=True)
    base = statistics.median(r["per_round"] for r in results["bare"]) if "bare" in results else None
    lines = ["# Framework overhead: privet vs a bare PyTorch + Opacus loop", "",
             f"`benchmarks/bench_overhead.py`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average at start "
             f"{load:.2f} on {os.cpu_count()} cores. Workload: {WORKLOAD['num-clients']} clients × "
             f"{WORKLOAD['max-examples-per-client']} Fashion-MNIST examples, `{WORKLOAD['model']}`, batch "
             f"{WORKLOAD['batch-size']}, 1 local epoch of DP-SGD at σ = {WORKLOAD['noise-multiplier']}, every "
             f"client in every round, {args.rounds} rounds, {args.reps} interleaved repetitions (median).", "",
             "| backend | round 1 (start-up) s | per round s (rounds 2..R) | per round / bare loop |",
             "|---|---:|---:|---:|"]
    for backend, runs in results.items():
        per = statistics.median(r["per_round"] for r in runs)
        first = statistics.median(r["first"] for r in runs)
        ratio = f"{per / base:.2f}" if base else "n/a"
        lines.append(f"| {backend} | {first:.2f} | {per:.2f} | {ratio} |")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
