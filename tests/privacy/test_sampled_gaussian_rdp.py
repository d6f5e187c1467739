"""privacy.sampled_gaussian_rdp: Opacus' RDP series summed in numpy, against Opacus and exact arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privacy.accountants import RDP_ORDERS, _opacus_rdp, epsilon_of
from privacy.sampled_gaussian_rdp import rdp_curve

#: Every order the accountants evaluate: RDP_ORDERS and, for replace-one, 2α and 2α − 1.
ORDERS = sorted({*RDP_ORDERS, *(2 * a for a in RDP_ORDERS), *(2 * a - 1 for a in RDP_ORDERS)})


@pytest.mark.parametrize("q", [1e-5, 0.003, 0.1, 0.5, 0.97])
@pytest.mark.parametrize("sigma", [0.4, 1.1, 4.0, 60.0])
def test_agrees_with_opacus_to_round_off(q: float, sigma: float) -> None:
    """Same values as Opacus' compute_rdp (relative 1e-10, or 1e-12 absolute: Opacus' round-off on long alternating series, see below), same ∞ and NaN orders."""
    opacus = np.asarray(_opacus_rdp().compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=ORDERS))
    ours = rdp_curve(q, sigma, ORDERS)
    assert np.array_equal(np.isnan(ours), np.isnan(opacus)) and np.array_equal(np.isinf(ours), np.isinf(opacus))
    finite = np.isfinite(opacus)
    assert finite.sum() > len(ORDERS) // 2
    np.testing.assert_allclose(ours[finite], opacus[finite], rtol=1e-10, atol=1e-12)


def test_edge_rates_and_noise() -> None:
    orders = [1.5, 2.0, 32.0]
    assert list(rdp_curve(0.0, 1.0, orders)) == [0.0, 0.0, 0.0]
    assert all(math.isinf(x) for x in rdp_curve(0.3, 0.0, orders))
    assert list(rdp_curve(1.0, 2.0, orders)) == [a / 8 for a in orders]  # α/(2σ²), no sampling


@pytest.mark.parametrize(("q", "sigma"), [(1e-5, 5.0), (0.01, 20.0), (0.5, 1.0), (0.2, 0.6)])
def test_integer_orders_match_the_binomial_sum_in_exact_arithmetic(q: float, sigma: float) -> None:
    """ρ(α) = log Σ_i C(α, i) q^i (1−q)^{α−i} e^{(i²−i)/(2σ²)} / (α − 1), evaluated in rationals, to round-off."""
    from fractions import Fraction

    orders = [2, 3, 5, 8, 16]
    ours = rdp_curve(q, sigma, [float(a) for a in orders])
    for alpha, value in zip(orders, ours, strict=True):
        fq = Fraction(q)
        # e^x is the one irrational factor: the sum is a polynomial in q with real weights, so sum exactly in
        # rationals around each weight's float value, then take one log
        total = sum(Fraction(math.comb(alpha, i)) * fq**i * (1 - fq) ** (alpha - i)
                    * Fraction(math.exp((i * i - i) / (2 * sigma**2))) for i in range(alpha + 1))
        exact = math.log1p(float(total - 1)) / (alpha - 1)
        assert value == pytest.approx(exact, rel=1e-9, abs=1e-15)


def test_rdp_epsilon_matches_opacus_accountant() -> None:
    """The accountant's RDP ε (add/remove) equals Opacus' RDPAccountant at the same orders, to 1e-12 relative."""
    from privacy.accountants import import_opacus

    import_opacus()
    from opacus.accountants import RDPAccountant

    for history in ([(1.1, 0.01, 1000)], [(0.8, 0.2, 30), (3.0, 1.0, 2)], [(5.0, 0.5, 7)]):
        acct = RDPAccountant()
        acct.history = list(history)
        theirs = acct.get_epsilon(1e-5, alphas=list(RDP_ORDERS))
        assert epsilon_of(history, 1e-5, "rdp", "add-remove") == pytest.approx(theirs, rel=1e-12)


def test_fractional_series_against_high_precision_where_opacus_accumulates_round_off() -> None:
    """α = 1.1 at q = 0.5, σ = 60: ~17,000 alternating terms. Summed in 30 digits (mpmath), the series (2) gives
    ρ to 1e-15; ours is within 1e-14 of it, where Opacus' term-by-term sum drifts by ~6e-13 (both far below
    what changes an ε)."""
    import mpmath as mp

    mp.mp.dps = 30
    q, sigma, alpha = mp.mpf("0.5"), mp.mpf(60), mp.mpf("1.1")
    z0 = sigma**2 * mp.log(1 / q - 1) + mp.mpf("0.5")
    total, i = mp.mpf(0), 0
    while True:
        coef, j = mp.binomial(alpha, i), alpha - i
        s0 = coef * q**i * (1 - q) ** j * mp.exp((i * i - i) / (2 * sigma**2)) * mp.erfc((i - z0) / (mp.sqrt(2) * sigma)) / 2
        s1 = coef * q**j * (1 - q) ** i * mp.exp((j * j - j) / (2 * sigma**2)) * mp.erfc((z0 - j) / (mp.sqrt(2) * sigma)) / 2
        total += s0 + s1
        i += 1
        if max(abs(s0), abs(s1)) < mp.exp(-30):
            break
    exact = float(mp.log(total) / (alpha - 1))
    assert abs(rdp_curve(0.5, 60.0, [1.1])[0] - exact) < 1e-14
