"""Distributed discrete Gaussian vs the continuous Gaussian inside secure sums, at the same ε (issue 39, item 4).

Two tables, the kind Kairouz, Liu & Steinke (ICML 2021) show, on privet's tasks:

- **compare**: UDP-FedAvg with one secure sum of all K clients per round, each client's update
  privatised three ways at the same target ε per client: ``secagg+`` (float Gaussian shares,
  24-bit quantisation, charged with the PRV accountant, privet's default), ``secagg+`` charged
  with RDP (to separate the accountant's share of the difference from the mechanism's), and
  ``secagg+ddg`` at 16 bits (exact discrete Gaussian shares, charged with KLS's RDP bound);
- **bits**: ``secagg+ddg`` at b = 10, 12, 16, 20, 24 bits per coordinate on the wire, each
  calibrated to the same ε;
- **gdpfed**: GDPFed+ (three budget groups, Problem 1's q_m, top-k) with each group one secure sum,
  continuous (``secagg+``, charged (σ_m, q_m, T) by PRV or RDP) against discrete (``secagg+ddg`` at
  16 bits, each member charged KLS's curve amplified by Poisson sampling with Zhu & Wang's general
  bound, :mod:`privacy.poisson_rdp`), every client at the same budget. The strategy calibrates σ_m
  itself against the charge its clients make (:func:`privacy.group_calibration.ddg_group_noise_multiplier`
  for ``secagg+ddg``), so the record's σ_m is the plan's.

Each run's noise multiplier z is the smallest that keeps every client's ledger at the target ε
after T rounds, computed here with privet's own charge (:func:`calibrate`): for ``secagg+`` the
Gaussian (z·√(r_min/m), 1, T) under the run's accountant; for ``secagg+ddg`` the Gaussian step
that dominates KLS's RDP curve for the sum's parameters (scale, σ², B² from
:func:`privacy.distributed_discrete_gaussian.ddg_parameters`), so a rounding inflation of the
norm bound at few bits costs noise here, where it belongs. The runs are the real ServerApp and
ClientApp on the in-process grid; every record lands in ``runs.jsonl`` and
``results.md`` is generated from the records::

    nice -n 10 python experiments/ddg/ddg.py run --part compare --seeds 1 2 3            # ε = 8
    nice -n 10 python experiments/ddg/ddg.py run --part compare --seeds 1 2 3 --epsilon 4
    nice -n 10 python experiments/ddg/ddg.py run --part bits --seeds 1 2 3
    nice -n 10 python experiments/ddg/ddg.py run --part gdpfed --seeds 1 2 3
    python experiments/ddg/ddg.py report

Hyperparameters are fixed before any run (no tuning on the test split): the regime below, the
learning rate and clip of :data:`REGIME`. Seeds fix the partition, the model's initialisation
and the sampling; the DP noise comes from each client's CSPRNG and is never seeded.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

#: The regime: logistic regression on Fashion-MNIST (7,850 parameters, d' = 8,192), K = 30 IID
#: clients of 200 examples, every client in the round's one secure sum (r_min = m = K), T = 10.
REGIME: dict[str, Any] = {
    "strategy": "udp-fedavg", "dataset": "fashion-mnist", "model": "logreg", "partitioner": "iid",
    "num-clients": 30, "min-train-clients": 30, "fraction-train": 1.0, "max-examples-per-client": 200,
    "num-server-rounds": 10, "local-epochs": 1, "batch-size": 32, "learning-rate": 0.1, "momentum": 0.0,
    "clip": 0.3, "noise-shares": 30, "secagg.min-survivors": 0, "delta": 1e-5,
    "budget-distribution": "constant", "evaluation-split": "test",
}
TARGET_EPSILON = 8.0
#: each client's budget: the target plus a margin the calibration's round-off never reaches
BUDGET_MARGIN = 1.001
BITS_SWEEP = (10, 12, 16, 20, 24)
COMPARE_BITS = 16
#: (label, secure-aggregation, accountant)
COMPARE = (("secagg+ (PRV)", "secagg+", "prv"), ("secagg+ (RDP)", "secagg+", "rdp"),
           ("secagg+ddg (RDP)", "secagg+ddg", "rdp"))
#: GDPFed+ in small settings: logreg on Fashion-MNIST, 60 IID clients of 100 examples in three budget
#: groups of 20 (ε = 2, 4, 8 at δ = 1e-5), q = 0.25 overall (Problem 1 gives r = 2, 5, 8), T = 10.
GDPFED_REGIME: dict[str, Any] = {
    "strategy": "gdpfed-plus", "dataset": "fashion-mnist", "model": "logreg", "partitioner": "iid",
    "num-clients": 60, "min-train-clients": 1, "max-examples-per-client": 100, "num-server-rounds": 10,
    "local-epochs": 1, "batch-size": 32, "learning-rate": 0.1, "momentum": 0.0, "clip": 0.3, "delta": 1e-5,
    "budget-distribution": "groups", "budget-groups": "2, 4, 8", "gdpfed.group-epsilons": "2, 4, 8",
    "gdpfed.q": 0.25, "evaluation-split": "test",
}
GDPFED_COMPARE = (("GDPFed+ secagg+ (PRV)", "secagg+", "prv"), ("GDPFed+ secagg+ (RDP)", "secagg+", "rdp"),
                  ("GDPFed+ secagg+ddg (RDP)", "secagg+ddg", "rdp"))
RECORDS = HERE / "runs.jsonl"
RUNS = HERE / "runs"


# ----------------------------------------------------------------------------- calibration

def model_dim(model: str) -> int:
    """d, the model's parameter count (Fashion-MNIST's 1×28×28 inputs, 10 classes)."""
    from tasks.models import build_model

    return int(sum(p.numel() for p in build_model(model, input_shape=(1, 28, 28), num_classes=10).parameters()))


def charged_epsilon(z: float, mode: str, accountant: str, bits: int, cfg: dict[str, Any], dim: int) -> float:
    """Each client's ε after T releases at noise multiplier z, as its ledger charges them."""
    from privacy.accountants import epsilon_of
    from privacy.ddg_accounting import gaussian_equivalent_multiplier
    from privacy.distributed_discrete_gaussian import ddg_parameters
    from privacy.secure_sum import charged_multiplier
    from strategies.secagg_config import DEFAULT_BETA

    k, m, rounds = int(cfg["num-clients"]), int(cfg["noise-shares"]), int(cfg["num-server-rounds"])
    r_min = int(cfg["secagg.min-survivors"]) or m
    if mode == "secagg+":
        sigma = charged_multiplier(z, m, r_min)
    else:
        try:
            params = ddg_parameters(clip=float(cfg["clip"]), dim=dim, bits=bits, noise_multiplier=z, noise_shares=m,
                                    max_members=k, beta=DEFAULT_BETA)
        except ValueError:  # too little noise for KLS's theorem (σ < 1/2 per share): no guarantee at all
            return math.inf
        sigma = gaussian_equivalent_multiplier(local_sigma_sq=params.local_sigma_sq,
                                               norm_bound_sq=params.norm_bound_sq, padded_dim=params.padded_dim,
                                               min_shares=r_min, max_shares=k)
    return epsilon_of([(sigma, 1.0, rounds)], float(cfg["delta"]), accountant)


class Unreachable(ValueError):
    """No noise multiplier reaches the target ε: at few bits the rounding's norm inflation dominates."""


def smallest_epsilon(mode: str, accountant: str, bits: int, cfg: dict[str, Any], dim: int) -> float:
    """The least ε any z gives (DDG at b bits: σ² <= room/n while B² >= d'/4, so ε has a floor)."""
    return min(charged_epsilon(2.0 ** (k / 4), mode, accountant, bits, cfg, dim) for k in range(-12, 60))


def calibrate(target: float, mode: str, accountant: str, bits: int, cfg: dict[str, Any], dim: int) -> float:
    """The smallest z (to 1e-6 relative) whose charge stays within ``target``.

    Raises
    ------
    Unreachable
        If no z up to 2^15 does (the message gives the least ε there is).
    """
    low, high = 0.05, 1.0
    while charged_epsilon(high, mode, accountant, bits, cfg, dim) > target:
        low, high = high, high * 2
        if high > 2**15:
            raise Unreachable(f"{mode} at {bits} bits cannot reach eps={target:g}: the least is "
                              f"{smallest_epsilon(mode, accountant, bits, cfg, dim):.4g}")
    while high / low > 1 + 1e-6:
        middle = math.sqrt(low * high)
        if charged_epsilon(middle, mode, accountant, bits, cfg, dim) > target:
            low = middle
        else:
            high = middle
    return high


# ----------------------------------------------------------------------------- runs

def jobs(part: str, seeds: list[int], target: float = TARGET_EPSILON) -> list[tuple[str, dict[str, Any],
                                                                                   dict[str, Any]]]:
    """(key, run config overrides, what the record says about the run) of one part at ε = ``target``."""
    if part == "gdpfed":
        return [(f"gdpfed|{mode}|{accountant}|b{COMPARE_BITS}|seed{seed}",
                 {**GDPFED_REGIME, "secure-aggregation": mode, "accountant": accountant, "secagg.bits": COMPARE_BITS,
                  "seed": seed},
                 {"part": part, "label": label, "mode": mode, "accountant": accountant, "bits": COMPARE_BITS,
                  "seed": seed, "target_epsilon": GDPFED_REGIME["budget-groups"]})
                for label, mode, accountant in GDPFED_COMPARE for seed in seeds]
    dim = model_dim(REGIME["model"])
    variants = [(label, mode, accountant, COMPARE_BITS) for label, mode, accountant in COMPARE] if part == "compare" \
        else [(f"secagg+ddg {b} bits", "secagg+ddg", "rdp", b) for b in BITS_SWEEP]
    out: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for label, mode, accountant, bits in variants:
        try:
            z = calibrate(target, mode, accountant, bits, REGIME, dim)
        except Unreachable as exc:
            key = f"{mode}|{accountant}|b{bits}|eps{target:g}|unreachable"
            out.append((key, {}, {"part": part, "label": label, "mode": mode, "accountant": accountant, "bits": bits,
                                  "target_epsilon": target, "unreachable": str(exc),
                                  "smallest_epsilon": smallest_epsilon(mode, accountant, bits, REGIME, dim)}))
            continue
        for seed in seeds:
            key = f"{mode}|{accountant}|b{bits}|eps{target:g}|seed{seed}"  # shared by both parts
            overrides = {**REGIME, "secure-aggregation": mode, "accountant": accountant, "secagg.bits": bits,
                         "noise-multiplier": z, "epsilon": target * BUDGET_MARGIN, "seed": seed}
            out.append((key, overrides, {"part": part, "label": label, "mode": mode, "accountant": accountant,
                                         "bits": bits, "seed": seed, "target_epsilon": target,
                                         "noise_multiplier": z}))
    return out


def execute(key: str, overrides: dict[str, Any], about: dict[str, Any]) -> dict[str, Any]:
    """One in-process run (the real ServerApp logic and ClientApp); its record."""
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    from client.app import app as client_app
    from privet.cli import app_defaults
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    out = RUNS / key.replace("|", "_")
    cfg = {**app_defaults(), **overrides, "out-dir": str(out)}
    started = time.perf_counter()
    grid = InProcessGrid(client_app, simulation_node_configs(int(cfg["num-clients"])), cfg)
    summary = run_experiment(grid, cfg, run_id=1)
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    (out / "model.npz").unlink(missing_ok=True)  # the records are what the table reads
    sums = [s for r in rounds for s in r.get("secure_sums", [])]
    accuracy = [r["accuracy"] for r in rounds]
    return {**about, "key": key, "accuracy_by_round": accuracy, "final_accuracy": accuracy[-1],
            "last3_accuracy": statistics.fmean(accuracy[-3:]),
            "rounds_completed": summary["rounds_completed"], "failed_rounds": summary["failed_rounds"],
            "epsilon_spent": [c["epsilon_spent"] for c in summary["clients"]],
            "epsilon_server": [c["epsilon_server_recomputed_this_run"] for c in summary["clients"]],
            "within_budget": all(c["within_budget"] for c in summary["clients"]),
            "wrap_probability": max((s.get("wrap_probability", 0.0) for s in sums), default=None),
            "local_sigma_sq": sums[0].get("local_sigma_sq") if sums else None,
            "scale": sums[0].get("scale") if sums else None, "norm_bound": sums[0].get("norm_bound") if sums else None,
            "bytes_up_per_round": statistics.fmean(r["bytes_up"] for r in rounds[1:]),
            "seconds": time.perf_counter() - started, **_group_record(cast(dict[str, Any], summary))}


def _group_record(summary: dict[str, Any]) -> dict[str, Any]:
    """A GDPFed run's plan (σ_m, r_m, q_m, ε_m) and, per group, the largest ε spent over its budget."""
    group = summary.get("group_dp")
    if not group or not group.get("plan"):
        return {}
    plan = group["plan"]
    spent: dict[float, float] = {}
    for c in summary["clients"]:
        if c["epsilon_spent"]:
            budget = float(c["epsilon_budget"])
            spent[budget] = max(spent.get(budget, 0.0), float(c["epsilon_spent"]) / budget)
    return {"plan": {k: plan[k] for k in ("sigmas", "counts", "sample_rates", "epsilons", "sparsity")},
            "spent_over_budget": {f"{b:g}": v for b, v in sorted(spent.items())},
            "server_matches": all(abs((c["epsilon_server_recomputed_this_run"] or 0.0) - (c["epsilon_spent"] or 0.0))
                                  <= 1e-6 * max(1.0, c["epsilon_spent"] or 0.0) for c in summary["clients"])}


def load_records() -> dict[str, dict[str, Any]]:
    """The records by key (a later record of a key replaces an earlier one)."""
    records: dict[str, dict[str, Any]] = {}
    if RECORDS.exists():
        for line in RECORDS.read_text().splitlines():
            record = json.loads(line)
            records[record["key"]] = record
    return records


def run(part: str, seeds: list[int], target: float) -> None:
    """Run the part's jobs that have no record yet, one at a time, each record appended as it lands."""
    done = load_records()
    todo = [j for j in jobs(part, seeds, target) if j[0] not in done]
    print(f"{len(todo)} runs to do", flush=True)
    for key, overrides, about in todo:
        record = {**about, "key": key} if about.get("unreachable") else execute(key, overrides, about)
        with open(RECORDS, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        noise = f"z={about['noise_multiplier']:.4f}" if "noise_multiplier" in about else \
            f"sigma_m={record.get('plan', {}).get('sigmas')}"
        print(key, about.get("unreachable") or f"{noise} final {record['final_accuracy']:.4f} "
              f"eps {max(record['epsilon_spent']):.4f} ({record['seconds']:.0f} s)", flush=True)


# ----------------------------------------------------------------------------- report

def _mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.2f} ± {100 * sd:.2f}"


def report() -> str:
    """``results.md`` from the records."""
    records = list(load_records().values())
    r = REGIME
    lines = [
        "# Distributed discrete Gaussian vs continuous Gaussian secure sums (generated by `ddg.py report`)", "",
        f"UDP-FedAvg, {r['model']} on Fashion-MNIST ({model_dim(r['model']):,} parameters), {r['num-clients']} IID "
        f"clients of {r['max-examples-per-client']} examples, all in one secure sum per round (r_min = m = "
        f"{r['noise-shares']}), T = {r['num-server-rounds']} rounds, clip C = {r['clip']}, lr {r['learning-rate']}, "
        f"batch {r['batch-size']}, 1 local epoch; every client's ledger calibrated to the target ε at "
        f"δ = {r['delta']:g} (replace-one, client level). Test accuracy in %, mean ± sd over seeds; "
        "'last 3' is the mean of the last three rounds' accuracy. z is the noise multiplier of the central sum "
        "(m shares of N(0, z²C²/m), or of N_Z(0, ⌈z²C²s²/m⌉) in scaled integer units); the wrap-around bound is "
        "eq. (3) of privacy/distributed_discrete_gaussian.py (0: the quantised Gaussian sum cannot wrap).", ""]
    def compare_label(x: dict[str, Any]) -> str:
        return f"{x['mode']} ({x['accountant'].upper()})"

    def bits_label(x: dict[str, Any]) -> str:
        return f"secagg+ddg {x['bits']} bits"

    udp = [x for x in records if x.get("part") != "gdpfed"]
    parts = (("Same ε, three mechanisms", lambda x: x["mode"] == "secagg+" or x["bits"] == COMPARE_BITS, compare_label),
             ("Bits per coordinate (secagg+ddg)", lambda x: x["mode"] == "secagg+ddg", bits_label))
    for title, belongs, label_of in parts:
        rows = [x for x in udp if belongs(x)]
        if not rows:
            continue
        lines += [f"## {title}", "",
                  "| target ε | mechanism | accountant | bits | z | seeds | final | last 3 | ε spent (max) "
                  "| server ε (max) | wrap-around bound | bytes up / round |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        groups: dict[tuple[float, str, str, int], list[dict[str, Any]]] = {}
        for x in rows:
            groups.setdefault((x["target_epsilon"], label_of(x), x["accountant"], x["bits"]), []).append(x)
        for (target, label, accountant, bits), xs in sorted(groups.items(),
                                                             key=lambda g: (-g[0][0], g[0][3], g[0][2], g[0][1])):
            if xs[0].get("unreachable"):
                lines.append(f"| {target:g} | {label} | {accountant} | {bits} | – | – | not run: no z reaches ε = "
                             f"{target:g} (the least ε at {bits} bits is {xs[0]['smallest_epsilon']:.3g}) "
                             "| | | | | |")
                continue
            wrap = xs[0]["wrap_probability"]
            bits_cell = f"{bits}" if xs[0]["mode"] == "secagg+ddg" else f"{bits} (quantiser)"
            lines.append(
                f"| {target:g} | {label} | {accountant} | {bits_cell} | {xs[0]['noise_multiplier']:.4f} | "
                f"{', '.join(str(x['seed']) for x in sorted(xs, key=lambda x: x['seed']))} | "
                f"{_mean_sd([x['final_accuracy'] for x in xs])} | {_mean_sd([x['last3_accuracy'] for x in xs])} | "
                f"{max(max(x['epsilon_spent']) for x in xs):.4f} | {max(max(x['epsilon_server']) for x in xs):.4f} | "
                f"{'–' if wrap is None else f'{wrap:.1e}'} | {statistics.fmean(x['bytes_up_per_round'] for x in xs):,.0f} |")
        lines.append("")
    lines += _gdpfed_report([x for x in records if x.get("part") == "gdpfed"])
    return "\n".join(lines) + "\n"


def _gdpfed_report(records: list[dict[str, Any]]) -> list[str]:
    """The GDPFed+ table: continuous against discrete group sums at the same budgets."""
    if not records:
        return []
    g = GDPFED_REGIME
    lines = ["## GDPFed+ with continuous and discrete Gaussian group sums", "",
             f"GDPFed+ ({g['model']} on Fashion-MNIST, {g['num-clients']} IID clients of "
             f"{g['max-examples-per-client']} examples in three budget groups ε = {g['budget-groups']} at δ = {g['delta']:g}, q = {g['gdpfed.q']} "
             f"overall with Problem 1's q_m, top-k per group, T = {g['num-server-rounds']}, C = {g['clip']}), each "
             "group one secure sum released with all r_m members. σ_m is the plan's, calibrated by the strategy "
             "against what its members charge: (σ_m, q_m, T) under the accountant for `secagg+`; KLS's curve at "
             "the sum's parameters amplified by Poisson sampling (Zhu & Wang 2019, Thm. 6; replace-one through "
             "the zero-out neighbour) for `secagg+ddg`. 'ε / budget' is the largest ε a client of the group spent "
             "over its budget; 'server' says whether every client's ε equals the server's recomputation.", "",
             "| mechanism | accountant | bits | σ_m (ε = 2, 4, 8) | r_m | seeds | final | last 3 "
             "| ε / budget (max per group) | server | bytes up / round |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for x in records:
        groups.setdefault(x["label"], []).append(x)
    for label, _mode, _accountant in GDPFED_COMPARE:
        xs = sorted(groups.get(label, []), key=lambda x: x["seed"])
        if not xs:
            continue
        plan = xs[0]["plan"]
        ratio = {b: max(x["spent_over_budget"].get(b, 0.0) for x in xs) for b in xs[0]["spent_over_budget"]}
        bits_cell = f"{xs[0]['bits']}" if xs[0]["mode"] == "secagg+ddg" else f"{xs[0]['bits']} (quantiser)"
        lines.append(
            f"| {label} | {xs[0]['accountant']} | {bits_cell} | {', '.join(f'{s:.3f}' for s in plan['sigmas'])} | "
            f"{', '.join(str(r) for r in plan['counts'])} | {', '.join(str(x['seed']) for x in xs)} | "
            f"{_mean_sd([x['final_accuracy'] for x in xs])} | {_mean_sd([x['last3_accuracy'] for x in xs])} | "
            f"{', '.join(f'{v:.4f}' for v in ratio.values())} | "
            f"{'equal' if all(x['server_matches'] for x in xs) else 'DIFFERS'} | "
            f"{statistics.fmean(x['bytes_up_per_round'] for x in xs):,.0f} |")
    return lines + [""]


def main() -> None:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run")
    runner.add_argument("--part", choices=("compare", "bits", "gdpfed"), required=True)
    runner.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    runner.add_argument("--epsilon", type=float, default=TARGET_EPSILON, help="every client's target ε")
    sub.add_parser("report")
    sub.add_parser("plan", help="print each variant's calibrated z and charge, run nothing")
    args = parser.parse_args()
    if args.command == "run":
        RUNS.mkdir(parents=True, exist_ok=True)
        run(args.part, args.seeds, args.epsilon)
    elif args.command == "plan":
        for part in ("compare", "bits"):
            for key, _overrides, about in jobs(part, [1]):
                print(key, about.get("unreachable") or f"z={about['noise_multiplier']:.5f}", flush=True)
    else:
        text = report()
        (HERE / "results.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
