"""RDP and PLD accounting run without importing ``opacus`` (#38, item 2: a tiny run under 5 s).

``privacy.accountants`` executes Opacus' ``accountants/analysis/rdp.py`` as a module of its own, so a
client that calibrates σ and charges its ledger does not pay for Opacus' PrivacyEngine, optimizers and
``torch.distributed`` (about 1 s). Two properties: in a fresh interpreter, calibration and ε under every
replace-one accountant leave ``opacus`` and ``torch`` unimported; and the figures equal those computed
through Opacus' own package import (``opacus.accountants.analysis.rdp``), in a second fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
if sys.argv[1] == "opacus-first":
    from privacy.accountants import import_opacus
    import_opacus()
    import opacus.accountants.analysis.rdp
from privacy.accountants import epsilon_of
from privacy.calibration import noise_multiplier_for
history = [(1.1, 0.01, 300), (0.8, 1.0, 2)]
figures = {
    "rdp": epsilon_of(history, 1e-5, accountant="rdp"),
    "prv": epsilon_of(history, 1e-5, accountant="prv"),
    "add-remove-rdp": epsilon_of(history, 1e-5, accountant="rdp", relation="add-remove"),
    "sigma-rdp": noise_multiplier_for(3.0, 1e-5, 0.02, 100, accountant="rdp"),
    "sigma-prv": noise_multiplier_for(3.0, 1e-5, 0.02, 100, accountant="prv"),
}
heavy = sorted({name.split(".")[0] for name in sys.modules} & {"opacus", "torch"})
print(json.dumps({"figures": figures, "heavy": heavy}))
"""


def _probe(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_replace_one_accounting_imports_neither_opacus_nor_torch_and_agrees_with_opacus_import():
    alone, through_opacus = _probe("alone"), _probe("opacus-first")
    assert alone["heavy"] == [], f"accounting imported {alone['heavy']}"
    assert "opacus" in through_opacus["heavy"]  # the second computation really went through Opacus' package
    assert alone["figures"] == through_opacus["figures"]
    assert all(0 < value < float("inf") for value in alone["figures"].values()), alone
