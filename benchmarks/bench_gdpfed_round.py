"""A GDPFed-regime round in privet against the bare compute of the same clients, interleaved.

The regime (GDPFed's Fashion-MNIST setting, :data:`REGIME`): N clients × 10 examples (IID), q = 2 %
(120 of 6,000 sampled per round), every sampled client trains τ = 5 local steps of batch 10
(5 epochs of its 10 examples, lr 0.1) on the small CNN ``cnn``, then clips its update to
C = 1.5 and adds its share of the group's Gaussian noise (``strategy = "gdpfed"``, budgets in
three groups). Each repetition runs, one after the other, in fresh processes:

- **privet**: ``privet run --backend inprocess`` of R rounds (the real ServerApp logic and
  ClientApp: handshake, sampling, the group plan, every client's ledger, messages, validation,
  aggregation, evaluation on the 10,000 test images). Its process tree is watched from outside
  (``benchmarks/proc_tree.py``): per round over rounds 2..R, the wall seconds and the tree's CPU
  seconds, read when each round's line appears in ``rounds.jsonl``;
- **bare**: this file's :func:`bare_rounds` in a fresh process, the *same clients* (the ids each
  privet round sampled, read from its ``rounds.jsonl``) with the same shards, the same model
  and the same DP step code, in one loop and nothing else: load the global weights into one
  model (the same initial weights in every round: the arithmetic does not depend on them),
  :func:`client.training.local_sgd` (privet's τ SGD steps), then clip + noise with
  :func:`privacy.mechanisms.gaussian.privatize_update` from a fresh ``csprng`` source, as
  :class:`privacy.mechanisms.update.WholeUpdate` does; sum the uploads. Its CPU seconds are the
  process's own (``time.process_time``: every thread). Evaluating the new model on the test
  split is timed apart (privet's round does it too: the table shows both ratios).

Reported, median [min-max] over repetitions: per round, privet's wall and CPU seconds, the bare
loop's, and the ratios privet / bare taken within each repetition (CPU: the tree's against the
bare process's), and the framework's CPU per sampled client beyond the bare work. With
``--profile`` one more in-process run of ``--profile-rounds`` rounds runs under cProfile in this
process and the record gets where each sampled client's time goes (:data:`PROFILE_ROWS`).

Usage::

    python benchmarks/bench_gdpfed_round.py --clients 6000 --rounds 4 --reps 3 --profile \
        --out benchmarks/results/gdpfed_round.md
    python benchmarks/bench_gdpfed_round.py --render benchmarks/results/gdpfed_round.json
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


def regime(clients: int, rounds: int, model: str = "cnn") -> dict[str, Any]:
    """GDPFed's FMNIST run config (experiments/gdpfed/reproduce.py's, model ``cnn``) at ``clients`` × ``rounds``."""
    return {"strategy": "gdpfed", "num-clients": clients, "num-server-rounds": rounds, "seed": 1,
            "dataset": "fashion-mnist", "partitioner": "iid", "model": model, "max-examples-per-client": 0,
            "local-epochs": 5, "batch-size": 10, "learning-rate": 0.1, "momentum": 0.0, "clip": 1.5,
            "budget-distribution": "groups", "delta": float(f"{clients ** -1.1:.6g}"), "min-train-clients": 1,
            "gdpfed.q": 0.02}


def privet_command(config: dict[str, Any], out: Path, backend: str = "inprocess") -> list[str]:
    """``privet run`` with ``config`` as ``--set`` options."""
    cmd = [str(PRIVET), "run", "--backend", backend, "--out", str(out)]
    for key, value in config.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def run_privet(config: dict[str, Any], work: Path) -> dict[str, Any]:
    """One in-process privet run, its tree watched: per-round wall and CPU over rounds 2..R, who was sampled."""
    from proc_tree import TreeWatch

    out = work / "privet"
    log = (work / "privet.log").open("w")
    proc = subprocess.Popen(privet_command(config, out), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    with TreeWatch(proc.pid, out / "rounds.jsonl", interval=0.05) as watch:
        proc.wait()
    log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"privet run failed\n{(work / 'privet.log').read_text()[-3000:]}")
    rows = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines() if x.strip()]
    rounds = int(config["num-server-rounds"])
    cpu, wall = watch.mark_cpu, watch.mark_times  # index 0: the initial evaluation's line; k: round k's
    return {"round_wall_s": [wall[k] - wall[k - 1] for k in range(2, rounds + 1)],
            "round_cpu_s": [cpu[k] - cpu[k - 1] for k in range(2, rounds + 1)],
            "sampled": [[int(c) for c in r["sampled"]] for r in rows if r["round"] >= 2],
            "handshake_s": next(r.get("handshake_seconds", float("nan")) for r in rows if r["round"] == 1)}


def bare_rounds(config: dict[str, Any], sampled: list[list[int]]) -> dict[str, list[float]]:
    """The bare compute of the given rounds' clients (module docstring), in this process.

    Returns per round the wall and CPU seconds of the clients' DP work (and the sum), and of
    one evaluation on the test split.
    """
    import numpy as np
    import torch

    from client.model_task import partitioning
    from client.seeds import client_seed
    from client.training import LocalTrainingConfig, local_sgd
    from privacy.mechanisms.gaussian import privatize_update
    from privacy.randomness import noise_source
    from protocol.run_settings import RunSettings
    from tasks.datasets import load_dataset
    from tasks.models import build_model, evaluate, get_weights, set_weights
    from tasks.partition import client_data
    from tasks.validation_split import evaluation_set

    torch.set_num_threads(1)
    settings = RunSettings.of(config)
    splits = load_dataset(settings.dataset)
    clients = int(config["num-clients"])
    shards = {c: client_data(splits, c, clients, **partitioning(settings)) for r in sampled for c in r}
    test = evaluation_set(splits, settings.evaluation_split)
    model = build_model(settings.model, input_shape=tuple(splits.train.x.shape[1:]),
                        num_classes=splits.train.num_classes, seed=settings.seed)
    global_weights = get_weights(model)
    sigma, clip = 1.0, float(config["clip"])  # σ does not change the cost
    out: dict[str, list[float]] = {"wall_s": [], "cpu_s": [], "eval_wall_s": [], "eval_cpu_s": []}
    for server_round, ids in enumerate(sampled, start=2):
        wall, cpu = time.perf_counter(), time.process_time()
        total = [np.zeros_like(w) for w in global_weights]
        for c in ids:
            set_weights(model, global_weights)
            seed = client_seed(settings.seed, c, server_round)
            local_sgd(model, shards[c], LocalTrainingConfig(epochs=int(config["local-epochs"]),
                                                            batch_size=int(config["batch-size"]),
                                                            learning_rate=float(config["learning-rate"]),
                                                            momentum=float(config["momentum"]), seed=seed))
            update = [t - r for t, r in zip(get_weights(model), global_weights, strict=True)]
            noisy, _ = privatize_update(update, clip=clip, noise_multiplier=sigma, noise_shares=len(ids),
                                        rng=noise_source("csprng"))
            total = [s + u for s, u in zip(total, noisy, strict=True)]
        mean = [s / len(ids) for s in total]  # every round starts from the same model: the cost is the same
        out["wall_s"].append(time.perf_counter() - wall)
        out["cpu_s"].append(time.process_time() - cpu)
        wall, cpu = time.perf_counter(), time.process_time()
        set_weights(model, [g + m for g, m in zip(global_weights, mean, strict=True)])
        evaluate(model, test)
        out["eval_wall_s"].append(time.perf_counter() - wall)
        out["eval_cpu_s"].append(time.process_time() - cpu)
    return out


def run_bare(config: dict[str, Any], sampled: list[list[int]], work: Path) -> dict[str, list[float]]:
    """:func:`bare_rounds` in a fresh process (``--bare``), as privet's run is one."""
    spec = work / "bare.json"
    spec.write_text(json.dumps({"config": config, "sampled": sampled}))
    done = subprocess.run([sys.executable, __file__, "--bare", str(spec)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bare loop failed\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


#: the profile's rows: (what, the function whose cumulative time it is); the client's rows below the first are
#: disjoint parts of it, the server's are per round, divided by the clients it sampled
PROFILE_ROWS: list[tuple[str, str]] = [
    ("client round, all (`client/round.py:_round`)", "client/round.py:_round"),
    ("local SGD, τ steps (`local_sgd`)", "client/training.py:local_sgd"),
    ("clip + noise (`privatize_update`)", "privacy/mechanisms/gaussian.py:privatize_update"),
    ("model built and loaded (`model_from`, before)", "client/model_task.py:model_from"),
    ("model reused and loaded (`round_model`, after)", "client/model_task.py:round_model"),
    ("received arrays decoded (Flower's `to_numpy_ndarrays`)", "flwr/app/message/arrayrecord.py:to_numpy_ndarrays"),
    ("weights copied out (`get_weights`, in the work and the task)", "tasks/models.py:get_weights"),
    ("shard (`ModelTask.__init__`: settings, partition)", "client/model_task.py:__init__"),
    ("ledger load (`load_ledger`)", "client/ledger_store.py:load_ledger"),
    ("ledger store (`store_ledger`: state and file)", "client/ledger_store.py:store_ledger"),
    ("plan (`Mechanism.plan`)", "privacy/mechanisms/group_share.py:plan"),
    ("reply built (`_Reply.message`, with its log line)", "client/round.py:message"),
    ("upload encoded (`ModelTask.encode`)", "client/model_task.py:encode"),
    ("noise source (`noise_for`)", "client/seeds.py:noise_for"),
    ("torch seeding (`torch.manual_seed`)", "torch/random.py:manual_seed"),
    ("server: a reply read and validated (`ReplyBook._read`)", "strategies/reply_book.py:_read"),
    ("server: the test-set evaluations (`evaluate_fn`, rounds 0..R), per sampled client", "server/app.py:evaluate_fn"),
    ("server: the rounds configured (`configure_train`, with the handshake), per sampled client",
     "strategies/base.py:configure_train"),
    ("server: of which the budget handshake of all N clients, once per run", "strategies/clients.py:handshake"),
]


def profile_run(config: dict[str, Any], prof: Path) -> dict[str, Any]:
    """Rounds of ``config`` in this process under cProfile: per sampled client, ms in each :data:`PROFILE_ROWS`."""
    import cProfile
    import pstats

    import torch

    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {**config, "out-dir": tmp}
        from privet.cli import app_defaults

        full = {**app_defaults(), **cfg}
        grid = InProcessGrid(client_app, simulation_node_configs(int(cfg["num-clients"])), full, run_id=1)
        profiler = cProfile.Profile(time.process_time)  # CPU: on a shared machine wall time is mostly waiting
        profiler.enable()
        run_experiment(grid, full, run_id=1)
        profiler.disable()
    profiler.dump_stats(prof)
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    rounds = int(config["num-server-rounds"])
    calls = 0
    found: dict[str, float] = {}
    for (file, _, name), (_, ncalls, _, cumulative, _) in stats.items():
        where = f"{file}:{name}"
        for _, key in PROFILE_ROWS:
            path, func = key.rsplit(":", 1)
            if where.endswith(f"{path}:{func}") or (func == name and file.endswith(path)):
                found[key] = found.get(key, 0.0) + cumulative
                if key == "client/round.py:_round":
                    calls += ncalls
    return {"rounds": rounds, "clients": int(config["num-clients"]), "client_rounds": calls, "timer": "CPU",
            "max_examples": int(config["max-examples-per-client"]),
            "ms_per_client": {key: 1e3 * found.get(key, 0.0) / max(calls, 1) for _, key in PROFILE_ROWS}}


def _cell(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def summarise(rep: dict[str, Any]) -> dict[str, float]:
    """One repetition's per-round figures: medians over its rounds 2..R."""
    privet, bare = rep["privet"], rep["bare"]
    sampled = statistics.mean(len(s) for s in privet["sampled"])
    p_cpu, b_cpu = statistics.median(privet["round_cpu_s"]), statistics.median(bare["cpu_s"])
    e_cpu = statistics.median(bare["eval_cpu_s"])
    return {"sampled": sampled, "privet_wall_s": statistics.median(privet["round_wall_s"]), "privet_cpu_s": p_cpu,
            "bare_wall_s": statistics.median(bare["wall_s"]), "bare_cpu_s": b_cpu, "eval_cpu_s": e_cpu,
            "ratio_cpu": p_cpu / b_cpu, "ratio_cpu_eval": p_cpu / (b_cpu + e_cpu),
            "ratio_wall": statistics.median(privet["round_wall_s"]) / statistics.median(bare["wall_s"]),
            "overhead_ms_per_client": 1e3 * (p_cpu - b_cpu - e_cpu) / sampled,
            "bare_ms_per_client": 1e3 * b_cpu / sampled, "handshake_s": privet["handshake_s"]}


def _profile_flags(record: dict[str, Any]) -> str:
    prof = record.get("profile")
    if not prof:
        return ""
    clients = prof.get("clients", record["config"]["num-clients"])
    return (" --profile" + (f" --profile-clients {clients}" if clients != record["config"]["num-clients"] else "")
            + (f" --profile-rounds {prof['rounds']}" if prof["rounds"] != 2 else ""))


def render(record: dict[str, Any]) -> str:
    """The markdown tables of a record."""
    reps = [summarise(r) for r in record["reps"]]
    cfg = record["config"]
    lines = [
        "# A GDPFed-regime round against its bare compute",
        "",
        f"`python benchmarks/bench_gdpfed_round.py --clients {cfg['num-clients']} --rounds {cfg['num-server-rounds']}"
        f" --reps {len(reps)}{_profile_flags(record)}` on {record['date']}"
        f"{', commit ' + record['commit'] if record.get('commit') else ''}, {record['cpus']} CPUs, load average "
        f"{record['load_start']:.1f} at the start and {record['load_end']:.1f} at the end. GDPFed's FMNIST regime: "
        f"N = {cfg['num-clients']:,} clients × 10 examples, q = {cfg['gdpfed.q']} "
        f"({statistics.median(r['sampled'] for r in reps):.0f} sampled per round), τ = 5 steps of batch "
        f"{cfg['batch-size']}, model `{cfg['model']}`, C = {cfg['clip']}; privet in-process against the bare loop "
        f"of the same clients, alternating, fresh processes; per round over rounds 2..{cfg['num-server-rounds']}, "
        f"median [min-max] over {len(reps)} repetitions, ratios within each.",
        "",
        "| per round | privet in-process | bare: the clients' DP work | privet / bare |",
        "|---|---|---|---|",
        f"| CPU seconds (privet: the whole process tree) | {_cell([r['privet_cpu_s'] for r in reps], '.2f')} | "
        f"{_cell([r['bare_cpu_s'] for r in reps], '.2f')} | {_cell([r['ratio_cpu'] for r in reps], '.2f')}x |",
        f"| CPU seconds, bare + one test-set evaluation | | "
        f"{_cell([r['bare_cpu_s'] + r['eval_cpu_s'] for r in reps], '.2f')} | "
        f"{_cell([r['ratio_cpu_eval'] for r in reps], '.2f')}x |",
        f"| wall seconds | {_cell([r['privet_wall_s'] for r in reps], '.2f')} | "
        f"{_cell([r['bare_wall_s'] for r in reps], '.2f')} | {_cell([r['ratio_wall'] for r in reps], '.2f')}x |",
        f"| CPU ms per sampled client | | {_cell([r['bare_ms_per_client'] for r in reps], '.1f')} | |",
        f"| framework CPU ms per sampled client (privet − bare − evaluation) | "
        f"{_cell([r['overhead_ms_per_client'] for r in reps], '.1f')} | | |",
        "",
        f"The budget handshake (round 1, not in the figures): {_cell([r['handshake_s'] for r in reps], '.1f')} s.",
    ]
    prof = record.get("profile")
    if prof:
        lines += ["", "## Where a sampled client's time goes", "",
                  f"cProfile of {prof['rounds']} in-process rounds of the same regime"
                  f"{' at N = ' + format(prof['clients'], ',') if prof.get('clients') else ''}"
                  f"{' (10 examples per client, as at 6,000)' if prof.get('max_examples') == 10 else ''} "
                  f"({prof['client_rounds']} client rounds), in one process: cumulative {prof.get('timer', 'wall')} ms per "
                  "client round of each function (profiling inflates Python-heavy rows; the client's rows below the first are parts of "
                  "it, not all of it).", "",
                  "| where | ms per client round |", "|---|---|"]
        for what, key in PROFILE_ROWS:
            ms = prof["ms_per_client"].get(key)
            absent = ms is None or (ms == 0 and ("before)" in what or "after)" in what))  # the other version's row
            lines.append(f"| {what} | {'-' if absent else f'{ms:.1f}'} |")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return done.stdout.strip()


def _profiled(args: argparse.Namespace) -> dict[str, Any]:
    """The profiled run's config: the regime at --profile-clients, each client still holding 10 examples."""
    return {**regime(args.profile_clients or args.clients, args.profile_rounds, args.model),
            "max-examples-per-client": 10}


def main(argv: list[str] | None = None) -> int:
    """Interleave privet and bare rounds over repetitions; write the record (.json) and its table (.md)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=6000)
    p.add_argument("--rounds", type=int, default=4, help="rounds per run; rounds 2..R are measured")
    p.add_argument("--model", default="cnn")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="also profile one in-process run (--profile-rounds)")
    p.add_argument("--profile-rounds", type=int, default=2)
    p.add_argument("--profile-clients", type=int, help="N of the profiled run (default --clients; the per-client "
                   "rows do not depend on N, the handshake row does)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gdpfed_round.md")
    p.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the table from this record")
    p.add_argument("--reprofile", type=Path, metavar="JSON", help="only profile again (--profile-clients, "
                   "--profile-rounds) into this record, and rebuild its table")
    p.add_argument("--bare", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bare:
        spec = json.loads(args.bare.read_text())
        print(json.dumps(bare_rounds(spec["config"], spec["sampled"])))
        return 0
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text())))
        return 0
    if args.reprofile:
        record = json.loads(args.reprofile.read_text())
        with tempfile.TemporaryDirectory(prefix="bench-gdpfed-prof-") as tmp:
            record["profile"] = profile_run(_profiled(args), Path(tmp) / "round.prof")
        write(args.reprofile.with_suffix(".md"), record, render)
        return 0
    config = regime(args.clients, args.rounds, args.model)
    load_start = os.getloadavg()[0]
    reps = []
    for i in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="bench-gdpfed-") as tmp:
            privet = run_privet(config, Path(tmp))
            bare = run_bare(config, privet["sampled"], Path(tmp))
        reps.append({"privet": privet, "bare": bare})
        print(json.dumps({"rep": i, **summarise(reps[-1])}), flush=True)
    record: dict[str, Any] = {"config": config, "commit": _commit(), **machine(load_start), "reps": reps}
    if args.profile:
        with tempfile.TemporaryDirectory(prefix="bench-gdpfed-prof-") as tmp:
            record["profile"] = profile_run(_profiled(args), Path(tmp) / "round.prof")
        record["load_end"] = os.getloadavg()[0]
    write(args.out, record, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
