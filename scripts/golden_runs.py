"""Record tiny, fully seeded runs of every strategy, to prove a restructuring changes no behaviour.

Each case runs the real ServerApp body and the real ClientApp on the in-process grid with
``noise-source = "seeded"`` (every DP draw reproducible) and records, per round, the accuracy
and loss the server measured, and per client the ε its ledger reports. Two trees that give the
same file behave the same on these cases::

    python scripts/golden_runs.py --out before.json         # on the old tree
    python scripts/golden_runs.py --out after.json          # on the new one
    python scripts/golden_runs.py --compare before.json after.json

This is a tool for one comparison, not a test: the file it writes is what the code did, not
what it should do (a deliberate change of behaviour changes it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: case name -> run-config overrides on top of :func:`tiny`.
CASES: dict[str, dict[str, Any]] = {
    "fedavg-hdp": {},
    "fedavg-hdp-run-epsilon": {"run-epsilon": 1.0},
    "fedavg-hdp-local-steps": {"local-steps": 3},
    "fedavg": {"strategy": "fedavg", "budget-distribution": "none"},
    "udp-fedavg": {"strategy": "udp-fedavg"},
    "udp-fedavg-shares": {"strategy": "udp-fedavg", "noise-multiplier": 2.0, "noise-shares": 3},
    "udp-fedavg-secagg": {"strategy": "udp-fedavg", "noise-multiplier": 4.0, "noise-shares": 4, "num-clients": 4,
                          "min-train-clients": 4, "epsilon-min": 20.0, "epsilon-max": 30.0,
                          "secure-aggregation": "secagg+"},
    "minimum": {"strategy": "minimum"},
    "maximum": {"strategy": "maximum"},
    "weiavg": {"strategy": "weiavg"},
    "pfa": {"strategy": "pfa", "budget-distribution": "mixgauss1", "num-clients": 5, "min-train-clients": 5,
            "pfa.public-fraction": 0.4},
    "pfa-plus": {"strategy": "pfa-plus", "budget-distribution": "mixgauss1", "num-clients": 5,
                 "min-train-clients": 5, "pfa.public-fraction": 0.4},
    "pfa-closed-form": {"strategy": "pfa", "budget-distribution": "mixgauss1", "num-clients": 5,
                        "min-train-clients": 5, "pfa.public-fraction": 0.4, "calibration": "pfa-closed-form"},
    "fedceo": {"strategy": "fedceo", "dp-mode": "update", "model": "mlp2", "num-clients": 4,
               "fedceo.interval": 1},
    "ppsgd": {"strategy": "ppsgd", "model": "mlp2", "client-evaluation": "on"},
    "ppsgd-dpsgd": {"strategy": "ppsgd", "dp-mode": "dpsgd", "model": "mlp2", "client-evaluation": "on"},
    "centaur": {"strategy": "centaur", "model": "mlp2", "client-evaluation": "on"},
}

GDPFED: dict[str, Any] = {"num-clients": 30, "budget-distribution": "groups", "num-server-rounds": 3,
                          "max-examples-per-client": 32, "batch-size": 8, "gdpfed.q": 0.2, "accountant": "rdp"}
for name in ("dp-fedavg", "gdpfed", "gdpfed-op", "gdpfed-plus", "idp-fedavg-scale", "idp-fedavg-sample",
             "pfa-groups"):
    CASES[name] = {**GDPFED, "strategy": name}
CASES["gdpfed-plus-secagg"] = {**GDPFED, "strategy": "gdpfed-plus", "secure-aggregation": "secagg+"}

DPFEDC: dict[str, Any] = {"strategy": "dpfedc", "num-clients": 4, "num-server-rounds": 3, "batch-size": 20,
                          "fraction-train": 0.5, "epsilon": 20.0, "clip": 4.0,
                          "dpfedc.dataset": "fashion-mnist", "dpfedc.num-samples": 600,
                          "dpfedc.eval-samples": 200, "dpfedc.planned-rounds": 3}
CASES["dpfedc"] = DPFEDC
CASES["dpfedc-paper"] = {**DPFEDC, "dpfedc.calibration": "paper", "dpfedc.grad-clip": 40.0}
CASES["dpfedc-none"] = {**DPFEDC, "dp-mode": "none", "budget-distribution": "none"}


def tiny(out: Path) -> dict[str, Any]:
    """The app's defaults shrunk to a seconds-long run, with seeded DP noise."""
    from privet.cli import app_defaults

    cfg = app_defaults()
    cfg.update({"num-clients": 3, "num-server-rounds": 2, "max-examples-per-client": 256, "model": "logreg",
                "batch-size": 32, "learning-rate": 0.1, "momentum": 0.0, "min-train-clients": 1,
                "noise-source": "seeded", "out-dir": str(out / "results"), "ledger-dir": str(out / "ledgers")})
    return cfg


def run_case(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """One case: accuracy and loss per round, each client's ε, the failed rounds."""
    import secrets
    from unittest import mock

    import numpy as np

    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    # what is random on purpose outside the clients' seeded noise, fixed for the comparison: GDPFed's
    # sampling (a CSPRNG) and Flower's stochastic rounding in secure sums (numpy's global generator)
    np.random.seed(0)
    with tempfile.TemporaryDirectory(prefix=f"golden-{name}-") as tmp, \
            mock.patch.object(secrets, "randbits", lambda bits: 12345):
        cfg = {**tiny(Path(tmp)), **overrides}
        grid = InProcessGrid(client_app, simulation_node_configs(int(cfg["num-clients"])), cfg)
        try:
            summary = run_experiment(grid, cfg, run_id=1)
            status = "completed"
        except Exception as exc:  # noqa: BLE001 - a failed run is a behaviour to compare too
            status = f"{type(exc).__name__}: {str(exc).replace(tmp, '<tmp>')[:200]}"
            written = Path(cfg["out-dir"]) / "summary.json"
            if not written.exists():  # refused before the run started
                return {"status": status, "rounds": [], "clients": {}, "failed_rounds": None}
            summary = json.loads(written.read_text())
        lines = (Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()
        rounds = [json.loads(x) for x in lines]
    return {
        "status": status,
        "rounds": [{k: r.get(k) for k in ("round", "accuracy", "loss", "accepted", "rejected", "dropped")}
                   for r in rounds],
        "clients": {str(c["client_id"]): [c.get("epsilon_spent"), c.get("rounds_joined")]
                    for c in summary["clients"]},
        "failed_rounds": summary.get("failed_rounds"),
    }


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The cases whose records differ, with the first difference."""
    out = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a != b:
            out.append(f"{name}: {json.dumps(a)[:300]}\n    != {json.dumps(b)[:300]}")
    return out


def main() -> int:
    """Record the cases (``--out``) or compare two records (``--compare A B``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--compare", nargs=2, type=Path)
    args = parser.parse_args()
    if args.compare:
        diffs = compare(*(json.loads(p.read_text()) for p in args.compare))
        print("\n".join(diffs) if diffs else "identical")
        return 1 if diffs else 0
    import logging

    logging.disable(logging.WARNING)
    records = {}
    for name in args.only or CASES:
        records[name] = run_case(name, CASES[name])
        print(name, records[name]["status"], [r["accuracy"] for r in records[name]["rounds"]], flush=True)
    text = json.dumps(records, indent=1, sort_keys=True)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
