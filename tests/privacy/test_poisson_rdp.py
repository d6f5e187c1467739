"""Zhu & Wang's general Poisson-subsampling RDP bound, and the ledger step that carries a DDG sum's curve.

Each property is checked against something computed apart: dp-accounting's exact RDP of the
Poisson-sampled Gaussian, the base curve itself at q = 1, and an independent recomputation of the
ledger's ε (KLS's three-term bound, Zhu & Wang's Theorem 6 and the replace-one triangle inequality
written out here in plain Python with ``math.comb``, converted by dp-accounting).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian, compute_epsilon

from privacy.accountants import epsilon_of
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger
from privacy.poisson_rdp import (
    CURVE_ORDERS,
    DDGPoissonStep,
    poisson_subsampled_rdp,
    replace_one_subsampled_rdp,
)

ORDERS = list(range(2, 257))
DELTA = 1e-5


def _gaussian(z: float):
    return lambda alpha: np.asarray(alpha, dtype=np.float64) / (2.0 * z * z)


@pytest.mark.parametrize("z", [0.7, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("q", [0.001, 0.01, 0.1, 0.5])
def test_general_bound_is_above_the_exact_sampled_gaussian_at_every_integer_order(z, q):
    """(a): for the base curve α/(2z²) the general bound never undercuts the exact add/remove RDP.

    At α = 2 both are exact (1 + q²(e^{1/z²} − 1)), so they agree to float round-off; above, the bound
    pays Theorem 6's factor 3. Seen here: at most 2.9× the exact RDP for z <= 2 and 9.1× for z = 5 over
    orders 2-256. After composition and conversion (T = 100, δ = 1e-5): 1.0-1.52× the exact ε for z <= 2
    and 1.1-3.0× for z = 5, where the RDP values are small and Theorem 6's additive log(3)/(α − 1) per
    release dominates them.
    """
    bound = poisson_subsampled_rdp(ORDERS, _gaussian(z), q)
    exact = np.asarray(_compute_rdp_poisson_subsampled_gaussian(q, z, [float(a) for a in ORDERS]))
    assert np.all(bound >= exact * (1 - 1e-9))
    assert bound[0] == pytest.approx(exact[0], rel=1e-9)  # α = 2: both exact
    ratio = bound / exact
    assert ratio.max() < (3.0 if z <= 2 else 10.0)  # not wildly above
    eps_bound = compute_epsilon(ORDERS, list(100 * bound), DELTA)[0]
    eps_exact = compute_epsilon(ORDERS, list(100 * exact), DELTA)[0]
    assert eps_exact * (1 - 1e-12) <= eps_bound < (1.6 if z <= 2 else 3.1) * eps_exact


def test_at_q_one_the_bound_is_the_base_curve():
    """(b): no sampling, no amplification: the base curve itself (add/remove and replace-one)."""
    base = _gaussian(1.3)
    np.testing.assert_array_equal(poisson_subsampled_rdp(ORDERS, base, 1.0), base(np.asarray(ORDERS)))
    full = _gaussian(0.65)  # replace-one: sensitivity doubled
    np.testing.assert_array_equal(replace_one_subsampled_rdp(ORDERS, base, full, 1.0), full(np.asarray(ORDERS)))


def test_the_bound_grows_with_q_and_never_exceeds_the_base():
    """(c): monotone in q at every order (add/remove and replace-one), capped by the unsampled curve."""
    base, full = _gaussian(1.0), _gaussian(0.5)
    rates = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 0.6, 0.9, 1.0]
    curves = [poisson_subsampled_rdp(ORDERS, base, q) for q in rates]
    replaced = [replace_one_subsampled_rdp(ORDERS[:100], base, full, q) for q in rates]
    for low, high in zip(curves, curves[1:], strict=False):
        assert np.all(low <= high * (1 + 1e-12))
    for low, high in zip(replaced, replaced[1:], strict=False):
        assert np.all(low <= high * (1 + 1e-12))
    assert np.all(curves[-2] <= base(np.asarray(ORDERS)))
    assert np.all(replaced[-2] <= full(np.asarray(ORDERS[:100])))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="integer orders"):
        poisson_subsampled_rdp([1.5], _gaussian(1.0), 0.1)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="sample_rate"):
        poisson_subsampled_rdp([2], _gaussian(1.0), 0.0)
    with pytest.raises(ValueError, match="max_shares"):
        DDGPoissonStep(16.0, 100, 1024, 5, 4, 0.1, 3)
    with pytest.raises(ValueError, match="power of 2"):
        DDGPoissonStep(16.0, 100, 1000, 5, 5, 0.1, 3)


# ------------------------------------------------------------------ the ledger step, recomputed apart
def _kls(alpha: int, l2: float, l1: float, sigma_sq: float, dim: int, n_min: int, n_max: int) -> float:
    """KLS 2021 eq. (17): the three-term bound on D_α of a sum of n shares of N_Z(0, σ²), τ at n_max."""
    tau = 10 * sum(math.exp(-2 * math.pi**2 * sigma_sq * k / (k + 1)) for k in range(1, n_max))
    a2, a1 = l2 * l2 / (n_min * sigma_sq), l1 / math.sqrt(n_min * sigma_sq)
    return min(alpha / 2 * a2 + tau * dim, alpha / 2 * (a2 + 2 * a1 * tau + tau * tau * dim),
               alpha / 2 * (math.sqrt(a2) + tau * math.sqrt(dim)) ** 2)


def _zhu_wang(alpha: int, eps, q: float) -> float:
    """Theorem 6, term by term with exact binomials (log-space per term), capped by ε(α)."""
    terms = [(alpha - 1) * math.log1p(-q) + math.log1p((alpha - 1) * q),
             math.log(math.comb(alpha, 2)) + 2 * math.log(q) + (alpha - 2) * math.log1p(-q) + eps(2)]
    terms += [math.log(3) + math.log(math.comb(alpha, j)) + j * math.log(q) + (alpha - j) * math.log1p(-q)
              + (j - 1) * eps(j) for j in range(3, alpha + 1)]
    top = max(terms)
    return min((top + math.log(sum(math.exp(t - top) for t in terms))) / (alpha - 1), eps(alpha))


def reference_ddg_poisson_epsilon(step: DDGPoissonStep, delta: float) -> float:
    b = math.sqrt(step.norm_bound_sq)
    l1_zero = min(math.sqrt(step.padded_dim) * b, step.norm_bound_sq)
    args = (step.local_sigma_sq, step.padded_dim, step.min_shares, step.max_shares)

    def zero_out(a: int) -> float:
        return _kls(a, b, l1_zero, *args)

    rdp = []
    for alpha in CURVE_ORDERS:
        full = _kls(alpha, 2 * b, 2 * l1_zero, *args)
        triangle = (alpha - 0.5) / (alpha - 1) * _zhu_wang(2 * alpha, zero_out, step.sample_rate) \
            + _zhu_wang(2 * alpha - 1, zero_out, step.sample_rate)
        rdp.append(step.count * min(full, triangle))
    return float(compute_epsilon(list(CURVE_ORDERS), rdp, delta)[0])


STEP = DDGPoissonStep(local_sigma_sq=3.0e6, norm_bound_sq=2_000_000, padded_dim=8192, min_shares=6, max_shares=6,
                      sample_rate=0.2, count=30)


def test_the_ledgers_epsilon_is_the_bound_recomputed_apart():
    """(d): a ledger charged the step reports KLS ∘ Zhu & Wang ∘ triangle, written out here, to 1e-9."""
    reference = reference_ddg_poisson_epsilon(STEP, DELTA)
    assert 0.5 < reference < 20
    ledger = PrivacyLedger(epsilon_budget=100.0, delta=DELTA, accountant="prv")
    ledger.record_release([STEP], server_round=1, run_id=1, mode="group-ddg")
    assert ledger.conversion() == "rdp"
    assert ledger.spent() == pytest.approx(reference, rel=1e-9)
    assert epsilon_of([STEP], DELTA, "prv") == pytest.approx(reference, rel=1e-9)
    # sampling amplifies: the same sum unsampled costs more, and so does a smaller sum
    unsampled = DDGPoissonStep(3.0e6, 2_000_000, 8192, 6, 6, 1.0, 30)
    assert epsilon_of([unsampled], DELTA) > 2 * reference
    assert epsilon_of([DDGPoissonStep(3.0e6, 2_000_000, 8192, 3, 6, 0.2, 30)], DELTA) > reference


def test_a_step_composes_with_gaussian_steps_in_rdp():
    """A mixed history is the sum of both RDP curves at the integer orders, converted once."""
    from privacy.accountants import _replace_one_rdp_curve

    gaussian = (2.0, 0.1, 40)
    mixed = epsilon_of([gaussian, STEP], DELTA)
    orders = tuple(float(a) for a in CURVE_ORDERS)
    rdp = 40 * np.asarray(_replace_one_rdp_curve(2.0, 0.1, orders)) + STEP.count * STEP.rdp(CURVE_ORDERS)
    assert mixed == pytest.approx(compute_epsilon(list(orders), list(rdp), DELTA)[0], rel=1e-9)
    assert mixed > max(epsilon_of([gaussian], DELTA, "rdp"), epsilon_of([STEP], DELTA))


def test_the_step_survives_a_ledger_file_and_budgets_hold(tmp_path):
    ledger = PrivacyLedger(epsilon_budget=30.0, delta=DELTA, accountant="rdp")
    ledger.record(1.5, 1.0, 1, server_round=1, run_id=1, mode="update")
    ledger.record_release([STEP], server_round=1, run_id=2, mode="group-ddg")
    ledger.record_release([STEP.with_count(5)], server_round=2, run_id=3, mode="group-ddg")
    assert ledger.curves == [STEP.with_count(35)]  # consecutive equal steps merge
    path = tmp_path / "ledger.json"
    ledger.save(path)
    state = json.loads(path.read_text())
    assert state["schema_version"] == 4 and state["curves"][0]["kind"] == "ddg-poisson"
    loaded = PrivacyLedger.load(path)
    assert loaded.curves == ledger.curves and loaded.spent() == ledger.spent()
    assert loaded.unit() == "client"
    # a ledger without curve steps is still written as version 3
    assert json.loads(PrivacyLedger(10.0, DELTA).to_json())["schema_version"] == 3
    small = PrivacyLedger(epsilon_budget=epsilon_of([STEP], DELTA) * 0.9, delta=DELTA)
    with pytest.raises(PrivacyBudgetExhausted, match="discrete Gaussian sum"):
        small.record_release([STEP], server_round=1, run_id=1, mode="group-ddg")
    assert not small.curves and small.spent() == 0.0
    state["curves"][0]["count"] = -1
    with pytest.raises(ValueError, match=r"curves\[0\]"):
        PrivacyLedger.from_dict(state)
