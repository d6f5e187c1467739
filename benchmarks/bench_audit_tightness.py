"""How tight the audit is: empirical ε over charged ε for each mechanism at ε = 1, 4, 16 (white-box).

For each mechanism game of :mod:`privacy.mechanism_audit` (``update``, ``secure-sum``,
``dpsgd``) and each target ε, the honest mechanism is calibrated by privet's accountant
(``prv``, δ = 1e-5, replace-one), run on canaries with privet's default noise source
(``csprng``), attacked white-box, and its empirical ε set beside the charge: Steinke et al.'s
one-run lower bound, the threshold test's lower bound (both 95 % together), Andrew et al.'s
one-shot estimate. Each defect is run at the same targets, to show where it is flagged.

``--privet`` runs the same comparison through ``privet audit`` (:mod:`privet.audit_cmd`): each
mechanism as a run config uses it (privet's client mechanisms, the client's own calibration to a
constant budget ε, its ledger; the server asking for 2T rounds), and adds those records to the
JSON beside the games' (a third table).

Every audit is one JSON record (``--out`` with ``.json``); the markdown table is generated from
the records (``--table-from`` rebuilds it without rerunning).

Usage::

    nice -n 10 python benchmarks/bench_audit_tightness.py --out benchmarks/results/audit_tightness.md
    nice -n 10 python benchmarks/bench_audit_tightness.py --privet      # adds the privet-audit records
    python benchmarks/bench_audit_tightness.py --table-from benchmarks/results/audit_tightness.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privacy.mechanism_audit import DEFECTS, audit  # noqa: E402

#: Canaries per mechanism (DP-SGD's runs are vectorised, so it affords more).
CANARIES = {"update": 20_000, "secure-sum": 20_000, "dpsgd": 50_000}
#: Game options per defect: the extended run is charged T = 2 rounds and releases 8.
OPTIONS: dict[str, dict[str, Any]] = {"extended-run": {"rounds": 2}}
#: The DP-SGD game has no rounds: its extended run releases 4x its steps.
DPSGD_OPTIONS: dict[str, dict[str, Any]] = {}


def run(targets: list[float], mechanisms: list[str], defects: list[str], scale: float, seed: int) -> list[dict[str, Any]]:
    """One record per (mechanism, defect, target)."""
    records = []
    for mechanism in mechanisms:
        for name in defects:
            for target in targets:
                options = (DPSGD_OPTIONS if mechanism == "dpsgd" else OPTIONS).get(name, {})
                canaries = int(CANARIES[mechanism] * scale)
                r = audit(mechanism, target, canaries=canaries, defect=DEFECTS[name], seed=seed, **options)
                record = {"mechanism": mechanism, "defect": name, "target_epsilon": target,
                          "charged_epsilon": r.charged_epsilon, "canaries": r.canaries, "releases": r.releases,
                          "one_run_bound": r.one_run_bound, "threshold_bound": r.threshold_bound,
                          "lower_bound": r.lower_bound, "one_shot_epsilon": r.one_shot_epsilon,
                          "flagged": r.flagged, "violation": r.violation, "profile": r.profile,
                          "history": r.history, "relation": r.relation, "delta": r.delta,
                          "confidence": r.confidence, "seconds": r.seconds, "options": options,
                          "noise": "csprng", "line": r.line()}
                print(json.dumps({k: record[k] for k in ("mechanism", "defect", "target_epsilon", "lower_bound",
                                                          "charged_epsilon", "flagged", "seconds")}), flush=True)
                records.append(record)
    return records


#: privet audit: canaries per game (DP-SGD: every record of the client's 6,000 is a canary).
PRIVET_CANARIES = {"update": 2000, "secure-sum": 2000, "group-sum": 2000, "dpsgd": 6000, "centroids": 2000,
                   "ddg-sum": 2000, "dpsgd-steps": 6000}
#: Games run by their Game rather than selected by ``privet audit`` (the registry keeps one game per kind).
BY_GAME = {"dpsgd-steps": "privet.audit_dpsgd_steps:DPSGD_STEPS"}
#: Declared rounds T of the privet-audit configs (the server asks for 2T).
PRIVET_ROUNDS = 2


def privet_sets(game: str, target: float) -> list[str]:
    """The run config (``--set`` values) whose mechanism is ``game``, calibrated to ``target``."""
    from privacy.calibration import noise_multiplier_for

    common = ["budget-distribution=constant", f"num-server-rounds={PRIVET_ROUNDS}"]
    if game == "secure-sum":  # a common σ sent: the one whose sum of r_min = m = 4 shares charges the target
        sigma = noise_multiplier_for(target, 1e-5, 1.0, PRIVET_ROUNDS, accountant="prv")
        return [*common, f"epsilon={target * 1.001}", "strategy=fedavg", "dp-mode=update",
                "secure-aggregation=secagg+", "noise-shares=4", f"noise-multiplier={sigma}"]
    if game == "ddg-sum":  # σ whose RDP charge (σ_eq = σ at r_min = m = 4) over T rounds is the target
        sigma = noise_multiplier_for(target, 1e-5, 1.0, PRIVET_ROUNDS, accountant="rdp")
        return [*common, f"epsilon={target * 1.01}", "strategy=fedavg", "dp-mode=update", "accountant=rdp",
                "secure-aggregation=secagg+ddg", "noise-shares=4", f"noise-multiplier={sigma}"]
    common.append(f"epsilon={target}")
    if game == "centroids":  # DP-FedC, rigorous calibration of z to the budget over T rounds
        return [*common, "strategy=dpfedc"]
    if game == "group-sum":  # one group, every member in every round (q = 1): the T cap is what binds
        return [*common, "strategy=gdpfed", "gdpfed.group-epsilons='0.5'", "gdpfed.q=1.0", "num-clients=4"]
    return [*common, f"dp-mode={'dpsgd' if game in ('dpsgd', 'dpsgd-steps') else 'update'}"]


def _by_game(game: str, sets: list[str], canaries: int, seed: int) -> Any:
    """A game that ``privet audit`` does not select, run as it runs a selected one (its Game, then the statistics)."""
    import importlib
    import time

    import numpy as np

    from privacy.mechanism_audit import assess
    from privet.audit_cmd import MechanismAudit
    from privet.audit_setup import setup
    from privet.run_config import load_experiment, validate

    module, attribute = BY_GAME[game].split(":")
    chosen = getattr(importlib.import_module(module), attribute)
    run_config = load_experiment(None, sets, None)
    validate(run_config)
    s = setup(run_config, 0)
    started = time.perf_counter()
    played = chosen.run(s, canaries=canaries, extension=2, rng=np.random.default_rng(seed))
    result = assess(played.observation, chosen.name, delta=s.profile.delta, accountant=played.accountant,
                    started=started)
    return MechanismAudit(
        game=chosen.name, level=chosen.level, mechanism=played.mechanism, observes=chosen.observes, result=result,
        noise_multiplier=float(played.noise_multiplier), sample_rate=float(played.sample_rate), clip=float(played.clip),
        steps=int(played.steps), rounds_declared=s.train.num_rounds, rounds_requested=int(played.rounds_requested),
        releases_per_canary=int(played.releases_per_canary), noise_source=s.profile.noise_source,
        details=played.details)


def run_privet(targets: list[float], games: list[str], scale: float, seed: int) -> list[dict[str, Any]]:
    """One record per (game, target) through ``privet audit``'s Python API."""
    from privet.audit_cmd import audit as privet_audit

    records = []
    for game in games:
        for target in targets:
            sets = privet_sets(game, target)
            canaries = int(PRIVET_CANARIES[game] * scale)
            if game in BY_GAME:
                a = _by_game(game, sets, canaries, seed)
            else:
                (a,) = privet_audit(None, sets, canaries=canaries, seed=seed).audits
            assert a.game == game, (a.game, game)
            record = {**a.to_dict(), "target_epsilon": target, "set": sets}
            print(json.dumps({k: record[k] for k in ("game", "target_epsilon", "lower_bound", "charged_epsilon",
                                                      "flagged", "seconds")}), flush=True)
            records.append(record)
    return records


def _ratio(a: float, b: float) -> str:
    if b == 0 or not math.isfinite(b):
        return "–"
    return "∞" if math.isinf(a) else f"{a / b:.2f}"


def _num(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.2f}"


def table(meta: dict[str, Any], records: list[dict[str, Any]], privet_records: list[dict[str, Any]] | None = None) -> str:
    """The markdown report, generated from the records."""
    honest = [r for r in records if r["defect"] == "honest"]
    broken = [r for r in records if r["defect"] != "honest"]
    lines = [
        f"# Audit tightness: empirical ε / charged ε ({meta['when']}, load {meta['load']:.2f}, seed {meta['seed']})",
        "",
        "White-box games of `privacy/mechanism_audit.py`; δ = 1e-5; charge and calibration by privet's `prv` "
        "accountant under replace-one; noise from privet's `csprng` source. *Lower bound*: the larger of Steinke "
        "et al.'s one-run bound and the threshold test's (Clopper–Pearson) bound, 95 % together. *One-shot*: "
        "Andrew et al.'s estimate (cosines, a Gaussian fit; not a bound). Generated from "
        "`audit_tightness.json` by `benchmarks/bench_audit_tightness.py`.",
        "",
        "## Honest mechanisms",
        "",
        "| mechanism | target ε | charged ε | canaries | releases | one-run LB | threshold LB | LB / charged "
        "| one-shot ε | one-shot / charged | flagged | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in honest:
        lines.append(f"| {r['mechanism']} | {r['target_epsilon']:g} | {r['charged_epsilon']:.3f} | {r['canaries']:,} "
                     f"| {r['releases']:,} | {r['one_run_bound']:.2f} | {r['threshold_bound']:.2f} "
                     f"| {_ratio(r['lower_bound'], r['charged_epsilon'])} | {_num(r['one_shot_epsilon'])} "
                     f"| {_ratio(r['one_shot_epsilon'], r['charged_epsilon'])} | {'yes' if r['flagged'] else 'no'} "
                     f"| {r['seconds']:.1f} |")
    lines += [
        "",
        "## Broken mechanisms (test-only defects)",
        "",
        "*Where*: the δ' at which the empirical curve (the threshold test's rate bounds, valid for every δ' "
        "at once) exceeds the accountant's ε(δ') of the charged history by the most.",
        "",
        "| mechanism | defect | target ε | charged ε | canaries | LB at δ | LB / charged | flagged | where: δ', "
        "empirical ε > charged ε | one-shot ε | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in broken:
        v = r["violation"]
        where = f"{v[0]:g}: {v[1]:.2f} > {v[2]:.2f}" if v else "–"
        lines.append(f"| {r['mechanism']} | {r['defect']} | {r['target_epsilon']:g} | {r['charged_epsilon']:.3f} "
                     f"| {r['canaries']:,} | {r['lower_bound']:.2f} | {_ratio(r['lower_bound'], r['charged_epsilon'])} "
                     f"| {'**yes**' if r['flagged'] else 'no'} | {where} | {_num(r['one_shot_epsilon'])} "
                     f"| {r['seconds']:.1f} |")
    if privet_records:
        lines += [
            "",
            f"## `privet audit`: each mechanism as a run config uses it (last rows run {meta.get('privet_when', '?')})",
            "",
            "Through privet's client mechanisms, the client's own calibration to a constant budget ε and its "
            f"ledger (`privet/audit_cmd.py`); T = {PRIVET_ROUNDS} declared, the server asks for 2T (the budget or "
            "GDPFed's T cap refuses the rest); the adversary sees what the threat model gives it: each upload "
            "(`update`), the sum of r_min = 4 shares (`secure-sum`), the group sum of r_m = 4 shares with q_m = 1, "
            "only the sums that hold the canary (`group-sum`), each round's model of one client whose 6,000 records "
            "are all canaries (`dpsgd`, record level: the steps inside a round are not seen, hence the wider gap), "
            "each DP-FedC upload (`centroids`, z calibrated to the budget), the decoded sum of r_min = m = 4 "
            "discrete Gaussian shares (`ddg-sum`, `secagg+ddg`, σ sent such that its RDP charge over T is the "
            "target; the charge converts through RDP), and, white-box beyond the threat model, every DP-SGD step's "
            "noisy clipped gradient sum of the same client with Dirac gradient canaries in all 6,000 records "
            "(`dpsgd-steps`, Nasr et al. 2023, through the client's own DP-SGD code; `privet audit --game "
            "dpsgd-steps`, the mechanism's default game being `dpsgd`). Noise `csprng`; 95 % together.",
            "",
            "| game | mechanism | target ε | charged ε | canaries | releases | one-run LB | threshold LB "
            "| LB / charged | one-shot ε | flagged | s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in privet_records:
            lb = float(r["lower_bound"])
            shot = float(r["one_shot_epsilon"])
            lines.append(f"| {r['game']} | {r['mechanism']} | {r['target_epsilon']:g} | {r['charged_epsilon']:.3f} "
                         f"| {r['canaries']:,} | {r['releases']:,} | {float(r['one_run_bound']):.2f} "
                         f"| {float(r['threshold_bound']):.2f} | {_ratio(lb, r['charged_epsilon'])} | {_num(shot)} "
                         f"| {'**yes**' if r['flagged'] else 'no'} | {r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the grid (or rebuild the table from records) and write both files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    parser.add_argument("--mechanisms", nargs="+", default=list(CANARIES))
    parser.add_argument("--defects", nargs="+", default=list(DEFECTS))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every canary count")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "audit_tightness.md",
                        help="the markdown table; the records go beside it (same name, .json)")
    parser.add_argument("--table-from", type=Path, help="rebuild the table from these records and exit")
    parser.add_argument("--privet", action="store_true",
                        help="run the privet-audit grid only (--games) and put its records in --out's JSON")
    parser.add_argument("--games", nargs="+", default=list(PRIVET_CANARIES), help="privet-audit games (--privet)")
    args = parser.parse_args()
    if args.privet:
        path = args.out.with_suffix(".json")
        data = json.loads(path.read_text())
        kept = [r for r in data.get("privet_records", []) if r["game"] not in args.games]  # other games' records
        new = run_privet(args.targets, args.games, args.scale, args.seed)
        order = list(PRIVET_CANARIES)
        data["privet_records"] = sorted(kept + new, key=lambda r: (order.index(r["game"]), r["target_epsilon"]))
        data["meta"]["privet_when"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}"
        path.write_text(json.dumps(data, indent=1))
        args.out.write_text(table(data["meta"], data["records"], data["privet_records"]))
        print(args.out.read_text())
        return
    if args.table_from:
        data = json.loads(args.table_from.read_text())
        args.out.write_text(table(data["meta"], data["records"], data.get("privet_records", [])))
        print(args.out.read_text())
        return
    meta = {"when": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "load": os.getloadavg()[0], "seed": args.seed,
            "scale": args.scale}
    records = run(args.targets, args.mechanisms, args.defects, args.scale, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    args.out.write_text(table(meta, records))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
