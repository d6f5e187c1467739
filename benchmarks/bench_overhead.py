"""Framework overhead: privet's per-round wall and CPU time against bare PyTorch + Opacus FedAvg loops.

The same workload four ways, each in a fresh process, interleaved over ``--reps``:

- **bare**: this file's :func:`bare_loop`, nothing but PyTorch and Opacus: for every client,
  copy the global model, ``PrivacyEngine.make_private`` (Poisson sampling, noise multiplier σ,
  clip C, the per-sample-gradient mode ``auto`` picks) and one local epoch; average the weights;
  evaluate on the test split. No budgets, no ledger, no messages, no validation. One process,
  clients one after another: the baseline of the in-process backend;
- **bare-2**: the same with the clients spread over 2 worker processes (one thread each), the
  baseline of Ray simulation, which runs 2 ClientApps at once on this machine's 2 cores
  (``client-resources-num-cpus = 1``);
- **inprocess**: ``privet run --backend inprocess`` (the real ServerApp logic and ClientApp,
  in one process);
- **simulation**: ``privet run`` (Flower's Ray simulation engine, a SuperLink and Ray actors).

Clients hold the same shards in all four (privet's partitioner), σ is fixed (no calibration)
and every client is sampled in every round, so all do the same arithmetic. Each run's process
tree is watched from outside (``benchmarks/proc_tree.py``): a round ends when its line appears
in the run's ``rounds.jsonl`` (the bare loops write one too), and the tree's CPU seconds are read
at that moment, Ray's raylet and workers included. Reported per backend, median [min-max] over
repetitions: round 1 (start-up: privet's budget handshake, the first imports), then per round over
rounds 2..R the wall seconds and the CPU seconds of the whole tree, and the ratios to the bare loop
of the same parallelism (in-process / bare, simulation / bare-2) taken within each repetition.

Usage::

    python benchmarks/bench_overhead.py --reps 3 --out benchmarks/results/overhead.md
    python benchmarks/bench_overhead.py --render benchmarks/results/overhead.json
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from records import machine, write  # noqa: E402

PRIVET = Path(sys.executable).parent / "privet"

#: the workload: README's "same 3-round workload" of issue 11, more rounds to average over
WORKLOAD: dict[str, Any] = {"num-clients": 10, "max-examples-per-client": 1000, "model": "cnn", "batch-size": 64,
                            "local-epochs": 1, "learning-rate": 0.05, "momentum": 0.9, "noise-multiplier": 1.0,
                            "clip": 1.0, "fraction-train": 1.0, "min-train-clients": 10, "seed": 7}

#: which bare loop each privet backend is compared with (the same number of clients training at once)
BASELINE = {"bare": "bare", "bare-2": "bare-2", "inprocess": "bare", "simulation": "bare-2"}
BACKENDS = ("bare", "bare-2", "inprocess", "simulation")

_WORKER: dict[str, Any] = {}


def _load() -> tuple[Any, list[Any], Any, str]:
    """The test split, the clients' shards, the initial model and the DP mode, as privet builds them."""
    import torch

    from tasks.datasets import load_dataset
    from tasks.model_names import resolve_grad_sample_mode
    from tasks.models import build_model
    from tasks.partition import client_data

    torch.set_num_threads(1)
    w = WORKLOAD
    splits = load_dataset("fashion-mnist")
    shards = [client_data(splits, i, int(w["num-clients"]), seed=int(w["seed"]),
                          max_examples=int(w["max-examples-per-client"])) for i in range(int(w["num-clients"]))]
    model = build_model(str(w["model"]), input_shape=tuple(splits.train.x.shape[1:]), num_classes=10,
                        seed=int(w["seed"]))
    return splits, shards, model, resolve_grad_sample_mode("auto", str(w["model"]))


def _client_update(model: Any, shard: Any, mode: str) -> dict[str, Any]:
    """One client's local epoch of DP-SGD with Opacus (bk: privet's stepper); its new state dict."""
    import copy

    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    w = WORKLOAD
    local = copy.deepcopy(model)
    loader = DataLoader(TensorDataset(torch.from_numpy(shard.x), torch.from_numpy(shard.y)),
                        batch_size=int(w["batch-size"]))
    optimizer = torch.optim.SGD(local.parameters(), lr=float(w["learning-rate"]), momentum=float(w["momentum"]))
    if mode in ("bk", "linear"):  # not an Opacus mode: privet's own stepper, Opacus' Poisson loader
        from opacus.data_loader import DPDataLoader

        from client.bk_dpsgd import BookKeepingDPSGD
        from privacy.randomness import noise_source

        stepper = BookKeepingDPSGD(local, clip=float(w["clip"]), noise_multiplier=float(w["noise-multiplier"]),
                                   expected_batch_size=int(w["batch-size"]), noise=noise_source("os"))
        for x, y in DPDataLoader.from_data_loader(loader):
            optimizer.zero_grad()
            if len(y) == 0:
                stepper.empty_gradients()
            else:
                stepper.batch_gradients(x, y)
            optimizer.step()
    else:
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
            dp_criterion(dp_model(x), y).backward()
            dp_optimizer.step()
        dp_model.to_standard_module()
    return {k: v.detach().clone() for k, v in local.state_dict().items()}


def _worker_init() -> None:
    _WORKER["splits"], _WORKER["shards"], _, _WORKER["mode"] = _load()


def _worker_update(job: tuple[Any, int]) -> dict[str, Any]:
    model, i = job
    return _client_update(model, _WORKER["shards"][i], _WORKER["mode"])


def bare_loop(rounds: int, workers: int, marks: Path) -> None:
    """The workload in plain PyTorch + Opacus; appends a line to ``marks`` after set-up and each round."""
    import multiprocessing

    import torch

    from tasks.models import evaluate

    splits, shards, model, mode = _load()
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_worker_init) if workers > 1 else None
    if pool is not None:
        pool.map(time.sleep, [0.0] * workers)  # the workers are up before round 1, as Ray's actors are
    evaluate(model, splits.test)

    def mark(r: int) -> None:
        with marks.open("a") as f:
            f.write(json.dumps({"round": r}) + "\n")

    mark(0)
    for r in range(1, rounds + 1):
        if pool is None:
            states = [_client_update(model, shard, mode) for shard in shards]
        else:
            states = pool.map(_worker_update, [(model, i) for i in range(len(shards))], chunksize=1)
        model.load_state_dict({k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]})
        evaluate(model, splits.test)
        mark(r)
    if pool is not None:
        pool.close()
        pool.join()


def run_once(backend: str, rounds: int) -> dict[str, Any]:
    """One fresh run of ``backend``, its process tree watched; per-round wall and CPU seconds."""
    from proc_tree import TreeWatch

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-overhead-{backend}-"))
    if backend.startswith("bare"):
        marks = tmp / "rounds.jsonl"
        workers = 2 if backend == "bare-2" else 1
        cmd = [sys.executable, __file__, "--bare", str(rounds), "--workers", str(workers), "--marks", str(marks)]
    else:
        marks = tmp / "r" / "rounds.jsonl"
        sets = {**WORKLOAD, "num-server-rounds": rounds, "budget-distribution": "constant", "epsilon": 1e6}
        cmd = [str(PRIVET), "run", "--backend", backend, "--out", str(tmp / "r")]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
    log = (tmp / "log").open("w")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    with TreeWatch(proc.pid, marks) as watch:
        code = proc.wait()
    wall = time.perf_counter() - started
    log.close()
    if code != 0 or len(watch.mark_times) < rounds + 1:
        raise RuntimeError(f"{backend} failed (exit {code}, {len(watch.mark_times)} marks)\n"
                           f"{(tmp / 'log').read_text()[-3000:]}")
    t, cpu = watch.mark_times, watch.mark_cpu  # index 0: set-up done / initial evaluation; k: round k ended
    return {"backend": backend, "round1_wall_s": t[1] - t[0], "round1_cpu_s": cpu[1] - cpu[0],
            "per_round_wall_s": (t[rounds] - t[1]) / (rounds - 1),
            "per_round_cpu_s": (cpu[rounds] - cpu[1]) / (rounds - 1), "whole_run_s": wall}


def _cell(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def render(record: dict[str, Any]) -> str:
    """The markdown table of a record."""
    reps = record["reps"]
    backends = [b for b in BACKENDS if any(r["backend"] == b for rep in reps for r in rep)]
    by = {b: [next(r for r in rep if r["backend"] == b) for rep in reps] for b in backends}
    w = record["workload"]
    lines = [
        "# Framework overhead: privet vs bare PyTorch + Opacus loops", "",
        f"`benchmarks/bench_overhead.py --rounds {record['rounds']} --reps {len(reps)}`, {record['date']}, "
        f"{record['cpus']} cores, load average {record['load_start']:.2f} at the start, {record['load_end']:.2f} at "
        f"the end. Workload: {w['num-clients']} clients × {w['max-examples-per-client']} Fashion-MNIST examples, "
        f"`{w['model']}` (grad-sample-mode `{record['mode']}`), batch {w['batch-size']}, 1 local epoch of DP-SGD at "
        f"σ = {w['noise-multiplier']}, every client in every round, {record['rounds']} rounds, {len(reps)} "
        "interleaved repetitions. Median [min-max] over repetitions; ratios within each repetition, against the "
        "bare loop training as many clients at once (bare: 1, bare-2 and Ray simulation: 2). CPU s: the whole "
        "process tree's user + system seconds (Ray's raylet, GCS and workers included).", "",
        "| backend | compared with | round 1 (start-up) wall s | per round wall s | per round CPU s "
        "| wall / bare | CPU / bare |",
        "|---|---|---:|---:|---:|---:|---:|"]
    for b in backends:
        base = BASELINE[b]
        if base in by:
            wall = _cell([r["per_round_wall_s"] / x["per_round_wall_s"] for r, x in zip(by[b], by[base], strict=True)])
            cpu = _cell([r["per_round_cpu_s"] / x["per_round_cpu_s"] for r, x in zip(by[b], by[base], strict=True)])
        else:
            wall = cpu = "n/a"
        lines.append(f"| {b} | {base} | {_cell([r['round1_wall_s'] for r in by[b]])} | "
                     f"{_cell([r['per_round_wall_s'] for r in by[b]])} | {_cell([r['per_round_cpu_s'] for r in by[b]])}"
                     f" | {wall} | {cpu} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    """Run the backends interleaved; write the record (.json) and its table (.md)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "overhead.md")
    parser.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the table from this record")
    parser.add_argument("--bare", type=int, default=0, help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--marks", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_loop(args.bare, args.workers, args.marks)
        return 0
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text())))
        return 0
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 is start-up)")
    from tasks.model_names import resolve_grad_sample_mode

    load = os.getloadavg()[0]
    reps = []
    for rep in range(args.reps):
        results = []
        for backend in args.backends:
            result = run_once(backend, args.rounds)
            results.append(result)
            print(f"rep {rep + 1} {backend}: round 1 {result['round1_wall_s']:.2f} s, then "
                  f"{result['per_round_wall_s']:.2f} s and {result['per_round_cpu_s']:.2f} CPU s a round", flush=True)
        reps.append(results)
    record = {**machine(load), "rounds": args.rounds, "workload": WORKLOAD,
              "mode": resolve_grad_sample_mode("auto", str(WORKLOAD["model"])), "reps": reps}
    write(args.out, record, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
