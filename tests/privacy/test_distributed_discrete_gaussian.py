"""The distributed discrete Gaussian's arithmetic: rotation, rounding, modulus, decoding, accounting.

The accounting is checked against independent computations: the exact Rényi divergence and
the exact privacy profile of a sum of discrete Gaussians (pmf by convolution in extended
precision), dp_accounting's continuous Gaussian, and dp_accounting's Poisson-subsampled
Gaussian. Statistical checks use fixed seeds; each would fail a correct implementation with
probability below 10⁻³ on a random seed.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import linalg, stats
from scipy.special import logsumexp

from privacy import ddg_accounting
from privacy import distributed_discrete_gaussian as ddg
from privacy.accountants import ADD_REMOVE, RDP_ORDERS, REPLACE_ONE
from privacy.discrete_gaussian import discrete_gaussian
from privacy.randomness import noise_source
from privacy.subsampled_rdp import poisson_subsampled_rdp

# ---------------------------------------------------------------------------------------
# Rotation
# ---------------------------------------------------------------------------------------


def test_rotation_is_the_randomised_hadamard_matrix_and_orthogonal():
    seed = b"members agree on this"
    d = 16
    matrix = np.column_stack([ddg.rotate(np.eye(d)[j], seed) for j in range(d)])
    expected = linalg.hadamard(d) @ np.diag(ddg.rotation_signs(seed, d)) / math.sqrt(d)
    assert np.allclose(matrix, expected, atol=1e-14)
    assert np.allclose(matrix.T @ matrix, np.eye(d), atol=1e-13)


def test_unrotate_inverts_rotate_and_norms_are_kept():
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000)
    y = ddg.rotate(x, b"seed")
    assert y.size == 1024
    assert abs(np.linalg.norm(y) - np.linalg.norm(x)) < 1e-11 * np.linalg.norm(x)
    assert np.max(np.abs(ddg.unrotate(y, b"seed", 1000) - x)) < 1e-12
    # a wrong seed does not invert it
    assert np.max(np.abs(ddg.unrotate(y, b"other", 1000) - x)) > 0.1


def test_signs_depend_only_on_the_seed_and_are_balanced():
    a, b = ddg.rotation_signs(b"s1", 4096), ddg.rotation_signs(b"s1", 4096)
    c = ddg.rotation_signs(b"s2", 4096)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert set(np.unique(a)) == {-1.0, 1.0}
    assert stats.binomtest(int((a < 0).sum()), a.size, 0.5).pvalue > 1e-3
    with pytest.raises(ValueError, match="seed"):
        ddg.rotation_signs(b"", 8)


def test_rotation_flattens_a_spike():
    """The point of rotating: a one-hot vector of norm c becomes ±c/√d' in every coordinate."""
    x = np.zeros(500)
    x[7] = 3.0
    y = ddg.rotate(x, b"k")
    assert np.allclose(np.abs(y), 3.0 / math.sqrt(512))


# ---------------------------------------------------------------------------------------
# Conditional randomised rounding
# ---------------------------------------------------------------------------------------


def _vector_of_norm(norm: float, dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=dim)
    return v / np.linalg.norm(v) * norm


def test_plain_rounding_always_meets_the_bound_and_is_unbiased():
    dim, norm = 256, 40.0
    bound_sq = math.floor(ddg.rounded_norm_bound(norm, dim, 0.0) ** 2)
    x = np.full(dim, norm / math.sqrt(dim))  # every coordinate 2.5: the worst case for the rounding's norm
    source = noise_source("seeded", 1)
    draws = np.array([ddg.conditional_round(x, bound_sq, source)[0] for _ in range(2000)])
    assert all(int(v @ v) <= bound_sq for v in draws)
    se = 0.5 / math.sqrt(len(draws))  # each coordinate rounds 2.5 to 2 or 3 with probability 1/2
    assert np.max(np.abs(draws.mean(axis=0) - x)) < 4.5 * se


def test_conditional_rounding_fails_one_try_with_probability_at_most_beta():
    dim, norm, beta = 1024, 30.0, math.exp(-0.5)
    bound = ddg.rounded_norm_bound(norm, dim, beta)
    assert bound < norm + math.sqrt(dim)  # the conditional bound is the tighter one here
    bound_sq = math.floor(bound**2)
    source = noise_source("seeded", 2)
    tries = [ddg.conditional_round(_vector_of_norm(norm, dim, s), bound_sq, source) for s in range(600)]
    assert all(int(v @ v) <= bound_sq for v, _ in tries)
    failures = sum(t - 1 for _, t in tries)  # Hoeffding: each try fails with probability <= β
    assert stats.binomtest(failures, failures + len(tries), beta, alternative="greater").pvalue > 1e-3


def test_an_unreachable_bound_raises_after_max_tries():
    with pytest.raises(ddg.ConditionalRoundingError, match="tries"):
        ddg.conditional_round(np.full(64, 0.5), 0, noise_source("seeded", 0), max_tries=5)


# ---------------------------------------------------------------------------------------
# Parameters, wrap-around, encoding and decoding
# ---------------------------------------------------------------------------------------


def _sum_of_members(params, updates, seed, source):
    inputs = [ddg.encode(x, params, seed, source)[0] for x in updates]
    return np.mod(np.sum(inputs, axis=0), params.modulus)


def test_wrap_around_stays_below_its_stated_bound():
    """Worst-case data (every member sends the same vector of norm c, so ‖Σx‖ = nc), b = 9 bits,
    a target of 0.3: the observed rate of sums with a coordinate outside [−M/2, M/2) must stay
    below the bound; at twice the scale the same simulation sees wrap-around (it can detect it)."""
    n, dim = 4, 60
    params = ddg.ddg_parameters(clip=1.0, dim=dim, bits=9, noise_multiplier=0.5, noise_shares=n,
                                max_members=n, wrap_probability_target=0.3)
    assert params.wrap_probability <= 0.3
    x = _vector_of_norm(1.0, dim, 0)
    source = noise_source("seeded", 3)

    def wraps(p, trials):
        count = 0
        for t in range(trials):
            seed = t.to_bytes(4, "big")  # a fresh rotation per sum, independent of the data
            y = ddg.rotate(x * p.scale, seed)
            total = sum(ddg.conditional_round(y, p.norm_bound_sq, source)[0]
                        + discrete_gaussian(y.size, p.local_sigma_sq, source) for _ in range(n))
            count += bool(np.any((total < -p.modulus // 2) | (total >= p.modulus // 2)))
        return count

    trials = 400
    observed = wraps(params, trials)
    assert stats.binomtest(observed, trials, params.wrap_probability, alternative="greater").pvalue > 1e-3
    doubled = ddg.DDGParameters(**{**params.__dict__, "scale": 2 * params.scale,
                                   "norm_bound_sq": 4 * params.norm_bound_sq + 8 * dim})
    assert wraps(doubled, 100) > 50


def test_decoding_returns_the_sum_plus_noise_of_the_predicted_size():
    n, dim = 5, 3000
    params = ddg.ddg_parameters(clip=2.0, dim=dim, bits=16, noise_multiplier=1.0, noise_shares=n, max_members=n)
    rng = np.random.default_rng(4)
    updates = [rng.normal(size=dim) * 0.02 for _ in range(n)]
    updates[0] = updates[0] * 1000  # far beyond the clip: must arrive clipped to norm 2
    clipped = [u * min(1.0, 2.0 / np.linalg.norm(u)) for u in updates]
    total = _sum_of_members(params, updates, b"round 7", noise_source("seeded", 5))
    error = ddg.decode(total, params, b"round 7") - np.sum(clipped, axis=0)
    # per rotated coordinate: n discrete Gaussians (variance <= σ²) and n roundings (variance <= 1/4)
    predicted = math.sqrt(n * float(params.local_sigma_sq) + n / 4) / params.scale
    assert abs(float(np.mean(error))) < 4 * predicted / math.sqrt(dim)
    assert 0.95 * predicted < float(np.std(error)) < 1.05 * predicted  # ±1.3% standard error
    # the noise is the central N(0, z²c²) = N(0, 4) the parameters were asked for, within rounding up of σ²
    assert abs(predicted - 2.0) < 0.01


def test_encode_reports_clipping_and_refuses_a_wrong_length():
    params = ddg.ddg_parameters(clip=1.0, dim=10, bits=12, noise_multiplier=1.0, noise_shares=2, max_members=2)
    source = noise_source("seeded", 6)
    vector, info = ddg.encode(np.full(10, 5.0), params, b"s", source)
    assert info["clipped"] == 1.0 and vector.size == 16
    assert np.all((vector >= 0) & (vector < params.modulus))
    with pytest.raises(ValueError, match="10 finite coordinates"):
        ddg.encode(np.ones(9), params, b"s", source)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"bits": 4}, "raise bits"),
    ({"bits": 1}, "bits must"),
    ({"bits": 40}, "bits must"),
    ({"beta": 1.0}, "beta"),
    ({"clip": 0.0}, "clip"),
    ({"noise_multiplier": float("nan")}, "noise_multiplier"),
    ({"max_members": 0}, "max_members"),
    ({"wrap_probability_target": 0.0}, "wrap_probability_target"),
])
def test_bad_parameters_are_refused_with_the_knob_named(kwargs, match):
    base = {"clip": 1.0, "dim": 100, "bits": 16, "noise_multiplier": 1.0, "noise_shares": 10, "max_members": 10}
    with pytest.raises(ValueError, match=match):
        ddg.ddg_parameters(**{**base, **kwargs})


# ---------------------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------------------


def _log_pmf_of_sum(sigma_sq: float, shares: int, reach: int) -> np.ndarray:
    """log P[Σ of ``shares`` iid N_Z(0, σ²) = z] for z = −shares·reach … shares·reach, exactly up to
    long-double rounding (the truncation at ±reach per share removes less than e^{−reach²/(2σ²)})."""
    x = np.arange(-reach, reach + 1, dtype=np.longdouble)
    p = np.exp(-x * x / (2 * np.longdouble(sigma_sq)))
    p /= p.sum()
    total = p
    for _ in range(shares - 1):
        total = np.convolve(total, p)
    with np.errstate(divide="ignore"):
        return np.log(total).astype(np.float64)


def _exact_renyi(sigma_sq: float, shares: int, shift: int, alpha: float) -> float:
    """D_α(Z + Δ ‖ Z) for Z a sum of discrete Gaussians, Δ = ``shift``, by direct summation."""
    reach = int(math.ceil(alpha * shift / shares + 15 * math.sqrt(sigma_sq) + 15))
    log_q = _log_pmf_of_sum(sigma_sq, shares, reach)
    log_p = log_q[:-shift]  # P[Z + Δ = z] = P[Z = z − Δ]
    terms = alpha * log_p + (1 - alpha) * log_q[shift:]
    return float(logsumexp(terms[np.isfinite(terms)])) / (alpha - 1)


@pytest.mark.parametrize("sigma", [0.5, 0.75, 1.0, 1.5])
@pytest.mark.parametrize("shares", [1, 2, 5])
def test_the_bound_holds_for_the_exact_renyi_divergence_of_a_sum(sigma, shares):
    """Eq. (1) in one dimension against D_α computed from the pmf of the sum itself."""
    for shift in (1, 3):
        for alpha in (1.5, 2.0, 8.0):
            exact = _exact_renyi(sigma * sigma, shares, shift, alpha)
            bound = float(ddg_accounting.rdp_of_sum([alpha], l2_sensitivity=shift, l1_sensitivity=shift,
                                         local_sigma_sq=sigma * sigma, dim=1, min_shares=shares)[0])
            assert exact <= bound * (1 + 1e-9) + 1e-12, (shift, alpha, exact, bound)
            if shares == 1:  # one discrete Gaussian (τ = 0): D_α = αΔ²/(2σ²)·θ(αΔ)/θ(0) <= αΔ²/(2σ²),
                gaussian = alpha * shift**2 / (2 * sigma * sigma)  # with θ(a) = Σ_x e^{−(x−a)²/(2σ²)}
                assert bound == pytest.approx(gaussian, rel=1e-12)
                if float(alpha * shift).is_integer():  # θ(αΔ) = θ(0): equality (CKS)
                    assert exact == pytest.approx(gaussian, rel=1e-9)


def _exact_epsilon(sigma_sq: float, shares: int, shift: int, delta: float) -> float:
    """The smallest ε with δ(ε) <= δ for Z + Δ vs Z, one dimension, from the exact pmf."""
    reach = int(15 * math.sqrt(sigma_sq) + 15 + shift)
    log_q = _log_pmf_of_sum(sigma_sq, shares, reach)
    p, q = np.exp(log_q[:-shift]), np.exp(log_q[shift:])  # P[Z+Δ = z] and P[Z = z] on the same z

    def delta_of(eps: float) -> float:  # the symmetric pair: one direction suffices
        return float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0)))

    low, high = 0.0, 1.0
    while delta_of(high) > delta:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if delta_of(mid) <= delta else (mid, high)
    return high


def test_epsilon_is_an_upper_bound_on_the_exact_privacy_profile():
    """Replace-one in one dimension: a member's rounded input moves within ±B, so Δ = 2B;
    the exact (ε, δ) of N_Z-sum + Δ vs N_Z-sum lies below the bound, and not far below."""
    sigma_sq, shares, delta = 9.0, 3, 1e-5
    norm_bound_sq = 4  # B = 2, so Δ = 4 under replace-one
    ours = ddg_accounting.ddg_epsilon(local_sigma_sq=sigma_sq, norm_bound_sq=norm_bound_sq, padded_dim=1,
                           min_shares=shares, rounds=1, delta=delta)
    exact = _exact_epsilon(sigma_sq, shares, 4, delta)
    assert exact <= ours <= 1.5 * exact


def test_large_sigma_approaches_the_continuous_gaussian():
    """τ vanishes and eq. (1) becomes the Gaussian's α‖Δ‖²/(2nσ²): the same ε as dp_accounting's
    RDP accountant on the Gaussian mechanism with multiplier √n·σ/Δ₂ at the same orders."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    norm_bound_sq, padded, shares, rounds, delta = 10**8, 2**17, 10, 50, 1e-5
    sigma_sq = Fraction(4 * 10**8)  # per share; central σ = √10·2·10⁴ against Δ₂ = 2·10⁴
    ours = ddg_accounting.ddg_epsilon(local_sigma_sq=sigma_sq, norm_bound_sq=norm_bound_sq, padded_dim=padded,
                           min_shares=shares, rounds=rounds, delta=delta)
    l2, _ = ddg_accounting.sensitivities(norm_bound_sq, padded, REPLACE_ONE)
    accountant = rdp.RdpAccountant(orders=list(RDP_ORDERS))
    multiplier = math.sqrt(shares * float(sigma_sq)) / l2
    accountant.compose(dp_accounting.GaussianDpEvent(multiplier), rounds)
    assert ours == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
    # and at a small σ the discreteness costs something: τ·d' > 0 makes ε larger than the Gaussian's
    small = ddg_accounting.ddg_epsilon(local_sigma_sq=Fraction(1, 4), norm_bound_sq=1, padded_dim=padded,
                            min_shares=shares, rounds=1, delta=delta)
    gaussian = rdp.RdpAccountant(orders=list(RDP_ORDERS))
    gaussian.compose(dp_accounting.GaussianDpEvent(math.sqrt(shares / 4) / 2))
    assert small > gaussian.get_epsilon(delta) + 1


def test_epsilon_is_monotone_in_every_knob():
    base = {"local_sigma_sq": Fraction(3), "norm_bound_sq": 40, "padded_dim": 64, "min_shares": 5,
            "rounds": 10, "delta": 1e-5}
    eps = ddg_accounting.ddg_epsilon(**base)
    assert ddg_accounting.ddg_epsilon(**{**base, "local_sigma_sq": Fraction(4)}) < eps
    assert ddg_accounting.ddg_epsilon(**{**base, "rounds": 20}) > eps
    assert ddg_accounting.ddg_epsilon(**{**base, "norm_bound_sq": 60}) > eps
    assert ddg_accounting.ddg_epsilon(**{**base, "min_shares": 8, "max_shares": 8}) < eps
    small = {**base, "local_sigma_sq": Fraction(1, 2)}  # where τ is visible: it grows with the most shares
    assert ddg_accounting.ddg_epsilon(**{**small, "max_shares": 50}) > ddg_accounting.ddg_epsilon(**small)
    assert ddg_accounting.ddg_epsilon(**{**base, "relation": ADD_REMOVE}) < eps
    assert ddg_accounting.ddg_epsilon(**{**base, "rounds": 0}) == 0.0


def test_a_range_of_shares_is_bounded_by_its_ends():
    """Eq. (1) at n_min with τ(n_max) is above eq. (1) at every n in between."""
    orders = np.array([1.5, 4.0, 32.0])
    common = {"l2_sensitivity": 3.0, "l1_sensitivity": 9.0, "local_sigma_sq": 0.6, "dim": 8}
    envelope = ddg_accounting.rdp_of_sum(orders, min_shares=3, max_shares=9, **common)
    for n in range(3, 10):
        assert np.all(ddg_accounting.rdp_of_sum(orders, min_shares=n, **common) <= envelope)


def test_subsampling_bound_lies_between_the_exact_gaussian_and_no_sampling():
    """Zhu & Wang's general bound, fed the Gaussian's RDP (τ = 0 at σ = 10), against
    dp_accounting's exact RDP of the Poisson-subsampled Gaussian (add-remove)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    sigma_sq, norm_bound_sq, q, rounds, delta = Fraction(100), 100, 0.05, 200, 1e-5  # multiplier 1
    kw = {"local_sigma_sq": sigma_sq, "norm_bound_sq": norm_bound_sq, "padded_dim": 1, "min_shares": 1,
          "rounds": rounds, "delta": delta, "relation": ADD_REMOVE}
    ours = ddg_accounting.ddg_epsilon(sample_rate=q, **kw)
    exact = rdp.RdpAccountant(orders=list(ddg_accounting.SUBSAMPLED_ORDERS))
    exact.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.0)), rounds)
    assert exact.get_epsilon(delta) <= ours < ddg_accounting.ddg_epsilon(sample_rate=1.0, **kw)
    assert ours < 1.5 * exact.get_epsilon(delta)  # the factor 3 costs little at these orders
    with pytest.raises(ValueError, match="add-remove"):
        ddg_accounting.ddg_epsilon(**{**kw, "relation": REPLACE_ONE, "sample_rate": q})


def test_smallest_sigma_reaches_the_target_and_one_less_does_not():
    kw = {"delta": 1e-5, "rounds": 30, "norm_bound_sq": 10**6, "padded_dim": 2**10, "min_shares": 20}
    sigma_sq = ddg_accounting.smallest_local_sigma_sq(epsilon=4.0, **kw)
    assert sigma_sq.denominator == 1
    assert ddg_accounting.ddg_epsilon(local_sigma_sq=sigma_sq, **kw) <= 4.0 < ddg_accounting.ddg_epsilon(local_sigma_sq=sigma_sq - 1, **kw)
    assert ddg_accounting.smallest_local_sigma_sq(epsilon=8.0, **kw) < sigma_sq


def test_accounting_refuses_what_the_theorem_does_not_cover():
    with pytest.raises(ValueError, match="sigma >= 1/2"):
        ddg_accounting.rdp_of_sum([2.0], l2_sensitivity=1, l1_sensitivity=1, local_sigma_sq=0.2, dim=1, min_shares=2)
    with pytest.raises(ValueError, match="relation"):
        ddg_accounting.sensitivities(10, 8, "nearby")
    with pytest.raises(ValueError, match="integer orders"):
        poisson_subsampled_rdp([1.5], lambda a: a, 0.5)  # the subsampled bound ddg_epsilon uses


def test_tau_is_zero_for_one_share_and_grows_with_shares():
    assert ddg_accounting.tau(0.25, 1) == 0.0
    values = [ddg_accounting.tau(0.5, n) for n in (2, 5, 50)]
    assert 0 < values[0] < values[1] < values[2]
    assert ddg_accounting.tau(25.0, 1000) < 1e-100  # σ = 5: 10·Σ e^{−2π²·25·k/(k+1)} ≈ 7·10⁻¹⁰⁷
