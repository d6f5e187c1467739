"""Empirical privacy (issue 37, phase 1): the statistics of privacy.auditing and the mechanism audits.

The statistics are checked against independent computations (privet's accountant and
dp_accounting for the Gaussian profile, numerical integration for two Gaussians, the exact
binomial law of randomized response for the size of the tests) and on the plain Gaussian
mechanism against its analytic ε. The mechanism audits must flag every broken mechanism and
no honest one, and an honest audit must see its canaries (a positive lower bound), so that a
dead attack cannot pass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from privacy.accountants import epsilon_of
from privacy.auditing import (
    clopper_pearson_upper,
    one_run_audit,
    one_run_epsilon_bound,
    one_run_p_value,
    one_shot_epsilon,
    rate_bounds,
    threshold_audit,
)
from privacy.gaussian_profile import (
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu,
    two_gaussians_delta,
    two_gaussians_epsilon,
)
from privacy.mechanism_audit import (
    ADD_REMOVE_CHARGE,
    EXTENDED_RUN,
    HALF_SIGMA,
    HONEST,
    KNOWN_SEED,
    PROFILE_DELTAS,
    Defect,
    audit,
)

DELTA = 1e-5


# --------------------------------------------------------------------------- Gaussian profiles
@pytest.mark.parametrize(("sigma", "rounds"), [(0.69, 1), (2.16, 1), (7.46, 1), (2.16, 4)])
def test_gaussian_profile_agrees_with_privets_accountant_and_dp_accounting(sigma, rounds):
    """ε of T Gaussian releases of sensitivity 2C at σ: eq. (1) at μ = 2√T/σ, three computations."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    ours = gaussian_epsilon(2.0 * math.sqrt(rounds) / sigma, DELTA)
    assert ours == pytest.approx(epsilon_of([(sigma, 1.0, rounds)], DELTA, "prv"), rel=1e-6)
    google = pld.from_gaussian_mechanism(sigma, sensitivity=2.0, value_discretization_interval=1e-3) \
        .self_compose(rounds).get_epsilon_for_delta(DELTA)
    assert ours <= google + 1e-9 and google == pytest.approx(ours, abs=1e-2)  # the PLD is pessimistic


@pytest.mark.parametrize("mu", [0.05, 0.27, 0.92, 2.9, 8.0])
def test_gaussian_profile_functions_invert_each_other(mu):
    """ε(δ), δ(ε) and μ(ε, δ) of eq. (1) are each other's inverses; δ(0) is the total variation distance."""
    eps = gaussian_epsilon(mu, DELTA)
    assert gaussian_delta(eps, mu) == pytest.approx(DELTA, rel=1e-6)
    assert gaussian_delta(eps, mu) <= DELTA  # the ε returned is on the safe side
    assert gaussian_mu(eps, DELTA) == pytest.approx(mu, rel=1e-6)
    assert gaussian_delta(0.0, mu) == pytest.approx(2 * stats.norm.cdf(mu / 2) - 1, rel=1e-9)  # the TV distance


@pytest.mark.parametrize(("m0", "s0", "m1", "s1"), [(0, 1, 1.3, 1), (0, 1, 1, 1.4), (0.2, 0.7, -0.5, 1.1), (0, 1, 0.1, 0.5)])
@pytest.mark.parametrize("eps", [0.0, 0.5, 2.0])
def test_two_gaussians_profile_against_numerical_integration(m0, s0, m1, s1, eps):
    """The max over both orders of ∫ (p − e^ε q)₊ against the closed-form regions of the quadratic privacy loss."""
    def hockey(pm, ps, qm, qs):
        def f(y):
            return max(0.0, stats.norm.pdf(y, pm, ps) - math.exp(eps) * stats.norm.pdf(y, qm, qs))
        return integrate.quad(f, -30, 30, points=[pm, qm], limit=400, epsabs=1e-13)[0]

    expected = max(hockey(m1, s1, m0, s0), hockey(m0, s0, m1, s1))
    assert two_gaussians_delta(eps, m0, s0, m1, s1) == pytest.approx(expected, rel=1e-6, abs=1e-12)
    if s0 == s1:
        assert two_gaussians_delta(eps, m0, s0, m1, s1) == pytest.approx(gaussian_delta(eps, abs(m1 - m0) / s0),
                                                                         rel=1e-9)


def test_unequal_variances_cost_more_privacy_than_equal_ones():
    """The privacy loss of unequal variances is unbounded: ε at small δ exceeds the equal-variance one."""
    assert two_gaussians_epsilon(0, 1, 1, 1, DELTA) == pytest.approx(gaussian_epsilon(1.0, DELTA), rel=1e-9)
    assert two_gaussians_epsilon(0, 1, 1, 1.2, DELTA) > gaussian_epsilon(1.0, DELTA) + 0.5


# --------------------------------------------------------------------------- one run (Steinke et al.)
def _size(guesses, correct_probability, epsilon, delta, canaries=None):
    """P[the one-run test rejects (ε, δ)] when W ~ Binomial(r, p), exactly."""
    m = canaries or guesses
    return sum(stats.binom.pmf(v, guesses, correct_probability) for v in range(guesses + 1)
               if one_run_p_value(m, guesses, v, epsilon, delta) <= 0.05)


@pytest.mark.parametrize(("eps", "guesses"), [(1.0, 200), (2.0, 500), (0.5, 1000)])
def test_one_run_test_has_size_at_most_alpha_under_randomized_response(eps, guesses):
    """ε-randomized response is the theorem's worst case: W ~ Binomial(r, e^ε/(1+e^ε)) exactly.

    The test rejects the true ε with probability at most 5 %, and close to it (an off-by-one in
    the tail, P[Bin > v] for P[Bin >= v], would push it over 5 % in each case).
    """
    q = 1 / (1 + math.exp(-eps))
    size = _size(guesses, q, eps, 0.0)
    assert 0.04 <= size <= 0.05
    off_by_one = sum(stats.binom.pmf(v, guesses, q) for v in range(guesses + 1)
                     if stats.binom.sf(v, guesses, q) <= 0.05)
    assert off_by_one > 0.05


def test_one_run_delta_term_keeps_the_test_valid_when_canaries_leak_with_probability_delta():
    """A canary revealed outright with probability δ_m, else ε-randomized response, is (ε, δ_m)-DP.

    Ignoring δ, the test would reject this mechanism's true (ε, δ_m) far more often than 5 %;
    with the 2mδ term of eq. (2) it stays valid.
    """
    eps, leak, m = 1.0, 0.01, 2000
    q = 1 / (1 + math.exp(-eps))
    correct = leak + (1 - leak) * q
    assert _size(m, correct, eps, 0.0) > 0.07
    assert _size(m, correct, eps, leak) <= 0.05


def test_one_run_bound_is_the_largest_rejected_epsilon():
    """The bound is where the p-value (2) crosses 5 %; accuracy at chance proves nothing; δ = 0 claims more."""
    m, r, v = 10_000, 1_000, 900
    bound = one_run_epsilon_bound(m, r, v, DELTA)
    assert one_run_p_value(m, r, v, bound, DELTA) <= 0.05 < one_run_p_value(m, r, v, bound * 1.01 + 1e-3, DELTA)
    assert one_run_epsilon_bound(m, r, r // 2, DELTA) == 0.0  # coin-flip accuracy proves nothing
    assert one_run_epsilon_bound(m, r, v, 0.0) > bound  # δ = 0 claims more, so it is refuted sooner


# --------------------------------------------------------------------------- hypothesis test
@pytest.mark.parametrize("n", [10, 200, 5000])
def test_clopper_pearson_upper_bound_is_the_binomial_quantile(n):
    """P[Binomial(n, ub) <= k] = 1 − confidence: the bound is exactly the CP endpoint."""
    ks = np.array([0, 1, n // 3, n - 1])
    ub = clopper_pearson_upper(ks, n, 0.95)
    assert np.allclose(stats.binom.cdf(ks, n, ub), 0.05, rtol=1e-6)
    assert clopper_pearson_upper(n, n, 0.95) == 1.0


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_hypothesis_test_has_size_at_most_alpha_under_randomized_response(eps):
    """FP ~ Bin(n, 1−q) and FN ~ Bin(n, 1−q) exactly: P[bound at δ = 0 exceeds ε] <= 5 %.

    All (FP, FN) pairs at once from the per-rate Clopper–Pearson bounds, checked against
    :func:`rate_bounds` on a sample of pairs.
    """
    n = 300
    q = 1 / (1 + math.exp(-eps))
    ks = np.arange(n + 1)
    pmf = stats.binom.pmf(ks, n, 1 - q)
    upper = clopper_pearson_upper(ks, n, 1 - 0.05 / 2)  # each rate at half the significance
    fpr, fnr = upper[:, None], upper[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.nan_to_num(np.maximum(np.log(1 - fnr) - np.log(fpr), np.log(1 - fpr) - np.log(fnr)), nan=-np.inf)
    for fp, fn in np.random.default_rng(0).integers(0, n + 1, size=(20, 2)):
        assert rate_bounds(fp, n, fn, n).epsilon(0.0) == pytest.approx(max(0.0, bound[fp, fn]), abs=1e-12)
    assert float(np.sum(np.outer(pmf, pmf)[bound > eps])) <= 0.05


# --------------------------------------------------------------------------- the plain Gaussian mechanism
def _gaussian_trials(rng, mu, m):
    secrets = rng.choice(np.array([-1, 1]), size=m)
    return secrets * mu / 2 + rng.standard_normal(m), secrets


def test_bounds_stay_below_the_gaussian_mechanisms_epsilon_at_the_stated_confidence():
    """Each bound exceeds the Gaussian mechanism's true ε in at most 5 % of 60 audits.

    At ε = 2: the one-run bound at δ, and the threshold test's curve at any δ' against eq. (1);
    9 of 60 is the 99.9 % binomial limit of a 5 % rate.
    """
    rng = np.random.default_rng(37)
    mu = gaussian_mu(2.0, DELTA)
    deltas = (DELTA, *PROFILE_DELTAS)
    truth = [gaussian_epsilon(mu, d) for d in deltas]
    one_run = curve = 0
    for _ in range(60):
        scores, secrets = _gaussian_trials(rng, mu, 2000)
        one_run += one_run_audit(scores, secrets, DELTA) > truth[0]
        rates = threshold_audit(scores, secrets, DELTA)
        curve += any(rates.epsilon(d) > t for d, t in zip(deltas, truth, strict=True))
    assert one_run <= 9 and curve <= 9


def test_bounds_come_close_with_many_canaries_and_a_strong_sigma():
    """10⁵ canaries at ε = 1 (σ = 7.46 for sensitivity 2): both bounds reach at least half of ε.

    More canaries give a tighter bound than fewer, and the one-shot estimate is within 10 %.
    """
    rng = np.random.default_rng(7)
    mu = gaussian_mu(1.0, DELTA)
    scores, secrets = _gaussian_trials(rng, mu, 100_000)
    one_run = one_run_audit(scores, secrets, DELTA)
    threshold = threshold_audit(scores, secrets, DELTA).epsilon(DELTA)
    assert 0.4 <= one_run <= 1.0 and 0.5 <= threshold <= 1.0
    few, few_secrets = scores[:2000], secrets[:2000]
    assert one_run_audit(few, few_secrets, DELTA) < one_run
    assert one_shot_epsilon(scores[secrets == 1], scores[secrets == -1], DELTA).epsilon == pytest.approx(1.0, rel=0.1)


# --------------------------------------------------------------------------- mechanisms
HONEST_CASES = [("update", 2000, {}), ("update", 2000, {"noise_shares": 4, "rounds": 2}), ("secure-sum", 2000, {}),
                ("dpsgd", 8000, {}), ("dpsgd", 8000, {"local_steps": 1})]


@pytest.mark.parametrize(("mechanism", "canaries", "options"), HONEST_CASES)
def test_honest_mechanisms_are_not_flagged_and_their_canaries_are_seen(mechanism, canaries, options):
    """Honest at ε = 4: no flag, a positive lower bound (the attack sees the canaries), one-shot near ε.

    The one-shot estimate fits Gaussians, so it is held to the charge only where the mechanism is
    Gaussian (q = 1); for one DP-SGD step at q = 1/4 it reads about half the charge.
    """
    result = audit(mechanism, 4.0, canaries=canaries, noise=11, seed=3, **options)
    assert not result.flagged, result.line()
    assert result.charged_epsilon == pytest.approx(4.0, rel=2e-3)
    assert 0.5 < result.lower_bound <= result.charged_epsilon  # the attack sees the canaries
    if mechanism != "dpsgd":  # a Gaussian fit models the Gaussian mechanism; DP-SGD's subsampled mixture it does not
        assert 0.6 * result.charged_epsilon < result.one_shot_epsilon < 1.4 * result.charged_epsilon
    assert result.line().startswith(f"ok {mechanism}:")


BROKEN_CASES = [
    ("update", HALF_SIGMA, 2000, {}),
    ("update", ADD_REMOVE_CHARGE, 2000, {}),
    ("update", KNOWN_SEED, 500, {}),
    ("update", EXTENDED_RUN, 2000, {"rounds": 2}),
    ("secure-sum", HALF_SIGMA, 2000, {}),
    ("secure-sum", ADD_REMOVE_CHARGE, 2000, {}),
    ("secure-sum", KNOWN_SEED, 500, {}),
    ("dpsgd", HALF_SIGMA, 8000, {}),
    ("dpsgd", KNOWN_SEED, 2000, {}),
    ("dpsgd", EXTENDED_RUN, 8000, {}),
]


@pytest.mark.parametrize(("mechanism", "defect", "canaries", "options"), BROKEN_CASES,
                         ids=[f"{m}-{d.name}" for m, d, _, _ in BROKEN_CASES])
def test_broken_mechanisms_are_flagged(mechanism, defect, canaries, options):
    """Each defect is flagged in one line naming the mechanism, the defect and both figures."""
    result = audit(mechanism, 4.0, canaries=canaries, defect=defect, noise=11, seed=3, **options)
    assert result.flagged, result.line()
    line = result.line()
    assert line.startswith(f"FLAGGED {mechanism} [{defect.name}]:")
    assert f"charged eps = {result.charged_epsilon:.3f}" in line and f">= {result.lower_bound:.3f}" in line
    for d, _, charged in result.profile:  # the charged curve is privet's accountant on the ledger's history
        assert charged == epsilon_of(result.history, d, "prv", defect.charged_relation)
    if result.violation is not None:
        assert result.violation[1] > result.violation[2]


def test_a_seed_the_server_knows_gives_the_noise_away_entirely():
    """With the seed, the server subtracts the noise exactly: every canary's sign is read without error."""
    result = audit("update", 1.0, canaries=300, defect=KNOWN_SEED, noise=11, seed=3)
    assert result.one_shot_epsilon == math.inf
    assert result.flagged and result.lower_bound > 3.0  # far above ε = 1, with 300 canaries


def test_defect_settings_are_checked_at_the_edge():
    """Bad settings fail with a message naming the setting."""
    with pytest.raises(ValueError, match="noise_scale"):
        Defect(noise_scale=0)
    with pytest.raises(ValueError, match="charged_relation"):
        Defect(charged_relation="swap")
    with pytest.raises(ValueError, match="mechanism must be one of"):
        audit("centroids", 1.0, canaries=10)
    assert HONEST.name == "honest"
