"""``privet audit`` of GDPFed / GDPFed+ on ``secagg+ddg`` (issues 37 and 39): the ``group-ddg-sum`` game.

Each group's round is one distributed discrete Gaussian secure sum, and each member charges its group's
run once by a curve step (:class:`privacy.poisson_rdp.DDGPoissonStep`: KLS's RDP bound at the sum's
parameters, amplified by Poisson sampling at q_m), kept in the ledger's ``curves`` beside the Gaussian
``history``. The audit once read the Gaussian history only, so an honest group was flagged against a
charge of ε = 0, and it ran the ``ddg-sum`` game (every canary in every round) rather than the group's
mechanism. Here: the honest command is not flagged and its charge is the curve step's ε, computed twice
apart from the audit (a ledger charged the step the sum's parameters give, and dp-accounting's RDP
conversion of T times the step's curve); a group whose discrete Gaussian shares carry a sixteenth of the
variance they charge is flagged, and so is one whose noise the server regenerates from the run seed; the
``ddg-sum`` game of a plain secure sum is still not flagged when honest.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from privacy.accountants import epsilon_of
from privacy.ledger import GROUP_DDG_MODE, PrivacyLedger
from privacy.mechanism_audit import AuditResult
from privacy.mechanisms import DDGSum, GroupDiscreteGaussianShare, Mechanism
from privacy.poisson_rdp import CURVE_ORDERS, DDGPoissonStep
from privet.audit_cmd import audit
from privet.audit_ddg import ddg_sum_parameters
from privet.audit_games import STAND_IN_DIM
from privet.audit_setup import setup
from privet.cli import main
from privet.run_config import load_experiment, validate

#: The command of the defect report: GDPFed+ on secagg+ddg, budgets by groups (client 0: ε = 0.5, q_m = 0.01).
GDPFED_PLUS_DDG = ["strategy=gdpfed-plus", "secure-aggregation=secagg+ddg", "budget-distribution=groups",
                   "num-clients=300", "accountant=rdp"]
#: One GDPFed group of both clients, each in every round (q_m = 1, r_m = 2), ε = 1 over T = 1 round.
GROUP_Q1 = ["strategy=gdpfed", "budget-distribution=constant", "epsilon=1.0", "gdpfed.group-epsilons='0.5'",
            "gdpfed.q=1.0", "num-server-rounds=1", "num-clients=2", "secure-aggregation=secagg+ddg",
            "accountant=rdp"]
#: A plain secagg+ddg sum of r_min = m = 4 shares, σ = 1.6 sent (the ``ddg-sum`` game).
PLAIN_DDG = ["strategy=fedavg", "dp-mode=update", "secure-aggregation=secagg+ddg", "noise-multiplier=1.6",
             "noise-shares=4", "accountant=rdp", "num-server-rounds=1", "budget-distribution=constant",
             "epsilon=20.0"]


def _bound_beside_charge(result: AuditResult, name: str) -> None:
    line = result.line()
    assert line.startswith(("FLAGGED " if result.flagged else "ok ") + f"{name}:"), line
    assert f">= {result.lower_bound:.3f}" in line and f"charged eps = {result.charged_epsilon:.3f}" in line


def _expected_step(sets: list[str]) -> tuple[DDGPoissonStep, float]:
    """The curve step a member of client 0's group sum charges, from the run config apart from the game; δ."""
    run_config = load_experiment(None, sets, None)
    validate(run_config)
    s = setup(run_config, 0)
    floor = int(s.secure_floor)
    p = ddg_sum_parameters(s, floor, STAND_IN_DIM)
    step = DDGPoissonStep(float(p.local_sigma_sq), int(p.norm_bound_sq), int(p.padded_dim), floor,
                          max(floor, int(p.max_members)), float(s.train.group_sample_rate), int(s.train.num_rounds))
    return step, float(s.profile.delta)


def test_the_gdpfed_plus_ddg_command_is_not_flagged_and_charges_the_curve_step():
    """The defect's command: group-ddg-sum runs, is not flagged, and its charge is the canary's ledger's ε > 0."""
    report = audit(None, GDPFED_PLUS_DDG, canaries=200, seed=11)
    (a,) = report.audits
    assert (a.game, a.mechanism, a.level) == ("group-ddg-sum", GroupDiscreteGaussianShare.kind, "client")
    assert not a.flagged and not report.flagged, a.line()
    _bound_beside_charge(a.result, "group-ddg-sum")
    step, delta = _expected_step(GDPFED_PLUS_DDG)
    assert step.sample_rate < 1 and a.sample_rate == step.sample_rate and a.steps == step.count
    assert a.result.history == (step,)  # the whole run's curve step, paid once, and nothing else
    ledger = PrivacyLedger(0.5, delta, accountant="rdp")  # a ledger charged that step, as a member's is
    ledger.record_release([step], server_round=1, run_id=1, mode=GROUP_DDG_MODE)
    by_rdp = float(compute_epsilon(list(CURVE_ORDERS), list(step.count * step.rdp(CURVE_ORDERS)), delta)[0])
    assert a.result.charged_epsilon > 0.05
    assert a.result.charged_epsilon == pytest.approx(ledger.spent(), rel=1e-9)
    assert a.result.charged_epsilon == pytest.approx(by_rdp, rel=1e-9)
    assert a.releases_per_canary <= step.count and a.rounds_requested == 2 * step.count
    assert "Poisson-sampled at q=0.01" in a.result.describe_charges()
    assert a.result.charged_history() == [step.to_dict()]
    assert "group-ddg-sum" in "\n".join(report.lines())


def test_the_command_writes_the_curve_step_into_audit_json(tmp_path, capsys):
    """privet audit --out: exit 0, the report names the game, audit.json holds the step as a ledger file does."""
    out = tmp_path / "audit"
    args = [arg for v in GROUP_Q1 for arg in ("--set", v)]
    rc = main(["audit", *args, "--canaries", "40", "--extension", "1", "--seed", "2", "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "ok group-ddg-sum:" in printed.out
    (record,) = json.loads((out / "audit.json").read_text())["audits"]
    step, delta = _expected_step(GROUP_Q1)
    assert record["game"] == "group-ddg-sum" and record["charged_history"] == [step.to_dict()]
    assert record["charged_epsilon"] == pytest.approx(epsilon_of([step], delta, "rdp"), rel=1e-9)


class QuietShares(GroupDiscreteGaussianShare):
    """Test-only: each discrete Gaussian share with a sixteenth of its σ² (a quarter σ), charged as the honest one."""

    def __init__(self, honest: GroupDiscreteGaussianShare) -> None:
        p = honest.ddg.params
        super().__init__(honest.clip, honest.noise_multiplier, sample_rate=honest.sample_rate, rounds=honest.rounds,
                         noise_shares=honest.noise_shares, min_survivors=honest.min_survivors,
                         ddg=DDGSum(replace(p, local_sigma_sq=p.local_sigma_sq / 16), honest.ddg.rotation_seed))
        self.step = honest.step  # the charge of the honest share


def quiet_shares(mechanism: Mechanism) -> Mechanism:
    assert type(mechanism) is GroupDiscreteGaussianShare
    return QuietShares(mechanism)


def test_a_group_sum_with_too_little_discrete_noise_for_its_charge_is_flagged():
    """q_m = 1: the honest group sum is not flagged, the one with shares at a quarter σ is (the same charge).

    KLS's bound converted through RDP is loose, so a share with half its σ² stays under it at a
    thousand canaries; a quarter σ does not.
    """
    honest = audit(None, GROUP_Q1, canaries=1000, extension=1, seed=5).audits[0]
    assert (honest.game, honest.mechanism) == ("group-ddg-sum", "group-ddg")
    assert not honest.flagged, honest.line()
    broken = audit(None, GROUP_Q1, canaries=1000, extension=1, seed=5, mechanism_hook=quiet_shares).audits[0]
    assert broken.flagged, broken.line()
    assert broken.result.charged_epsilon == pytest.approx(honest.result.charged_epsilon)
    assert honest.result.charged_epsilon == pytest.approx(1.0, rel=1e-2)  # the group's calibration to its budget
    assert broken.result.lower_bound > honest.result.lower_bound
    _bound_beside_charge(honest.result, "group-ddg-sum")
    _bound_beside_charge(broken.result, "group-ddg-sum")


def test_a_group_sum_whose_shares_the_server_can_regenerate_is_flagged():
    """noise-source = seeded: the server regenerates every member's discrete Gaussian share and subtracts it."""
    (a,) = audit(None, [*GROUP_Q1, "noise-source=seeded"], canaries=200, extension=1, seed=3).audits
    assert a.game == "group-ddg-sum" and a.flagged, a.line()


def test_the_plain_ddg_sum_is_still_not_flagged_when_honest():
    """The ddg-sum game of a plain secure sum: a Gaussian step (σ_eq, 1, 1), charged as the ledger converts it."""
    (a,) = audit(None, PLAIN_DDG, canaries=200, extension=1, seed=7).audits
    assert (a.game, a.mechanism) == ("ddg-sum", "secure-ddg")
    assert not a.flagged, a.line()
    (step,) = a.result.history
    assert not isinstance(step, DDGPoissonStep) and step[1:] == (1.0, 1)
    assert a.result.charged_epsilon == pytest.approx(epsilon_of([step], a.result.delta, "rdp"))
    assert a.result.charged_epsilon > 1.0
    assert a.result.describe_charges().startswith("Gaussian (sigma=")
    _bound_beside_charge(a.result, "ddg-sum")
