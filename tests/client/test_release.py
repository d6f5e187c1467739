"""One privacy core (client/release.py): the ClientApp's round and ``privet audit`` release through the same code.

The audit is worth something only if it measures the release the ClientApp makes. The first
test follows the budget check and the charge (``PrivacyLedger.would_exceed_release`` and
``record_release``) to the code that calls them, in a real in-process run through privet's
ClientApp and in ``privet audit``'s canary clients: both must be ``release_once``'s, so a copy
of the steps in either place (the drift this core exists to prevent) fails it. The others are
the core's own guarantees: nothing released uncharged, nothing charged unreleased, and a
refusal before the run builds no work.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from client.app import app as client_app
from client.release import Refused, Released, client_release, release_once
from privacy.ledger import PrivacyLedger
from privacy.mechanisms import Calibration, Upload, WholeUpdate
from privacy.randomness import noise_source
from privet.audit_cmd import audit
from privet.audit_games import CanaryWork
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys
from protocol.errors import ERROR_BUDGET, ERROR_REFUSED, ERROR_STALE
from protocol.site import SiteFloors
from server.app import run_experiment


def _spy(monkeypatch) -> list[tuple[str, object]]:
    """Each budget check and charge on any ledger, with the code object that made it."""
    calls: list[tuple[str, object]] = []
    check, charge = PrivacyLedger.would_exceed_release, PrivacyLedger.record_release

    def spied_check(self, *args, **kwargs):
        calls.append(("check", sys._getframe(1).f_code))
        return check(self, *args, **kwargs)

    def spied_charge(self, *args, **kwargs):
        calls.append(("charge", sys._getframe(1).f_code))
        return charge(self, *args, **kwargs)

    monkeypatch.setattr(PrivacyLedger, "would_exceed_release", spied_check)
    monkeypatch.setattr(PrivacyLedger, "record_release", spied_charge)
    return calls


def test_the_client_round_and_the_audit_check_and_charge_in_the_same_function(run_config_factory, monkeypatch):
    calls = _spy(monkeypatch)
    cfg = run_config_factory(dp_mode="update", num_server_rounds=1, num_clients=2)
    summary = run_experiment(InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg), cfg,
                             run_id=1)
    in_round = list(calls)
    calls.clear()
    audit(None, ["dp-mode=update", "num-server-rounds=1"], canaries=20, seed=0)
    in_audit = list(calls)
    assert all(c["epsilon_spent"] > 0 for c in summary["clients"])  # the ClientApp did release and charge
    assert {kind for kind, _ in in_round} == {kind for kind, _ in in_audit} == {"check", "charge"}
    assert {code for _, code in in_round} == {code for _, code in in_audit} == {release_once.__code__}


def _mechanism(sigma: float = 2.0) -> WholeUpdate:
    return WholeUpdate(1.0, sigma, Calibration(2, 0.0, "accountant"))


def _work():
    return CanaryWork([np.zeros(4)], [np.full(4, 3.0)])


def test_a_stale_release_is_discarded_uncharged_and_a_fresh_one_charged_once():
    ledger = PrivacyLedger(8.0, 1e-5)
    stale = release_once(_mechanism(), ledger, client_id="c", run_id=1, server_round=1, work=_work,
                         noise=lambda: noise_source("csprng"), prepare=lambda u: u, stale=lambda: "too late")
    assert stale == Refused(ERROR_STALE, "too late") and ledger.history == [] and ledger.spent() == 0
    done = release_once(_mechanism(), ledger, client_id="c", run_id=1, server_round=1, work=_work,
                        noise=lambda: noise_source("csprng"), prepare=lambda u: u)
    assert isinstance(done, Released) and done.spent_before == 0
    assert list(ledger.history) == list(done.release.charges) and ledger.spent() > 0
    assert np.linalg.norm(done.upload.arrays[0]) > 0 and isinstance(done.prepared, Upload)


def test_a_refusal_before_the_run_builds_no_work_and_charges_nothing():
    built: list[int] = []

    def work():
        built.append(1)
        return _work()

    floors = SiteFloors(min_noise_multiplier=100.0)
    ledger = PrivacyLedger(8.0, 1e-5)
    floor = release_once(_mechanism(), ledger, client_id="c", run_id=1, server_round=1, work=work,
                         noise=lambda: noise_source("csprng"), prepare=lambda u: u, floors=floors)
    assert isinstance(floor, Refused) and floor.code == ERROR_REFUSED and floor.reason.startswith(keys.SITE_FLOOR)
    tiny = PrivacyLedger(1e-6, 1e-5)
    broke = release_once(_mechanism(0.5), tiny, client_id="c", run_id=1, server_round=1, work=work,
                         noise=lambda: noise_source("csprng"), prepare=lambda u: u)
    assert isinstance(broke, Refused) and broke.code == ERROR_BUDGET
    assert broke.reason.startswith(f"{keys.BUDGET_EXHAUSTED}: client c")
    assert built == [] and ledger.history == [] and tiny.history == []


def test_the_audits_client_releases_until_its_budget_would_be_exceeded_then_refuses():
    """client_release (the audit's entry) on a fixed σ: it charges each release until the next would exceed."""
    mechanism = _mechanism(8.0)  # about eps 0.35 a release at budget 4: 11 releases, then refusals
    ledger = PrivacyLedger(4.0, 1e-5)
    made = []
    for t in range(1, 20):
        done = client_release(mechanism, ledger, run_id=1, server_round=t, work=_work(), noise=noise_source("csprng"))
        made.append(done is not None)
    assert made == sorted(made, reverse=True) and 0 < sum(made) < len(made)  # releases, then only refusals
    assert ledger.spent() <= 4.0 and math.isfinite(ledger.spent())
    assert ledger.releases_in_run(1) == sum(made)


def test_training_that_diverges_is_released_and_charged_not_refused():
    """A refusal would tell whoever sees the reply that the client's data made training diverge (a bit
    outside every charge); the round releases the zero update under the same noise and charges it."""
    ledger = PrivacyLedger(8.0, 1e-5)
    diverged = CanaryWork([np.zeros(4)], [np.array([1.0, np.nan, 0.0, 2.0])])
    done = client_release(_mechanism(), ledger, run_id=1, server_round=1, work=diverged,
                          noise=noise_source("seeded", 3))
    assert done is not None
    upload, release = done
    zero = CanaryWork([np.zeros(4)], [np.zeros(4)])
    expected = _mechanism().run(zero, release, noise_source("seeded", 3))
    assert np.array_equal(upload.arrays[0], expected.arrays[0]) and np.isfinite(upload.arrays[0]).all()
    assert ledger.history and ledger.spent() > 0
