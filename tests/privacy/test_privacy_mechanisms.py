"""privacy.mechanisms: clipping bounds the norm, noise has the promised law, seeds repeat."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privacy.mechanisms.gaussian import (
    CLIPPED,
    NOISE_STD,
    NON_FINITE,
    UPDATE_NORM,
    clip_update,
    gaussian_noise_like,
    l2_norm,
    local_noise_multiplier,
    privatize_update,
)

SHAPES = [(3, 4), (7,), (2, 2, 2)]


def _update(rng: np.random.Generator, scale: float, dtype: type = np.float64) -> list[np.ndarray]:
    return [(rng.standard_normal(s) * scale).astype(dtype) for s in SHAPES]


def test_l2_norm_is_global_norm() -> None:
    rng = np.random.default_rng(0)
    update = _update(rng, 3.0)
    flat = np.concatenate([a.ravel() for a in update])
    assert l2_norm(update) == pytest.approx(float(np.sqrt(flat @ flat)), rel=1e-12)
    assert l2_norm([]) == 0.0
    assert l2_norm([np.full(4, 1e200)]) == pytest.approx(2e200)  # no overflow in squares


def test_l2_norm_of_a_model_sized_update_matches_an_exact_sum() -> None:
    """At the size of the small CNN's layers (up to 16,384 entries, where BLAS would thread) the norm is the
    correctly rounded sqrt(Σ x²) up to a few ulps (math.fsum: an exact sum of the float64 squares)."""
    rng = np.random.default_rng(5)
    update = [rng.standard_normal(s).astype(np.float32) for s in [(16, 1, 8, 8), (16,), (32, 16, 4, 4), (32, 512)]]
    exact = math.sqrt(math.fsum(float(v) ** 2 for a in update for v in a.astype(np.float64).ravel()))
    assert l2_norm(update) == pytest.approx(exact, rel=1e-13)
    overflowing = [np.full(20_000, 1e300), np.full(3, -1e300)]
    assert l2_norm(overflowing) == pytest.approx(1e300 * math.sqrt(20_003), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_clip_bounds_norm_and_keeps_direction(dtype: type) -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        clip = float(rng.uniform(0.01, 5.0))
        update = _update(rng, float(rng.choice([0.01, 1.0, 100.0])), dtype)
        norm = l2_norm(update)
        clipped, reported = clip_update(update, clip)
        assert reported == pytest.approx(norm, rel=1e-12)
        assert l2_norm(clipped) <= clip + 1e-9
        assert [c.shape for c in clipped] == [a.shape for a in update]
        assert all(c.dtype == np.dtype(dtype) for c in clipped)
        if norm <= clip:  # unchanged
            assert all(np.array_equal(c, a) for c, a in zip(clipped, update, strict=True))
        else:  # on the sphere of radius C, same direction
            rtol = 1e-12 if dtype is np.float64 else 10 * float(np.finfo(dtype).eps)
            assert l2_norm(clipped) == pytest.approx(clip, rel=rtol)
            u = np.concatenate([a.ravel() for a in update]).astype(np.float64)
            c = np.concatenate([a.ravel() for a in clipped]).astype(np.float64)
            cosine = (u @ c) / (np.linalg.norm(u) * np.linalg.norm(c))
            assert cosine == pytest.approx(1.0, abs=1e-6 if dtype is not np.float16 else 1e-3)


def test_clip_returns_copies_and_handles_zero() -> None:
    zero = [np.zeros((2, 3)), np.zeros(4)]
    clipped, norm = clip_update(zero, 1.0)
    assert norm == 0.0 and all(not c.any() for c in clipped)
    clipped[0][0, 0] = 5.0
    assert zero[0][0, 0] == 0.0  # the input is never modified or aliased


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, float("nan"), True])
def test_clip_rejects_bad_bound(bad: float) -> None:
    with pytest.raises(ValueError, match="max_norm"):
        clip_update([np.ones(3)], bad)


def test_clip_rejects_non_finite_and_non_float() -> None:
    with pytest.raises(ValueError, match="finite"):
        clip_update([np.array([1.0, np.nan])], 1.0)
    with pytest.raises(TypeError, match=r"update\[0\]"):
        clip_update([np.arange(3)], 1.0)
    with pytest.raises(TypeError, match="sequence"):
        clip_update(np.ones(3), 1.0)  # type: ignore[arg-type]


def test_noise_std_mean_and_independence() -> None:
    """200k draws: the sample std is within 2 % (its own sd is 0.16 %), mean ≈ 0."""
    std = 0.37
    arrays = [np.zeros((400, 250), dtype=np.float64), np.zeros(50_000, dtype=np.float32)]
    noise = gaussian_noise_like(arrays, std, np.random.default_rng(2))
    assert [n.dtype for n in noise] == [np.float64, np.float32]
    flat = np.concatenate([n.ravel().astype(np.float64) for n in noise])
    assert flat.std() == pytest.approx(std, rel=0.02)
    assert abs(flat.mean()) < 5 * std / math.sqrt(flat.size)
    # no correlation between consecutive coordinates or between arrays
    assert abs(np.corrcoef(flat[:-1], flat[1:])[0, 1]) < 0.01


def test_noise_is_reproducible_by_seed_only() -> None:
    arrays = [np.zeros((5, 5)), np.zeros(3, dtype=np.float32)]
    a = gaussian_noise_like(arrays, 1.0, np.random.default_rng(7))
    b = gaussian_noise_like(arrays, 1.0, np.random.default_rng(7))
    c = gaussian_noise_like(arrays, 1.0, np.random.default_rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    assert all(not z.any() for z in gaussian_noise_like(arrays, 0.0, np.random.default_rng(7)))


def test_noise_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="std"):
        gaussian_noise_like([np.zeros(2)], -1.0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        gaussian_noise_like([np.zeros(2)], 1.0, np.random.RandomState(0))  # type: ignore[arg-type]


@pytest.mark.parametrize("shares", [1, 4, 25])
def test_privatize_noise_is_sigma_c_over_sqrt_m(shares: int) -> None:
    clip, sigma = 0.5, 1.3
    update = [np.zeros(60_000)]
    update[0][0] = 10.0  # norm 10 > C: clipped to C on the first coordinate
    noisy, diag = privatize_update(
        update, clip=clip, noise_multiplier=sigma, noise_shares=shares,
        rng=np.random.default_rng(3),
    )
    expected = sigma * clip / math.sqrt(shares)
    assert diag == {UPDATE_NORM: 10.0, CLIPPED: 1.0, NOISE_STD: pytest.approx(expected), NON_FINITE: 0.0}
    assert noisy[0][1:].std() == pytest.approx(expected, rel=0.02)
    # the signal is the clipped update: noisy − noise = clip(u)
    noise = gaussian_noise_like(update, expected, np.random.default_rng(3))
    assert noisy[0][0] - noise[0][0] == pytest.approx(clip)


def test_privatize_sum_of_m_shares_has_std_sigma_c() -> None:
    """m clients' shares add up to one release with multiplier σ (secure-aggregation view)."""
    clip, sigma, shares = 1.0, 0.8, 16
    total = np.zeros(20_000)
    for client in range(shares):
        noisy, _ = privatize_update(
            [np.zeros(20_000)], clip=clip, noise_multiplier=sigma, noise_shares=shares,
            rng=np.random.default_rng([11, client]),
        )
        total += noisy[0]
    assert total.std() == pytest.approx(sigma * clip, rel=0.02)


def test_privatize_clip_only_and_unclipped() -> None:
    update = [np.full(4, 0.1, dtype=np.float32)]
    out, diag = privatize_update(
        update, clip=1.0, noise_multiplier=0.0, noise_shares=1, rng=np.random.default_rng(0)
    )
    assert np.array_equal(out[0], update[0]) and out[0].dtype == np.float32
    assert diag[CLIPPED] == 0.0 and diag[NOISE_STD] == 0.0
    assert diag[UPDATE_NORM] == pytest.approx(0.2, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"clip": 0.0}, "clip"), ({"noise_multiplier": -1.0}, "noise_multiplier"),
     ({"noise_shares": 0}, "noise_shares"), ({"noise_shares": 2.0}, "noise_shares")],
)
def test_privatize_validates(kwargs: dict[str, float], name: str) -> None:
    args: dict[str, object] = {"clip": 1.0, "noise_multiplier": 1.0, "noise_shares": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        privatize_update(
            [np.ones(2)], rng=np.random.default_rng(0), **args  # type: ignore[arg-type]
        )


def test_local_noise_multiplier() -> None:
    assert local_noise_multiplier(2.0, 1) == 2.0
    assert local_noise_multiplier(2.0, 4) == 1.0
    assert local_noise_multiplier(0.0, 9) == 0.0
    with pytest.raises(ValueError, match="noise_shares"):
        local_noise_multiplier(1.0, 0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_update_is_released_as_the_zero_update(bad: float) -> None:
    """Training that diverges must not be told apart by a refusal: the update that holds NaN or inf is
    replaced by the zero update (a point of the C-ball, data-independent), then noised as any other, so
    the release is the one a zero update makes with the same noise, and the sensitivity stays 2C."""
    rng = np.random.default_rng(4)
    diverged = _update(rng, 1.0)
    diverged[1][3] = bad
    zero = [np.zeros_like(a) for a in diverged]
    released, diag = privatize_update(diverged, clip=1.5, noise_multiplier=2.0, noise_shares=1,
                                      rng=np.random.default_rng(9))
    expected, zero_diag = privatize_update(zero, clip=1.5, noise_multiplier=2.0, noise_shares=1,
                                           rng=np.random.default_rng(9))
    assert all(np.array_equal(a, b) for a, b in zip(released, expected, strict=True))
    assert all(np.isfinite(a).all() for a in released)
    assert diag[NON_FINITE] == 1.0 and zero_diag[NON_FINITE] == 0.0
    assert all(math.isfinite(v) for v in diag.values())  # a reply's metrics must be finite to be accepted


def test_the_diagnostics_are_the_wire_keys_the_reply_carries() -> None:
    """privacy/ sits below protocol/ and cannot import its keys: the two spellings must agree."""
    from protocol import keys

    assert (UPDATE_NORM, CLIPPED, NON_FINITE) == (keys.UPDATE_NORM, keys.CLIPPED, keys.NON_FINITE_UPDATE)
    assert {UPDATE_NORM, CLIPPED, NON_FINITE} <= set(keys.UNCOVERED_TRAIN_METRICS)
