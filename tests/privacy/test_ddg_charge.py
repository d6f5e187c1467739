"""How a distributed discrete Gaussian release is charged in a ledger of Gaussian steps (issue 39).

The charge is the Gaussian step (σ_eq, 1, 1) whose replace-one RDP curve dominates KLS's bound at
every order the RDP accountant converts at, and a ledger holding one converts its whole history
through RDP. Checked against independent computations: KLS's formula written out here and
dp_accounting's RDP accountant; and the property that makes the rule necessary (the PLD of the
dominating Gaussian reports less than RDP does, so it would not be a safe conversion).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from privacy import ddg_accounting
from privacy import distributed_discrete_gaussian as ddg
from privacy.accountants import RDP_ORDERS, epsilon_of
from privacy.ledger import DDG_MODE, PrivacyLedger
from privacy.mechanisms import DDGSum, SecureDiscreteGaussianShare
from protocol.secure_sum import DDG, SumParameters, rotation_seed


def _kls_rdp(alpha: np.ndarray, sigma_sq: float, bound_sq: int, padded: int, n_min: int, n_max: int) -> np.ndarray:
    """KLS 2021 eq. (17), replace-one, written out apart from privet's implementation."""
    b = math.sqrt(bound_sq)
    l2, l1 = 2 * b, 2 * min(math.sqrt(padded) * b, bound_sq)
    tau = 10 * sum(math.exp(-2 * math.pi**2 * sigma_sq * k / (k + 1)) for k in range(1, n_max))
    a2, a1 = l2**2 / (n_min * sigma_sq), l1 / math.sqrt(n_min * sigma_sq)
    return np.minimum.reduce([alpha * a2 / 2 + tau * padded, alpha / 2 * (a2 + 2 * a1 * tau + tau**2 * padded),
                              alpha / 2 * (math.sqrt(a2) + tau * math.sqrt(padded)) ** 2])


def _dp_accounting_rdp(gaussians: list[tuple[float, int]], extra_rdp: np.ndarray, delta: float) -> float:
    """dp_accounting's RDP accountant at privet's orders: replace-one Gaussians (multiplier σ/2 against
    sensitivity 1) plus an RDP curve added order by order, converted once."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    accountant = rdp.RdpAccountant(orders=list(RDP_ORDERS))
    for sigma, count in gaussians:
        accountant.compose(dp_accounting.GaussianDpEvent(sigma / 2), count)
    total = np.asarray(accountant._rdp) + extra_rdp  # the composed Gaussians' RDP at each order
    return float(compute_epsilon(list(RDP_ORDERS), list(total), delta)[0])


CASES = [(Fraction(1, 2), 3, 64, 3, 5), (Fraction(2), 12, 256, 4, 9), (Fraction(4_563_048), 1_429_238, 8192, 3, 5)]


@pytest.mark.parametrize("sigma_sq, bound_sq, padded, n_min, n_max", CASES)
def test_the_gaussian_step_dominates_kls_at_every_order_and_touches_it(sigma_sq, bound_sq, padded, n_min, n_max):
    sigma = ddg_accounting.gaussian_equivalent_multiplier(local_sigma_sq=sigma_sq, norm_bound_sq=bound_sq, padded_dim=padded,
                                               min_shares=n_min, max_shares=n_max)
    alpha = np.asarray(RDP_ORDERS)
    bound = _kls_rdp(alpha, float(sigma_sq), bound_sq, padded, n_min, n_max)
    gaussian = 2 * alpha / sigma**2
    assert np.all(gaussian >= bound)
    assert np.min(gaussian / bound) == pytest.approx(1.0, rel=1e-12)  # the largest σ that dominates
    # the third term alone gives a smaller (looser) σ; the minimum over the three can only help
    third = 2 / (2 * math.sqrt(bound_sq) / math.sqrt(n_min * float(sigma_sq))
                 + ddg_accounting.tau(sigma_sq, n_max) * math.sqrt(padded))
    assert sigma >= third * (1 - 1e-12)


@pytest.mark.parametrize("sigma_sq, bound_sq, padded, n_min, n_max", CASES)
def test_a_ledger_of_ddg_releases_is_never_below_kls_and_equals_it_where_tau_vanishes(sigma_sq, bound_sq, padded,
                                                                                       n_min, n_max):
    sigma = ddg_accounting.gaussian_equivalent_multiplier(local_sigma_sq=sigma_sq, norm_bound_sq=bound_sq, padded_dim=padded,
                                               min_shares=n_min, max_shares=n_max)
    ledger = PrivacyLedger(epsilon_budget=math.inf, delta=1e-5, accountant="prv")
    for r in range(3):
        ledger.record_release([(sigma, 1.0, 1)], server_round=r + 1, run_id=1, mode=DDG_MODE)
    independent = _dp_accounting_rdp([], 3 * _kls_rdp(np.asarray(RDP_ORDERS), float(sigma_sq), bound_sq, padded,
                                                       n_min, n_max), 1e-5)
    assert ledger.spent() >= independent * (1 - 1e-9)
    if sigma_sq >= 4:  # τ·d' below float resolution: the same curve, the same ε
        assert ledger.spent() == pytest.approx(independent, rel=1e-9)
    # phase 1's own accounting of the same releases agrees
    assert ledger.spent() >= ddg_accounting.ddg_epsilon(local_sigma_sq=sigma_sq, norm_bound_sq=bound_sq, padded_dim=padded,
                                             min_shares=n_min, max_shares=n_max, rounds=3, delta=1e-5) * (1 - 1e-9)


def test_a_ledger_holding_a_ddg_release_converts_its_whole_history_through_rdp():
    """A prv ledger with Gaussian steps, then one DDG step: the whole history through RDP, as dp_accounting's
    RDP accountant composes it; before the DDG step, the tighter PLD; and the PLD of the dominating Gaussian
    would report less, which is why it may not be used."""
    sigma_sq, bound_sq, padded, n = Fraction(4_563_048), 1_429_238, 8192, 3
    step = ddg_accounting.gaussian_equivalent_multiplier(local_sigma_sq=sigma_sq, norm_bound_sq=bound_sq, padded_dim=padded,
                                              min_shares=n, max_shares=5)
    ledger = PrivacyLedger(epsilon_budget=50.0, delta=1e-5, accountant="prv")
    ledger.record_release([(1.5, 1.0, 2)], server_round=1, run_id=1, mode="update")
    ledger.record_release([(0.9, 0.1, 30)], server_round=2, run_id=1, mode="dpsgd")
    before = ledger.spent()
    assert before == pytest.approx(epsilon_of(ledger.history, 1e-5, "prv"))
    assert ledger.conversion() == "prv" and ledger.conversion(DDG_MODE) == "rdp"
    ledger.record_release([(step, 1.0, 1)], server_round=3, run_id=1, mode=DDG_MODE)
    assert ledger.conversion() == "rdp"
    kls = _kls_rdp(np.asarray(RDP_ORDERS), float(sigma_sq), bound_sq, padded, n, 5)
    sampled = epsilon_of([(0.9, 0.1, 30)], 1e-5, "rdp")  # privet's replace-one sampled curve (no dp_accounting twin)
    assert sampled > 0
    rdp_all = epsilon_of(ledger.history, 1e-5, "rdp")
    pld_all = epsilon_of(ledger.history, 1e-5, "prv")
    assert ledger.spent() == rdp_all and pld_all < rdp_all  # the PLD would under-report: not allowed
    # the q = 1 part against dp_accounting: Gaussians and the DDG curve, composed in RDP
    q1 = PrivacyLedger(epsilon_budget=50.0, delta=1e-5, accountant="prv")
    q1.record_release([(1.5, 1.0, 2)], server_round=1, run_id=1, mode="update")
    q1.record_release([(step, 1.0, 1)], server_round=2, run_id=1, mode=DDG_MODE)
    assert q1.spent() == pytest.approx(_dp_accounting_rdp([(1.5, 2)], kls, 1e-5), rel=1e-9)
    # across the file: the rule holds after a JSON round trip, under any declared accountant
    again = PrivacyLedger.from_json(ledger.to_json())
    assert again.spent() == ledger.spent() and again.modes[-1] == DDG_MODE
    assert PrivacyLedger.load_or_create(None, epsilon_budget=50.0, delta=1e-5, accountant="prv").conversion() == "prv"


def test_the_projection_before_a_ddg_release_uses_rdp():
    """A budget the PLD would allow but RDP would not: the ledger refuses the DDG release before it happens."""
    ledger = PrivacyLedger(epsilon_budget=100.0, delta=1e-5, accountant="prv")
    ledger.record_release([(4.0, 1.0, 8)], server_round=1, run_id=1, mode="update")
    charge = [(2.0, 1.0, 1)]
    pld, rdp = epsilon_of([*ledger.history, *charge], 1e-5, "prv"), epsilon_of([*ledger.history, *charge], 1e-5, "rdp")
    ledger.epsilon_budget = (pld + rdp) / 2
    assert not ledger.would_exceed_release(charge, 1, "update")
    assert ledger.would_exceed_release(charge, 1, DDG_MODE)
    from privacy.exceptions import PrivacyBudgetExhausted

    with pytest.raises(PrivacyBudgetExhausted):
        ledger.record_release(charge, server_round=2, run_id=1, mode=DDG_MODE)
    assert ledger.modes == ["update"]  # nothing recorded


def test_the_mechanism_charges_r_min_shares_and_tau_at_the_sums_size():
    params = ddg.ddg_parameters(clip=1.0, dim=7850, bits=12, noise_multiplier=1.0, noise_shares=5, max_members=9)
    mechanism = SecureDiscreteGaussianShare(1.0, 1.0, noise_shares=5, min_survivors=3, ddg=DDGSum(params))
    expected = ddg_accounting.gaussian_equivalent_multiplier(local_sigma_sq=params.local_sigma_sq,
                                                  norm_bound_sq=params.norm_bound_sq, padded_dim=params.padded_dim,
                                                  min_shares=3, max_shares=9)
    release = mechanism.release(1.0)
    assert release.charges == ((expected, 1.0, 1),) and mechanism.charged(123.0) == expected
    assert mechanism.ledger_mode == DDG_MODE and mechanism.expected(100).noise_multiplier == 1.0
    with pytest.raises(ValueError, match="rotation seed"):
        mechanism.run(None, release, None)  # type: ignore[arg-type]  # the server's copy never encodes


def _params(**changes: object) -> SumParameters:
    ddg_params = ddg.ddg_parameters(clip=1.0, dim=7850, bits=16, noise_multiplier=2.0, noise_shares=5,
                                    max_members=5, beta=0.5)
    base = SumParameters.for_ddg("run-1-0", 5, 3, 4, 2.0, 5, ddg_params, 1e-6)
    return base if not changes else SumParameters(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_sum_parameters_carry_the_discrete_gaussian_through_the_wire_and_the_digest():
    params = _params()
    assert params.mode == DDG and params.modulus == 2**16
    again = SumParameters.from_record(params.encode())
    assert again == params and again.ddg() == params.ddg() and again.digest() == params.digest()
    assert params.ddg_mismatch() is None
    for field, value in (("scale", params.scale * 1.01), ("local_sigma_sq", "17/1"), ("norm_bound_sq", 5),
                         ("bits", 17), ("beta", 0.25), ("wrap_target", 1e-3), ("dim", 9000)):
        changed = _params(**{field: value, **({"modulus": 2**17} if field == "bits" else {})})
        assert changed.digest() != params.digest(), field  # every member's signature covers it
        assert changed.ddg_mismatch() is not None, field
    assert "sigma^2" in (_params(local_sigma_sq="17/1").ddg_mismatch() or "")
    with pytest.raises(ValueError, match="discrete Gaussian parameters"):
        _params(local_sigma_sq="1/8")
    with pytest.raises(ValueError, match="no discrete Gaussian"):
        SumParameters("s", 3, 2, 2, 1.0, 255, 2**10, 1.0, 1.0, 3).ddg()


def test_the_rotation_seed_is_every_members_keys_in_any_order():
    digest = _params().digest()
    nodes, names, pk1s, pk2s = [3, 1, 2], ["c", "a", "b"], [b"k3", b"k1", b"k2"], [b"l3", b"l1", b"l2"]
    seed = rotation_seed(digest, nodes, names, pk1s, pk2s)
    order = [1, 2, 0]
    assert seed == rotation_seed(digest, *([x[i] for i in order] for x in (nodes, names, pk1s, pk2s)))
    assert seed != rotation_seed(digest, nodes, names, [b"k3", b"k1", b"kX"], pk2s)  # a member's fresh key
    assert seed != rotation_seed(_params(sum_id="run-1-1").digest(), nodes, names, pk1s, pk2s)  # another sum
    assert len(seed) == 32


# ------------------------------------------------------------------ a GDPFed group's run (curve step)
def _group_share(sigma: float = 2.0, rounds: int = 3, shares: int = 4, rate: float = 0.25):
    from privacy.mechanisms import GroupDiscreteGaussianShare

    params = ddg.ddg_parameters(clip=1.0, dim=1000, bits=20, noise_multiplier=sigma, noise_shares=shares,
                                max_members=shares)
    return GroupDiscreteGaussianShare(1.0, sigma, sample_rate=rate, rounds=rounds, noise_shares=shares,
                                      min_survivors=shares, ddg=DDGSum(params, b"seed"))


def test_a_group_share_pays_its_run_once_by_the_curve_step_and_refuses_more_releases():
    from privacy.exceptions import PrivacyBudgetExhausted
    from privacy.ledger import GROUP_DDG_MODE
    from privacy.poisson_rdp import DDGPoissonStep

    share = _group_share()
    p = share.ddg.params
    assert share.step == DDGPoissonStep(float(p.local_sigma_sq), p.norm_bound_sq, p.padded_dim, 4, 4, 0.25, 3)
    ledger = PrivacyLedger(epsilon_budget=50.0, delta=1e-5, accountant="prv")
    for index in range(3):
        release = share.plan(ledger, run_id=7)
        assert release.charges == ((share.step,) if index == 0 else ())
        assert (release.noise_multiplier, release.sample_rate, release.steps) == (2.0, 0.25, 3)
        ledger.record_release(release.charges, server_round=index + 1, run_id=7, mode=GROUP_DDG_MODE)
    assert ledger.curves == [share.step] and not ledger.history
    assert ledger.spent() == pytest.approx(epsilon_of([share.step], 1e-5), rel=1e-12)
    with pytest.raises(PrivacyBudgetExhausted, match="T=3"):
        share.plan(ledger, run_id=7)


def test_a_group_share_refuses_a_sum_changed_mid_run():
    """A server that shrinks the sum's noise after the run was paid for is refused, whatever σ_m it reports."""
    ledger = PrivacyLedger(epsilon_budget=50.0, delta=1e-5)
    first = _group_share()
    ledger.record_release(first.plan(ledger, run_id=1).charges, server_round=1, run_id=1, mode="group-ddg")
    changed = _group_share()
    thinner = ddg.DDGParameters(**{**changed.ddg.params.__dict__, "local_sigma_sq": Fraction(1, 1)})
    from privacy.mechanisms import GroupDiscreteGaussianShare

    tampered = GroupDiscreteGaussianShare(1.0, 2.0, sample_rate=0.25, rounds=3, noise_shares=4, min_survivors=4,
                                          ddg=DDGSum(thinner, b"seed"))
    with pytest.raises(ValueError, match="did not pay for"):
        tampered.plan(ledger, run_id=1)
    with pytest.raises(ValueError, match="paid for as"):
        _group_share(sigma=1.0).plan(ledger, run_id=1)
    assert len(ledger.rounds) == 1


def test_a_diverged_update_enters_the_sum_as_the_zero_update():
    """As for the float Gaussian: NaN or inf in the update is not refused (a data-dependent bit) but
    replaced by the zero update; with the same noise the member's input is the zero update's."""
    from privacy.randomness import noise_source
    from privet.audit_games import CanaryWork

    params = ddg.ddg_parameters(clip=1.0, dim=8, bits=16, noise_multiplier=1.0, noise_shares=3, max_members=3)
    mechanism = SecureDiscreteGaussianShare(1.0, 1.0, noise_shares=3, min_survivors=3,
                                            ddg=DDGSum(params, b"\x01" * 32))
    received = [np.zeros(5), np.zeros(3)]
    diverged = CanaryWork(received, [np.full(5, np.inf), np.array([0.5, np.nan, 0.0])])
    zero = CanaryWork(received, [np.zeros(5), np.zeros(3)])
    release = mechanism.release(1.0)
    sent = mechanism.run(diverged, release, noise_source("seeded", 11))
    expected = mechanism.run(zero, release, noise_source("seeded", 11))
    assert np.array_equal(sent.arrays[0], expected.arrays[0])
    assert sent.metrics["non-finite-update"] == 1.0 and expected.metrics["non-finite-update"] == 0.0
