"""``privet audit`` (issue 37, phase 2): the run config's mechanisms audited on canaries, beside their charge.

Every audit here runs real statistics on privet's own client mechanisms (nothing hard-coded): an
honest mechanism must not be flagged, and its attack must see the canaries where the signal is
strong enough for a positive bound (so that a dead attack cannot pass); a broken one must be
flagged, with exit status 1 and one line naming the mechanism and both figures. The broken ones:
noise from a seed the server knows (``noise-source = "seeded"``, a real config option whose
reports void the guarantee), and, through test-only hooks on the mechanism the client round runs,
noise at half the calibrated σ, a charge for sensitivity C where replace-one has 2C, and a GDPFed
client that forgets the T releases it paid for while the server asks for 4T rounds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from privacy.accountants import epsilon_of
from privacy.calibration import noise_multiplier_for
from privacy.mechanisms import GroupShare, Mechanism, Release, WholeUpdate
from privet.audit_cmd import audit
from privet.cli import main

ROOT = Path(__file__).resolve().parents[2]

#: update mode, the default strategy, one round fewer than the default (fast).
UPDATE = ["dp-mode=update", "num-server-rounds=2"]
#: GDPFed with one group of ε = 4, every member in every round (q = 1: the T cap is what protects).
GDPFED = ["strategy=gdpfed", "budget-distribution=constant", "epsilon=4.0", "gdpfed.group-epsilons='0.5'",
          "gdpfed.q=1.0", "num-server-rounds=2", "num-clients=2"]
#: A secure sum of 4 shares, σ = 4 sent.
SECURE = ["strategy=fedavg", "dp-mode=update", "secure-aggregation=secagg+", "noise-multiplier=4.0",
          "noise-shares=4", "num-server-rounds=2"]


def _sets(values: list[str]) -> list[str]:
    return [arg for v in values for arg in ("--set", v)]


def test_the_honest_default_is_not_flagged(tmp_path, capsys):
    """The embedded default (DP-SGD, record level) exits 0 and writes audit.json with its charge.

    The charge is the client's own calibration: σ is the smallest its accountant accepts for the
    budget over T rounds of DP-SGD steps, so the ledger's ε is the budget (to calibration
    tolerance), and its history is T times (σ, q, steps).
    """
    out = tmp_path / "audit"
    rc = main(["audit", "--set", "num-server-rounds=1", "--canaries", "400", "--seed", "1", "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    report = json.loads((out / "audit.json").read_text())
    (record,) = report["audits"]
    assert (record["game"], record["level"], record["flagged"]) == ("dpsgd", "record", False)
    assert record["lower_bound"] <= record["charged_epsilon"]
    budget = report["epsilon_budget"]
    assert record["charged_epsilon"] == pytest.approx(budget, rel=1e-3) and record["charged_epsilon"] <= budget
    sigma, rate, steps = record["noise_multiplier"], record["sample_rate"], record["steps"]
    assert [list(s) for s in record["charged_history"]] == [[sigma, rate, steps]]
    assert sigma == pytest.approx(noise_multiplier_for(budget, record["delta"], rate, steps, accountant="prv"),
                                  rel=1e-9)
    assert record["line"] in printed.out and "observes:" in printed.out
    assert record["releases_per_canary"] == 1 and record["rounds_requested"] == 2  # the extra round is refused


def test_honest_update_mode_sees_its_canaries_and_is_not_flagged(tmp_path):
    """Client level: a positive lower bound below the charge, the charge from the client's calibration."""
    report = audit(None, UPDATE, out=tmp_path, canaries=600, seed=2)
    (a,) = report.audits
    assert (a.game, a.mechanism, a.level) == ("update", "update", "client")
    assert not a.flagged, a.line()
    assert 0.5 < a.result.lower_bound <= a.result.charged_epsilon
    assert a.result.charged_epsilon == pytest.approx(report.epsilon_budget, rel=1e-3)
    assert a.releases_per_canary == 2 and a.rounds_requested == 4  # the budget refuses the server's extra rounds
    assert a.result.charged_epsilon == pytest.approx(epsilon_of(list(a.result.history), a.result.delta, "prv"))


@pytest.mark.parametrize("sets", [UPDATE, SECURE, ["dp-mode=dpsgd", "num-server-rounds=1"]],
                         ids=["update", "secure-sum", "dpsgd"])
def test_noise_from_a_seed_the_server_knows_is_flagged_with_exit_status_1(sets, tmp_path, capsys):
    """noise-source = seeded: the server regenerates every client's noise from the run seed and subtracts it."""
    out = tmp_path / "audit"
    rc = main(["audit", *_sets([*sets, "noise-source=seeded"]), "--canaries", "300", "--seed", "3", "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("privet")]
    (record,) = json.loads((out / "audit.json").read_text())["audits"]
    assert rc == 1 and record["flagged"] and record["noise_source"] == "seeded"
    assert err == [f"privet: audit: {record['line']}"]
    assert err[0].startswith(f"privet: audit: FLAGGED {record['game']}:")
    assert f"charged eps = {record['charged_epsilon']:.3f}" in err[0] and f">= {record['lower_bound']:.3f}" in err[0]


def test_a_secure_sum_with_private_noise_is_not_flagged():
    """The same secure sum with privet's csprng: the server's replay explains nothing."""
    (a,) = audit(None, SECURE, canaries=300, seed=3).audits
    assert a.game == "secure-sum" and a.mechanism == "secure-share" and not a.flagged, a.line()
    assert a.releases_per_canary >= 2


class HalfSigma(WholeUpdate):
    """Test-only: adds noise at half the σ it reports and charges."""

    def privatize(self, received, trained, release, noise):
        return super().privatize(received, trained, replace(release, noise_multiplier=release.noise_multiplier / 2),
                                 noise)


class ChargesSensitivityC(WholeUpdate):
    """Test-only: charges as if the sensitivity were C: σ charged twice the σ it adds (relative to 2C)."""

    def charged(self, sigma: float) -> float:
        return 2 * super().charged(sigma)


@pytest.mark.parametrize("broken", [HalfSigma, ChargesSensitivityC], ids=["half-sigma", "sensitivity-C"])
def test_update_mode_with_too_little_noise_for_its_charge_is_flagged(broken):
    """At ε = 4, one round: the honest mechanism is not flagged, the broken ones are (the same canaries)."""
    sets = ["dp-mode=update", "num-server-rounds=1", "budget-distribution=constant", "epsilon=4.0"]

    def hook(mechanism: Mechanism) -> Mechanism:
        assert type(mechanism) is WholeUpdate
        return broken(mechanism.clip, mechanism.noise_multiplier, mechanism.calibration,
                      noise_shares=mechanism.noise_shares)

    honest = audit(None, sets, canaries=1000, seed=6).audits[0]
    flagged = audit(None, sets, canaries=1000, seed=6, mechanism_hook=hook).audits[0]
    assert not honest.flagged, honest.line()
    assert flagged.flagged, flagged.line()
    assert flagged.result.charged_epsilon == pytest.approx(4.0, rel=1e-3)  # both charge the budget
    assert flagged.result.lower_bound > honest.result.lower_bound


class ForgetsItsT(GroupShare):
    """Test-only: a GDPFed share that does not count its releases (the defect the T cap fixed)."""

    def release(self, sigma: float, index: int = 0) -> Release:
        return super().release(sigma, min(index, self.rounds - 1))


def forgets_its_t(mechanism: Mechanism) -> Mechanism:
    assert isinstance(mechanism, GroupShare)
    return ForgetsItsT(mechanism.clip, mechanism.noise_multiplier, sample_rate=mechanism.sample_rate,
                       rounds=mechanism.rounds, noise_shares=mechanism.noise_shares)


def test_gdpfed_refuses_a_run_extended_beyond_its_charged_t():
    """The server asks for 4T rounds: the honest share releases T and is not flagged; one that forgets T is."""
    honest = audit(None, GDPFED, canaries=600, extension=4, seed=4).audits[0]
    assert (honest.game, honest.mechanism) == ("group-sum", "group-share")
    assert not honest.flagged, honest.line()
    assert honest.releases_per_canary == 2 and honest.rounds_requested == 8
    broken = audit(None, GDPFED, canaries=600, extension=4, seed=4, mechanism_hook=forgets_its_t).audits[0]
    assert broken.flagged, broken.line()
    assert broken.releases_per_canary == 8
    assert broken.result.charged_epsilon == pytest.approx(honest.result.charged_epsilon)  # the same pre-charge
    assert broken.line().startswith("FLAGGED group-sum:")


def test_gdpfed_with_seeded_noise_is_flagged():
    """The group sum's every share regenerated from the run seed."""
    (a,) = audit(None, [*GDPFED, "noise-source=seeded"], canaries=300, seed=5).audits
    assert a.flagged and math.isinf(a.result.one_shot_epsilon), a.line()


@pytest.mark.parametrize(("args", "names"), [
    (["--set", "dp-mode=bogus"], "dp-mode"),
    (["--set", "no-such-key=1"], "no-such-key"),
    (["--canaries", "1"], "--canaries"),
    (["--client", "99"], "--client"),
])
def test_a_bad_config_gives_one_line_naming_the_key(args, names, capsys):
    rc = main(["audit", *args])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("privet")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("privet: error:") and names in err[0]


@pytest.mark.parametrize("command", [[str(Path(sys.executable).with_name("privet"))],
                                     [sys.executable, "-m", "privet.cli"]], ids=["privet", "python-m"])
def test_the_command_line_entry_points_exit_2_on_a_bad_config(command):
    """The installed `privet` command and `python -m privet.cli`, each in its own process: one line, status 2."""
    proc = subprocess.run([*command, "audit", "--set", "accountant=exact"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if line.startswith("privet:")] == [proc.stderr.strip()]
    assert "accountant" in proc.stderr and "Traceback" not in proc.stderr


def test_nothing_to_audit_is_said():
    """A non-private run: no game, and the report says why."""
    report = audit(None, ["strategy=fedavg", "dp-mode=none", "budget-distribution=none"])
    assert report.audits == () and any("nothing" in w or "no mechanism" in w for w in report.not_audited)
    assert not report.flagged
