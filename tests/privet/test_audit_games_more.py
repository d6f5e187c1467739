"""``privet audit``'s games for DP-FedC's centroids, the secagg+ddg sum and DP-SGD per step (issue 37).

Each game runs privet's own client mechanism on canaries (nothing hard-coded): the honest one must
not be flagged and its attack must see the canaries (a positive lower bound, so a dead attack
cannot pass); the same game with noise at half the calibrated σ, injected through a test-only hook
on the mechanism the client round runs, must be flagged, with the same charge, in one line that
names the game and both figures. The charges are checked against an independent computation
(the calibration from the budget, KLS's bound for the discrete Gaussian sum).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from privacy.accountants import epsilon_of
from privacy.centroid_noise import rigorous_noise_multiplier
from privacy.ddg_accounting import ddg_epsilon
from privacy.mechanism_audit import AuditResult, assess
from privacy.mechanisms import DPSGD, CentroidRelease, DDGSum, Mechanism, SecureDiscreteGaussianShare
from privet.audit_cmd import audit
from privet.audit_ddg import ddg_sum_parameters
from privet.audit_dpsgd_steps import DPSGD_STEPS
from privet.audit_games import Played
from privet.audit_setup import setup
from privet.run_config import load_experiment, validate

#: DP-FedC, rigorous calibration to a constant budget ε = 4 over T = 1 round.
DPFEDC = ["strategy=dpfedc", "num-server-rounds=1", "budget-distribution=constant", "epsilon=4.0"]
#: A secagg+ddg sum of r_min = m = 4 shares, σ = 1.6 sent (charged ε about 6.1 through RDP).
DDG = ["strategy=fedavg", "dp-mode=update", "secure-aggregation=secagg+ddg", "noise-multiplier=1.6",
       "noise-shares=4", "accountant=rdp", "num-server-rounds=1", "budget-distribution=constant", "epsilon=20.0"]
#: DP-SGD on a shard of 1,000 records (60 clients), ε = 4 over T = 1 round: 16 steps at q = 1/16.
STEPS = ["dp-mode=dpsgd", "num-server-rounds=1", "budget-distribution=constant", "epsilon=4.0", "num-clients=60"]


def _bound_beside_charge(result: AuditResult, name: str) -> None:
    """The line names the game and both figures, as the report prints them."""
    line = result.line()
    assert line.startswith(("FLAGGED " if result.flagged else "ok ") + f"{name}:"), line
    assert f">= {result.lower_bound:.3f}" in line and f"charged eps = {result.charged_epsilon:.3f}" in line


# --------------------------------------------------------------------------- DP-FedC centroids
class HalfSigmaCentroids(CentroidRelease):
    """Test-only: adds noise at half the z it reports and charges."""

    def privatize(self, received, trained, release, noise, clip=None):
        return super().privatize(received, trained, replace(release, noise_multiplier=release.noise_multiplier / 2),
                                 noise, clip)


def half_sigma_centroids(mechanism: Mechanism) -> Mechanism:
    assert type(mechanism) is CentroidRelease
    return HalfSigmaCentroids(mechanism.clip, mechanism.noise_multiplier, mechanism.calibration,
                              paper=mechanism.paper)


def test_dpfedc_centroids_honest_is_not_flagged_and_half_sigma_is():
    """Canary clients with random-direction centroid updates; the server sees each upload."""
    honest = audit(None, DPFEDC, canaries=800, seed=7).audits[0]
    assert (honest.game, honest.mechanism, honest.level) == ("centroids", "centroids", "client")
    assert not honest.flagged, honest.line()
    assert 0.3 < honest.result.lower_bound <= honest.result.charged_epsilon
    (step,) = honest.result.history  # one release of (z, 1, 1): the client's own calibration to the budget
    assert step[0] == pytest.approx(rigorous_noise_multiplier(4.0, honest.result.delta, 1, accountant="prv"),
                                    rel=1e-6)
    assert honest.result.charged_epsilon == pytest.approx(epsilon_of([step], honest.result.delta, "prv"))
    assert honest.releases_per_canary == 1 and honest.rounds_requested == 2  # the budget refuses the extra round
    broken = audit(None, DPFEDC, canaries=800, seed=7, mechanism_hook=half_sigma_centroids).audits[0]
    assert broken.flagged, broken.line()
    assert broken.result.charged_epsilon == pytest.approx(honest.result.charged_epsilon)
    _bound_beside_charge(honest.result, "centroids")
    _bound_beside_charge(broken.result, "centroids")


def test_dpfedc_centroids_from_a_seed_the_server_knows_are_flagged():
    """noise-source = seeded: the server regenerates each upload's noise from the run seed."""
    (a,) = audit(None, [*DPFEDC, "noise-source=seeded"], canaries=200, seed=3).audits
    assert a.game == "centroids" and a.flagged, a.line()


# --------------------------------------------------------------------------- secagg+ddg
class HalfSigmaDDG(SecureDiscreteGaussianShare):
    """Test-only: each share's σ² a quarter of the sum's (half σ), charged as the honest share."""

    def __init__(self, honest: SecureDiscreteGaussianShare) -> None:
        params = honest.ddg.params
        super().__init__(honest.clip, honest.noise_multiplier, noise_shares=honest.noise_shares,
                         min_survivors=honest.min_survivors,
                         ddg=DDGSum(replace(params, local_sigma_sq=params.local_sigma_sq / 4), honest.ddg.rotation_seed))
        self.honest = honest

    def charged(self, sigma: float) -> float:
        return self.honest.charged(sigma)


def half_sigma_ddg(mechanism: Mechanism) -> Mechanism:
    assert type(mechanism) is SecureDiscreteGaussianShare
    return HalfSigmaDDG(mechanism)


def test_secagg_ddg_honest_is_not_flagged_and_half_sigma_is():
    """Sums of r_min canary clients through rotation, rounding, discrete Gaussian shares and mod 2^b, decoded."""
    honest = audit(None, DDG, canaries=600, extension=1, seed=7).audits[0]
    assert (honest.game, honest.mechanism, honest.level) == ("ddg-sum", "secure-ddg", "client")
    assert not honest.flagged, honest.line()
    assert 0.5 < honest.result.lower_bound <= honest.result.charged_epsilon
    # the ledger's Gaussian step dominates KLS's bound for the sum's own parameters (an independent computation)
    run_config = load_experiment(None, DDG, None)
    validate(run_config)
    s = setup(run_config, 0)
    params = ddg_sum_parameters(s, s.secure_floor, 256)
    kls = ddg_epsilon(local_sigma_sq=params.local_sigma_sq, norm_bound_sq=params.norm_bound_sq,
                      padded_dim=params.padded_dim, min_shares=s.secure_floor, max_shares=params.max_members,
                      rounds=1, delta=honest.result.delta)
    assert kls <= honest.result.charged_epsilon <= 1.01 * kls
    # the charge converts through RDP, looser than the privacy profile: the broken sum needs more canaries
    broken = audit(None, DDG, canaries=1200, extension=1, seed=7, mechanism_hook=half_sigma_ddg).audits[0]
    assert broken.flagged, broken.line()
    assert broken.mechanism == "secure-ddg"
    assert broken.result.charged_epsilon == pytest.approx(honest.result.charged_epsilon)
    _bound_beside_charge(honest.result, "ddg-sum")
    _bound_beside_charge(broken.result, "ddg-sum")


def test_secagg_ddg_shares_from_a_seed_the_server_knows_are_flagged():
    """noise-source = seeded: the server regenerates every member's discrete Gaussian share and subtracts it."""
    (a,) = audit(None, [*DDG, "noise-source=seeded"], canaries=200, extension=1, seed=3).audits
    assert a.game == "ddg-sum" and a.flagged, a.line()


# --------------------------------------------------------------------------- DP-SGD, every step
class HalfSigmaDPSGD(DPSGD):
    """Test-only: DP-SGD steps with half the σ the release reports and charges."""

    def run(self, work, release, noise):
        return work.train_dpsgd(self.clip, release.noise_multiplier / 2, noise)


def half_sigma_dpsgd(mechanism: Mechanism) -> Mechanism:
    assert type(mechanism) is DPSGD
    return HalfSigmaDPSGD(mechanism.clip, mechanism.noise_multiplier, mechanism.calibration,
                          num_examples=mechanism.num_examples, batch_size=mechanism.batch_size,
                          epochs=mechanism.epochs, local_steps=mechanism.local_steps)


def _steps(sets: list[str], *, canaries: int, seed: int, hook=None) -> tuple[Played, AuditResult]:
    """The ``dpsgd-steps`` game and its statistics, as ``privet audit`` runs a game.

    It audits the same mechanism kind as the registered ``dpsgd`` game (the server's view, one
    upload per round), so the registry does not select it: it is run by its :class:`Game`.
    """
    run_config = load_experiment(None, sets, None)
    validate(run_config)
    s = setup(run_config, 0)
    played = DPSGD_STEPS.run(s, canaries=canaries, extension=2, rng=np.random.default_rng(seed), hook=hook)
    return played, assess(played.observation, "dpsgd-steps", delta=s.profile.delta, accountant=played.accountant)


def test_dpsgd_white_box_per_step_honest_is_not_flagged_and_half_sigma_is():
    """Dirac gradient canaries through the client's real DP-SGD step (auto: book-keeping), every step observed."""
    played, honest = _steps(STEPS, canaries=1000, seed=7)
    assert played.mechanism == "dpsgd" and played.details["grad_sample_mode"] == "bk"
    assert not honest.flagged, honest.line()
    assert 0.2 < honest.lower_bound <= honest.charged_epsilon
    assert honest.charged_epsilon == pytest.approx(4.0, rel=1e-3)
    assert played.releases_per_canary == 1 and played.rounds_requested == 2
    assert played.details["steps_observed"] == played.steps == 16 and played.sample_rate == 1 / 16
    broken_played, broken = _steps(STEPS, canaries=1000, seed=7, hook=half_sigma_dpsgd)
    assert broken.flagged, broken.line()
    assert broken.charged_epsilon == pytest.approx(honest.charged_epsilon)
    assert broken_played.details["steps_observed"] == 16
    _bound_beside_charge(honest, "dpsgd-steps")
    _bound_beside_charge(broken, "dpsgd-steps")


def test_dpsgd_steps_seen_through_opacus_and_book_keeping_agree():
    """With a seeded source both code paths draw the same batches and noise: the observed steps must agree.

    The server replays the seeded noise, so the scores are those of the clipped sums alone; they
    agree between Opacus' per-sample hooks and book-keeping to float32 precision, and the replay
    makes the seeded run flagged.
    """
    seeded = [*STEPS, "noise-source=seeded"]
    bk, bk_result = _steps([*seeded, "grad-sample-mode=bk"], canaries=200, seed=5)
    hooks, _ = _steps([*seeded, "grad-sample-mode=hooks"], canaries=200, seed=5)
    assert (bk.details["grad_sample_mode"], hooks.details["grad_sample_mode"]) == ("bk", "hooks")
    assert np.abs(bk.observation.scores).max() > 0.1
    np.testing.assert_allclose(hooks.observation.scores, bk.observation.scores, atol=1e-5)
    assert bk_result.flagged, bk_result.line()
