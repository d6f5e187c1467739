"""The two runtimes' records of an audited mechanism say the same thing for the same numbers.

``privet audit`` keeps a canary game's result in :class:`privet.audit_cmd.MechanismAudit` and a real
run's view in :class:`privet.audit_flower_report.FlowerAudit`; both are :class:`server.audit_text.AuditRecord`.
Given one :class:`privacy.mechanism_audit.AuditResult` (from the real statistics on a synthetic
observation, one that refutes its charge and one that does not) and the same σ, C, releases and
noise source, the flag and the line are equal, every key their ``audit.json`` records share holds
the same value (those keys being at least the result's figures and the shared parameters), and
their ``summary.json`` entries differ only in the name of what ran them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from privacy.mechanism_audit import Observation, assess
from privet.audit_cmd import AuditReport, MechanismAudit
from privet.audit_flower_report import VIEW_OBSERVES, FlowerAudit, FlowerAuditReport

#: What the ledger charged for one canary: one Gaussian release, σ = 1.2, q = 1.
HISTORY = ((1.2, 1.0, 1),)


def _result(signal: float, seed: int):
    """The real statistics on 400 canaries whose score is S·signal plus unit Gaussian noise."""
    rng = np.random.default_rng(seed)
    secrets = rng.choice(np.array([-1, 1]), size=400)
    scores = secrets * signal + rng.normal(size=400)
    cosines = np.tanh(scores / 10)
    return assess(Observation(secrets, scores, cosines, HISTORY, "replace-one", 1), "update (upload)",
                  delta=1e-5, accountant="prv")


@pytest.mark.parametrize(("signal", "flagged"), [(0.5, False), (12.0, True)])
def test_both_records_of_one_result_agree(signal, flagged):
    result = _result(signal, seed=7)
    assert result.flagged is flagged  # the two cases this test is about: a refuted charge and an unrefuted one
    shared = {"mechanism": "update", "result": result, "noise_multiplier": 1.2, "clip": 1.0,
              "releases_per_canary": 1, "noise_source": "csprng"}
    game = MechanismAudit(**shared, game="update", level="client", observes=VIEW_OBSERVES["upload"], sample_rate=1.0,
                          steps=1, rounds_declared=1, rounds_requested=2)
    view = FlowerAudit(**shared, view="upload", rounds=1)

    assert game.flagged is view.flagged is flagged and game.line() == view.line() == result.line()
    a, b = game.to_dict(), view.to_dict()
    common = a.keys() & b.keys()
    assert common >= {*game.result_record(), "mechanism", "level", "observes", "noise_multiplier", "clip",
                      "releases_per_canary", "noise_source"}
    assert {k: a[k] for k in common} == {k: b[k] for k in common}
    json.dumps([a, b], allow_nan=False)  # JSON-safe: an infinite bound is written "inf", never Infinity

    (entry_a,) = AuditReport("fedavg", "update", 0, 6.0, (game,)).summary_section()["mechanisms"]
    (entry_b,) = FlowerAuditReport("fedavg", "update", 0, 6.0, 3, 400, (view,), (6.0,), 1.0,
                                   "(temporary)").summary_section()["mechanisms"]
    assert (entry_a.pop("game"), entry_b.pop("game")) == ("update", "real run, upload view")
    assert entry_a == entry_b
    assert (entry_a["lower_bound"], entry_a["charged_epsilon"]) == (a["lower_bound"], a["charged_epsilon"])
