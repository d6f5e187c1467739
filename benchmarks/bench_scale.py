"""Cost versus the number of clients N, with a fixed share sampled per round.

GDPFed's Fashion-MNIST regime: N clients with 10 examples each, the 2-layer CNN (``cnn2``),
DP-SGD with batch 10; the same number of clients sampled per round at every N (GDPFed samples
2%: 120 of 6,000), so that what grows with N is only what the framework does per client. For each N this starts ``privet run`` in a fresh
process (the in-process backend, or Flower's Ray simulation with ``--backend simulation``) and
reads back, from the run's ``rounds.jsonl``:

- **handshake**: the budget handshake of round 1 (every client declares its budget once);
- **per round**: the mean wall time of rounds 2..R (sampling, training the sampled clients,
  validation, aggregation, evaluation on the 10,000 test images);
- **CPU per round**: the CPU seconds of the run's whole process tree (Ray's raylet, GCS and
  workers included) per round over rounds 2..R, read when each round's line appears in
  ``rounds.jsonl`` (``benchmarks/proc_tree.py``);
- **peak memory of this N**: the maximum over the run of its process tree's summed PSS (shared
  pages split among the processes that map them), sampled every 0.5 s, and the peak RSS of the
  ``privet run`` process (``wait4``'s ``ru_maxrss`` of this run's child: the largest of it and the
  descendants it reaped, not a running maximum over earlier runs; in-process that is the whole run,
  in Ray simulation the driver side only, Ray's workers being the raylet's).

With ``--reps`` > 1 the sizes are interleaved (every size once per repetition) and every figure is
the median with its min-max over repetitions. The machine's load is reported with the results,
because a 2-core machine shared with other jobs moves every figure. Ratios to the smallest N are
taken within each repetition.

Usage::

    python benchmarks/bench_scale.py --sizes 100 1000 6000 --sampled 20 --rounds 3 --out benchmarks/results/scale.md
    python benchmarks/bench_scale.py --plot benchmarks/results/scale.json   # CPU per round and handshake against N
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from records import machine, write  # noqa: E402

PRIVET = Path(sys.executable).parent / "privet"


def run_sets(n: int, sampled: int, rounds: int) -> dict[str, int | float | str]:
    """The run's ``--set`` keys: N = n clients of 10 examples, ``sampled`` per round, ``cnn2``, batch 10
    (also the two-node row's, ``benchmarks/bench_scale_two_node.py``)."""
    return {"num-clients": n, "fraction-train": sampled / n, "num-server-rounds": rounds, "model": "cnn2",
            "max-examples-per-client": 10, "batch-size": 10, "min-train-clients": sampled}


def run_once(n: int, rounds: int, backend: str, sampled: int, regime: str = "fixed",
             deadline: float | None = None) -> dict[str, float]:
    """One ``privet run`` at N = n with ``sampled`` clients per round, its process tree watched.

    ``regime = "gdpfed"``: GDPFed's FMNIST run instead (``bench_gdpfed_round.regime``: q = 2 %, τ = 5
    steps of batch 10 on ``cnn``, budgets in three groups); ``sampled`` is then ignored (q·n).
    ``deadline`` (``time.time()``): a run still going then is stopped (its whole process tree), and
    its figures are those of the rounds it finished (``rounds_done``, ``stopped``).
    """
    from proc_tree import TreeWatch, tree

    out = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
    sets: dict[str, Any] = dict(run_sets(n, sampled, rounds))
    if regime == "gdpfed":
        from bench_gdpfed_round import regime as gdpfed_regime

        sets = gdpfed_regime(n, rounds)
    cmd = [str(PRIVET), "run", "--backend", backend, "--out", str(out / "r")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    log = (out / "log").open("w")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    stopped = False
    with TreeWatch(proc.pid, out / "r" / "rounds.jsonl", interval=0.1) as watch:
        while True:  # wait4: this child's own rusage, its peak, not earlier runs'
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG if deadline is not None else 0)
            if pid:
                break
            if deadline is not None and time.time() > deadline and not stopped:
                stopped = True
                for member in reversed(tree(proc.pid)):  # this run's processes only, by pid
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(member, signal.SIGTERM)
            time.sleep(1.0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    log.close()
    if proc.returncode != 0 and not stopped:
        raise RuntimeError(f"N={n}: privet run failed\n{(out / 'log').read_text()[-3000:]}")
    lines = (out / "r" / "rounds.jsonl").read_text().splitlines() if (out / "r" / "rounds.jsonl").exists() else []
    rows = [r for r in (json.loads(x) for x in lines if x.strip()) if r["round"] >= 1]
    if not rows:  # stopped before its first round
        nan = float("nan")
        return {"n": n, "rounds_done": 0, "stopped": stopped, "sampled": 0, "wall_s": wall, "handshake_s": nan,
                "round1_s": nan, "per_round_s": nan, "per_round_cpu_s": nan,
                "peak_pss_mb": watch.peak_memory / 2**20, "peak_rss_largest_mb": usage.ru_maxrss / 1024,
                "row_bytes": 0}
    elapsed = [r["elapsed_seconds"] for r in rows]
    per_round = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]
    cpu = watch.mark_cpu  # index 0: the initial evaluation's line; k: round k's
    done = len(rows)
    return {
        "n": n,
        "rounds_done": done,
        "stopped": stopped,
        "sampled": len(rows[-1]["sampled"]),
        "wall_s": wall,
        "handshake_s": rows[0].get("handshake_seconds", float("nan")),
        "round1_s": elapsed[0],
        "per_round_s": sum(per_round) / len(per_round) if per_round else float("nan"),
        "per_round_cpu_s": (cpu[done] - cpu[1]) / (done - 1) if len(cpu) > done > 1 else float("nan"),
        "peak_pss_mb": watch.peak_memory / 2**20,
        "peak_rss_largest_mb": usage.ru_maxrss / 1024,  # KiB on Linux
        "row_bytes": len(json.dumps(rows[-1])),
    }


def _cell(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def summarise(runs: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Per N, the median over repetitions of every figure (the JSON's ``results``; ``runs`` keeps all)."""
    out = []
    for i, first in enumerate(runs[0]):
        per_n = [rep[i] for rep in runs]
        out.append({k: (statistics.median(r[k] for r in per_n) if isinstance(first[k], float) else first[k])
                    for k in first})
    return out


def render(record: dict) -> str:
    """The markdown table of a record: per N, median [min-max] over repetitions."""
    runs = record["runs"]
    reps = len(runs)
    gdpfed = record.get("regime") == "gdpfed"
    workload = ("GDPFed's FMNIST regime (`strategy = \"gdpfed\"`): 10 examples per client, q = 2 % sampled per "
                "round, τ = 5 local steps of batch 10 on `cnn`, each update clipped to C = 1.5 and noised with its "
                "group's share" if gdpfed else
                f"Model `cnn2`, 10 examples per client, {record['sampled']} clients sampled per round at every N, "
                "DP-SGD batch 10")
    lines = [
        "# Cost versus the number of clients",
        "",
        f"`python benchmarks/bench_scale.py --sizes {' '.join(str(r['n']) for r in runs[0])} --rounds "
        f"{record['rounds']}{' --regime gdpfed' if gdpfed else ' --sampled ' + str(record['sampled'])} "
        f"--backend {record['backend']} --reps {reps}` on "
        f"{record['date']}{', commit ' + record['commit'] if record.get('commit') else ''}, {record['cpus']} CPUs, "
        f"load average {record['load_start']:.1f} at the start and {record['load_end']:.1f} at the end. "
        f"{workload}, backend `{record['backend']}`; "
        f"{reps} interleaved repetition{'s' if reps > 1 else ''}"
        f"{' (median [min-max]; ratios within each repetition)' if reps > 1 else ''}.",
        "",
        "| N | sampled / round | handshake (s) | per round, rounds 2..R (s) | vs smallest N | CPU per round (s) "
        "| CPU vs smallest N | peak PSS, whole tree (MB) | peak RSS, `privet run` process (MB) | round row (bytes) "
        "| whole run (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, first in enumerate(runs[0]):
        per_n = [rep[i] for rep in runs]
        ratio = [rep[i]["per_round_s"] / rep[0]["per_round_s"] for rep in runs]
        cpu_ratio = [rep[i]["per_round_cpu_s"] / rep[0]["per_round_cpu_s"] for rep in runs]
        lines.append(
            f"| {first['n']:,} | {first['sampled']} | {_cell([r['handshake_s'] for r in per_n], '.1f')} | "
            f"{_cell([r['per_round_s'] for r in per_n], '.2f')} | {_cell(ratio, '.2f')}x | "
            f"{_cell([r['per_round_cpu_s'] for r in per_n], '.2f')} | {_cell(cpu_ratio, '.2f')}x | "
            f"{_cell([r['peak_pss_mb'] for r in per_n], '.0f')}"
            f" | {_cell([r['peak_rss_largest_mb'] for r in per_n], '.0f')} | {first['row_bytes']:,} | "
            f"{_cell([r['wall_s'] for r in per_n], '.0f')} |"
        )
    for first in runs[0]:
        if first.get("stopped"):
            lines += ["", f"**Not finished**: the run at N = {first['n']:,} was stopped at the deadline after "
                      f"{first['rounds_done']} of {record['rounds']} rounds; its figures are those rounds', and "
                      "\"whole run\" is the time until it was stopped."]
    lines += ["", "Memory is this N's run alone: the peak over the run of the summed PSS of its process tree "
              "(sampled every 0.5 s; in Ray simulation the raylet, GCS and every worker), and the peak RSS of the "
              "`privet run` process (in Ray simulation the driver side only). CPU per round: the whole tree's "
              "user + system seconds."]
    return "\n".join(lines) + "\n"


def plot(result_files: list[Path], png: Path) -> None:
    """CPU seconds per round and the handshake's wall time against N, one line per record (backend).

    CPU, not wall, per round: on the shared machine wall time follows the other jobs' load. A
    record written before the CPU column existed is drawn in the handshake panel only.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    ticks: set[int] = set()
    for path in result_files:
        data = json.loads(path.read_text())
        ns = [r["n"] for r in data["results"]]
        ticks.update(ns)
        label = {"inprocess": "in-process", "simulation": "Ray simulation"}[data["backend"]]
        label += f", {data['sampled']} sampled" + (f", {data['date'][:10]}" if "date" in data else "")
        if all("per_round_cpu_s" in r for r in data["results"]):
            axes[0].plot(ns, [r["per_round_cpu_s"] for r in data["results"]], marker="o", label=label)
        axes[1].plot(ns, [r["handshake_s"] for r in data["results"]], marker="o", label=label)
    for ax, title in zip(axes, ("CPU seconds per round, whole process tree", "handshake, once (wall s)"),
                         strict=True):
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(sorted(ticks), [f"{n:,}" for n in sorted(ticks)])
        ax.set_xlabel("N clients")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=90)


def main(argv: list[str] | None = None) -> int:
    """Run every size (interleaved over repetitions); write the record (.json) and its table (.md)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 6000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sampled", type=int, default=20, help="clients per round, the same at every N")
    p.add_argument("--backend", choices=("inprocess", "simulation"), default="inprocess")
    p.add_argument("--regime", choices=("fixed", "gdpfed"), default="fixed",
                   help="fixed: --sampled clients of cnn2, one DP-SGD step; gdpfed: GDPFed's FMNIST run (q = 2 %%)")
    p.add_argument("--deadline", metavar="HH:MM", help="UTC time at which a run still going is stopped and "
                   "recorded with the rounds it finished")
    p.add_argument("--reps", type=int, default=1, help="repetitions, the sizes interleaved (median [min-max])")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale.md",
                   help="the markdown table; the numbers also go beside it as JSON (same name, .json)")
    p.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the table from this record (.json)")
    p.add_argument("--plot", type=Path, nargs="+", metavar="JSON",
                   help="only draw these records (one line per backend) into benchmarks/results/scale.png")
    args = p.parse_args(argv)
    if args.plot:
        plot(args.plot, ROOT / "benchmarks" / "results" / "scale.png")
        return 0
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text())))
        return 0
    load_start = os.getloadavg()[0]
    deadline = None
    if args.deadline:
        from datetime import UTC, datetime

        hour, minute = (int(x) for x in args.deadline.split(":"))
        deadline = datetime.now(UTC).replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()
    runs: list[list[dict[str, float]]] = []
    for _ in range(args.reps):
        runs.append([])
        for n in args.sizes:
            runs[-1].append(run_once(n, args.rounds, args.backend, args.sampled, args.regime, deadline))
            print(json.dumps(runs[-1][-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    record = {"backend": args.backend, "regime": args.regime,
              "sampled": runs[0][0]["sampled"] if args.regime == "gdpfed" else args.sampled, "rounds": args.rounds,
              "commit": commit, **machine(load_start), "results": summarise(runs), "runs": runs}
    write(args.out, record, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
