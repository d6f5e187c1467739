"""Cost of exact discrete Gaussian noise against the float Gaussian, per coordinate, in one run.

For each σ, ``--size`` coordinates (default 100,000, a model of 100k parameters) are drawn
from N_Z(0, σ²) by :func:`privacy.discrete_gaussian.discrete_gaussian` and from N(0, σ²) by
the same source's ``normal`` (Box–Muller on the same AES-CTR keystream, what a client adds
today), alternating, ``--repeats`` times; reported: the median samples per second and the
median of the per-repeat time ratios (exact / float), with their min-max. A last row times
a whole distributed-discrete-Gaussian input (:func:`privacy.distributed_discrete_gaussian.encode`:
clip, scale, randomised Hadamard rotation, rounding, N_Z noise, mod 2^b; b = 20, 10 members,
noise multiplier 1) against clipping and adding float noise to the same vector.

Every timing is kept in a JSON record beside the table (same name, ``.json``); the table is
generated from the records (``--table`` regenerates it without running). Only ratios are
meant to be compared across machines; the machine's load is recorded.

Usage::

    python benchmarks/bench_discrete_gaussian.py --out benchmarks/results/discrete_gaussian.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privacy.discrete_gaussian import discrete_gaussian  # noqa: E402
from privacy.distributed_discrete_gaussian import ddg_parameters, encode  # noqa: E402
from privacy.randomness import NOISE_SOURCES, noise_source  # noqa: E402

SIGMAS = (0.5, 2.0, 10.0, 1e3, 1e4, 1e5)
ENCODE = "ddg encode"


def _timed(fn) -> tuple[float, float]:  # noqa: ANN001
    """Wall and process-CPU seconds of one call (the CPU time is less moved by other jobs)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(size: int, repeats: int, source_name: str) -> list[dict[str, float | str]]:
    """One record per (σ or encode, repeat): seconds for the exact draw and for the float one."""
    source = noise_source(source_name, 0 if source_name == "seeded" else None)
    records: list[dict[str, float | str]] = []
    discrete_gaussian(1000, 4, source)  # warm-up
    params = ddg_parameters(clip=1.0, dim=size, bits=20, noise_multiplier=1.0, noise_shares=10, max_members=10)
    update = np.random.default_rng(0).normal(size=size) * 1e-3
    std = params.clip * 1.0 / np.sqrt(10)

    def float_update() -> None:
        clipped = update * min(1.0, params.clip / float(np.linalg.norm(update)))
        _ = clipped + source.normal((size,), std)

    for rep in range(repeats):
        for sigma in SIGMAS:
            exact, exact_cpu = _timed(lambda sigma=sigma: discrete_gaussian(size, sigma * sigma, source))
            floating, float_cpu = _timed(lambda sigma=sigma: source.normal((size,), sigma))
            records.append({"case": f"sigma={sigma:g}", "repeat": rep, "exact_s": exact, "float_s": floating,
                            "exact_cpu_s": exact_cpu, "float_cpu_s": float_cpu})
        exact, exact_cpu = _timed(lambda: encode(update, params, b"bench", source))
        floating, float_cpu = _timed(float_update)
        records.append({"case": ENCODE, "repeat": rep, "exact_s": exact, "float_s": floating,
                        "exact_cpu_s": exact_cpu, "float_cpu_s": float_cpu})
        print(rep, {r["case"]: f"{r['exact_s']:.3f}s / {r['float_s']:.4f}s" for r in records[-len(SIGMAS) - 1:]},
              flush=True)
    return records


def table(data: dict) -> str:  # type: ignore[type-arg]
    """Generate the markdown table from the JSON records."""
    size = data["size"]
    lines = [
        f"# Exact discrete Gaussian vs float Gaussian ({data['when']}, load {data['load']:.2f}, "
        f"{data['repeats']} alternating repeats, median; source {data['source']})", "",
        f"{size:,} coordinates per draw (a model of that many parameters); times are medians per draw (wall, "
        "and the process's CPU time, which other jobs on the machine move less). Ratio: median over repeats "
        "of exact / float wall time [min-max]. The encode row: a whole DDG input (clip, scale, rotation to "
        f"{data['padded']:,} coordinates, rounding, N_Z noise, mod 2^20) against clip + float noise.", "",
        "| case | exact samples/s | float samples/s | exact ms | float ms | exact CPU ms | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    cases = dict.fromkeys(r["case"] for r in data["records"])
    for case in cases:
        rs = [r for r in data["records"] if r["case"] == case]
        exact = statistics.median(r["exact_s"] for r in rs)
        floating = statistics.median(r["float_s"] for r in rs)
        cpu = statistics.median(r["exact_cpu_s"] for r in rs)
        ratios = [r["exact_s"] / r["float_s"] for r in rs]
        lines.append(f"| {case} | {size / exact:,.0f} | {size / floating:,.0f} | {exact * 1e3:.1f} | "
                     f"{floating * 1e3:.2f} | {cpu * 1e3:.1f} | {statistics.median(ratios):.0f}x "
                     f"[{min(ratios):.0f}-{max(ratios):.0f}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the grid (or only regenerate the table from the records) and write both."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--source", choices=NOISE_SOURCES, default="csprng")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "discrete_gaussian.md")
    parser.add_argument("--table", action="store_true", help="only regenerate the table from the JSON records")
    args = parser.parse_args()
    records_path = args.out.with_suffix(".json")
    if args.table:
        data = json.loads(records_path.read_text())
    else:
        records = measure(args.size, args.repeats, args.source)
        from privacy.distributed_discrete_gaussian import padded_dimension

        data = {"when": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "load": os.getloadavg()[0], "size": args.size,
                "padded": padded_dimension(args.size), "repeats": args.repeats, "source": args.source,
                "cpu_count": os.cpu_count(), "records": records}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        records_path.write_text(json.dumps(data, indent=1) + "\n")
    text = table(data)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
