"""Properties of the WeiAvg, PFA and PFA+ maths in ``strategies/pfa_projection.py``.

Expected values come from independent numpy computations or from mathematical
properties (idempotence, orthogonality, brute force), never from hard-coded results.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest

from protocol import pfa_plus
from strategies import layers, pfa_plus_projection, pfa_split, pfa_subspace
from strategies import pfa_projection as pfa

SHAPES = [(6, 4), (4,), (2, 3, 2)]  # a dense weight, its bias, a small conv kernel


def _updates(rng: np.random.Generator, m: int, shapes=SHAPES, dtype=np.float64):
    return [[rng.normal(size=s).astype(dtype) for s in shapes] for _ in range(m)]


def _weiavg(updates, eps):
    """Independent WeiAvg: Σ_m ε_m Δ_m / Σ ε, layer by layer."""
    eps = np.asarray(eps, dtype=np.float64)
    return [
        sum(
            e * np.asarray(u[layer], dtype=np.float64)
            for e, u in zip(eps, updates, strict=True)
        )
        / eps.sum()
        for layer in range(len(updates[0]))
    ]


def _projector(basis: np.ndarray) -> np.ndarray:
    return basis @ basis.T


# --- projection -----------------------------------------------------------------------


@pytest.mark.parametrize("center", [False, True])
@pytest.mark.parametrize("method", pfa_subspace.SUBSPACE_METHODS)
def test_projection_is_idempotent_with_orthogonal_residual(center, method):
    rng = np.random.default_rng(0)
    public = rng.normal(size=(5, 40))
    sub = pfa_subspace.fit_layer_subspace(public, 3, center=center, method=method)
    basis, mu = sub.basis, sub.center
    assert basis.shape == (40, 3)
    np.testing.assert_allclose(basis.T @ basis, np.eye(3), atol=1e-12)

    x = rng.normal(size=(7, 40))
    px = pfa_subspace.project(x, basis, center=mu)
    np.testing.assert_allclose(pfa_subspace.project(px, basis, center=mu), px, atol=1e-12)
    offset = 0.0 if mu is None else mu
    residual = x - px
    np.testing.assert_allclose(residual @ basis, 0.0, atol=1e-12)
    # px - μ lies in span(V), and a single vector projects like a row of the stack
    np.testing.assert_allclose(
        (px - offset) @ (np.eye(40) - _projector(basis)), 0.0, atol=1e-12
    )
    np.testing.assert_allclose(pfa_subspace.project(x[2], basis, center=mu), px[2], atol=1e-12)


def test_centred_subspace_is_pca_of_public_updates():
    rng = np.random.default_rng(1)
    public = rng.normal(size=(4, 30))
    sub = pfa_subspace.fit_layer_subspace(public, 2, center=True)
    np.testing.assert_allclose(sub.center, public.mean(axis=0))
    # independent: top eigenvectors of the centred scatter matrix
    centred = public - public.mean(axis=0)
    vals, vecs = np.linalg.eigh(centred.T @ centred)
    top = vecs[:, np.argsort(vals)[::-1][:2]]
    np.testing.assert_allclose(_projector(sub.basis), _projector(top), atol=1e-10)


def test_single_public_client_is_not_centred():
    rng = np.random.default_rng(2)
    public = rng.normal(size=(1, 25))
    sub = pfa_subspace.fit_layer_subspace(public, 1, center=True)
    assert sub.center is None
    np.testing.assert_allclose(
        np.abs(sub.basis[:, 0]), np.abs(public[0]) / np.linalg.norm(public[0])
    )


def test_k_is_clipped_to_the_rank_with_a_logged_note(caplog):
    rng = np.random.default_rng(3)
    public = rng.normal(size=(3, 50))
    with caplog.at_level(logging.INFO, logger=pfa_subspace.__name__):
        centred = pfa_subspace.public_subspace(public, 5, center=True)
    uncentred = pfa_subspace.public_subspace(public, 5, center=False)
    assert centred.shape == (50, 2)  # rank ≤ n_pub − 1 after centring
    assert uncentred.shape == (50, 3)
    assert "exceeds the rank 2" in caplog.text


@pytest.mark.parametrize("center", [False, True])
def test_randomized_subspace_spans_the_exact_one_given_a_spectral_gap(center):
    rng = np.random.default_rng(4)
    n, d, r = 40, 500, 3
    left = np.linalg.qr(rng.normal(size=(n, r)))[0]
    right = np.linalg.qr(rng.normal(size=(d, r)))[0]
    matrix = left @ np.diag([100.0, 80.0, 60.0]) @ right.T + 1e-3 * rng.normal(
        size=(n, d)
    )
    exact = pfa_subspace.public_subspace(matrix, r, center=center, method="exact")
    randomized = pfa_subspace.public_subspace(
        matrix, r, center=center, method="randomized", seed=7
    )
    assert randomized.shape == exact.shape == (d, r)
    assert np.linalg.norm(_projector(exact) - _projector(randomized), 2) < 1e-6


# --- PFA ------------------------------------------------------------------------------


@pytest.mark.parametrize("center", [False, True])
def test_pfa_equals_weiavg_when_public_updates_span_the_private_ones(center):
    rng = np.random.default_rng(5)
    n_pub, n_pri, d = 4, 9, 60
    public = rng.normal(size=(n_pub, d))
    coef = rng.normal(size=(n_pri, n_pub))
    if (
        center
    ):  # the centred subspace is affine: private rows must be affine combinations
        coef /= coef.sum(axis=1, keepdims=True)
    private = coef @ public
    eps_pub, eps_pri = rng.uniform(5, 10, n_pub), rng.uniform(0.1, 1, n_pri)

    got, sub = pfa.pfa_aggregate_layer(
        public, private, eps_pub, eps_pri, k=n_pub, center=center
    )
    e_pub, e_pri = eps_pub.sum(), eps_pri.sum()
    pub_mean = eps_pub @ public / e_pub
    pri_mean = eps_pri @ private / e_pri
    expected = (e_pub * pub_mean + e_pri * pri_mean) / (e_pub + e_pri)
    np.testing.assert_allclose(got, expected, atol=1e-10)
    np.testing.assert_allclose(
        got,
        _weiavg([[r] for r in [*public, *private]], [*eps_pub, *eps_pri])[0],
        atol=1e-10,
    )


@pytest.mark.parametrize("center", [False, True])
def test_pfa_equals_weiavg_when_k_is_the_full_dimension(center):
    rng = np.random.default_rng(6)
    d, m = 3, 12
    updates = _updates(rng, m, shapes=[(d,)])
    eps = np.concatenate([rng.uniform(5, 10, 5), rng.uniform(0.1, 1, m - 5)])
    public_mask = np.arange(m) < 5  # 5 public rows span R^3 even after centring
    got, subspaces, _ = pfa.pfa_aggregate(
        updates, eps, k=d, public_mask=public_mask, center=center
    )
    assert subspaces[0].k == d
    np.testing.assert_allclose(got[0], _weiavg(updates, eps)[0], atol=1e-12)


@pytest.mark.parametrize("center", [False, True])
def test_pfa_aggregate_matches_an_independent_computation(center):
    rng = np.random.default_rng(7)
    m = 20
    updates = _updates(rng, m)
    eps = rng.uniform(0.1, 1.0, m)
    eps[[3, 11]] = [9.0, 10.0]  # top 10% of 20 = 2 public clients
    got, subspaces, diag = pfa.pfa_aggregate(updates, eps, k=1, center=center)
    pub, pri = [3, 11], [i for i in range(m) if i not in (3, 11)]
    e_pub, e_pri = eps[pub].sum(), eps[pri].sum()
    for layer, shape in enumerate(SHAPES):
        rows = np.stack([u[layer].ravel() for u in updates])
        a = rows[pub]
        mu = a.mean(axis=0) if center else np.zeros(a.shape[1])
        v = np.linalg.svd(a - mu)[2][0]  # top right singular vector, independently
        pri_mean = eps[pri] @ rows[pri] / e_pri
        projected = mu + v * (v @ (pri_mean - mu))
        expected = (eps[pub] @ rows[pub] + e_pri * projected) / (e_pub + e_pri)
        assert got[layer].shape == shape
        np.testing.assert_allclose(got[layer].ravel(), expected, atol=1e-12)
        assert subspaces[layer].shape == shape
    assert diag[pfa.DIAG_NUM_PUBLIC] == 2 and diag[pfa.DIAG_NUM_PRIVATE] == 18
    assert diag[pfa.DIAG_PUBLIC_WEIGHT] == pytest.approx(e_pub / (e_pub + e_pri))
    assert 0.0 <= diag[pfa.DIAG_PRIVATE_ENERGY_KEPT] <= 1.0


def test_pfa_keeps_float32_layers_float32():
    rng = np.random.default_rng(8)
    updates = _updates(rng, 10, dtype=np.float32)
    got, _, _ = pfa.pfa_aggregate(updates, rng.uniform(1, 10, 10))
    assert [g.dtype for g in got] == [np.float32] * len(SHAPES)


def test_no_public_client_falls_back_to_weiavg():
    rng = np.random.default_rng(9)
    updates = _updates(rng, 6)
    eps = rng.uniform(0.5, 5, 6)
    got, subspaces, diag = pfa.pfa_aggregate(updates, eps, public_mask=[False] * 6)
    for g, w in zip(got, _weiavg(updates, eps), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-12)
    assert subspaces == [] and diag[pfa.DIAG_FALLBACK_WEIAVG] == 1.0
    with pytest.raises(ValueError, match="no public client"):
        pfa.pfa_aggregate(updates, eps, public_mask=[False] * 6, no_public="error")


def test_no_private_client_gives_the_weighted_public_mean():
    rng = np.random.default_rng(10)
    updates = _updates(rng, 4)
    eps = [10.0, 10.0, 10.0, 10.0]  # all tied: top-fraction makes everyone public
    got, subspaces, diag = pfa.pfa_aggregate(updates, eps, k=2)
    assert diag[pfa.DIAG_NUM_PRIVATE] == 0 and len(subspaces) == len(SHAPES)
    for g, w in zip(got, _weiavg(updates, eps), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-12)


def test_weiavg_weights_and_weighted_mean():
    eps = np.array([0.5, 1.5, 8.0])
    w = pfa.weiavg_weights(eps)
    np.testing.assert_allclose(w, eps / eps.sum())
    assert w.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(11)
    updates = _updates(rng, 3)
    for g, e in zip(
        layers.weighted_mean(updates, 7 * eps), _weiavg(updates, eps), strict=True
    ):
        np.testing.assert_allclose(g, e, atol=1e-12)  # weights are normalised


# --- PFA+ -----------------------------------------------------------------------------


@pytest.mark.parametrize("center", [False, True])
def test_pfa_plus_reconstruction_equals_pfa_projection_on_the_same_subspace(center):
    rng = np.random.default_rng(12)
    m, k = 15, 2
    updates = _updates(rng, m)
    eps = np.concatenate([[8.0, 9.0, 10.0], rng.uniform(0.1, 1, m - 3)])
    mask = np.arange(m) < 3
    expected, subspaces, _ = pfa.pfa_aggregate(
        updates, eps, k=k, public_mask=mask, center=center
    )

    public = [u for u, p in zip(updates, mask, strict=True) if p]
    coords = [
        [
            pfa_plus.encode_coordinates(layer, s.basis, center=s.center)
            for layer, s in zip(u, subspaces, strict=True)
        ]
        for u, p in zip(updates, mask, strict=True)
        if not p
    ]
    got, new_subspaces, _ = pfa_plus_projection.pfa_plus_aggregate(
        public, coords, eps[mask], eps[~mask], subspaces, k=k, center=center
    )
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-12)
    for new, old in zip(
        new_subspaces, subspaces, strict=True
    ):  # same public updates, same subspace
        np.testing.assert_allclose(new.basis, old.basis, atol=1e-12)


@pytest.mark.parametrize("center", [False, True])
def test_decoded_mean_coordinates_equal_the_projected_mean(center):
    rng = np.random.default_rng(13)
    sub = pfa_subspace.fit_layer_subspace(rng.normal(size=(4, 30)), 3, center=center)
    x = rng.normal(size=(6, 30))
    w = pfa.weiavg_weights(rng.uniform(0.1, 1, 6))
    mean_coords = w @ np.stack(
        [pfa_plus.encode_coordinates(r, sub.basis, center=sub.center) for r in x]
    )
    np.testing.assert_allclose(
        pfa_plus.decode_coordinates(mean_coords, sub.basis, center=sub.center),
        pfa_subspace.project(w @ x, sub.basis, center=sub.center),
        atol=1e-12,
    )


def test_pfa_plus_uses_the_previous_subspace_and_returns_the_new_one():
    rng = np.random.default_rng(14)
    previous_public, public = _updates(rng, 3), _updates(rng, 3)
    private = _updates(rng, 8)
    eps_pub, eps_pri = np.array([9.0, 10.0, 11.0]), rng.uniform(0.1, 1, 8)
    old = [
        pfa_subspace.fit_layer_subspace(
            np.stack([u[i].ravel() for u in previous_public]), 1, shape=s
        )
        for i, s in enumerate(SHAPES)
    ]
    coords = [
        [
            pfa_plus.encode_coordinates(layer, s.basis, center=s.center)
            for layer, s in zip(u, old, strict=True)
        ]
        for u in private
    ]
    got, new, diag = pfa_plus_projection.pfa_plus_aggregate(public, coords, eps_pub, eps_pri, old, k=1)
    e = eps_pub.sum() + eps_pri.sum()
    for layer, s in enumerate(old):
        pub_rows = np.stack([u[layer].ravel() for u in public])
        pri_mean = (
            eps_pri @ np.stack([u[layer].ravel() for u in private]) / eps_pri.sum()
        )
        v, mu = s.basis[:, 0], s.center
        expected = (
            eps_pub @ pub_rows + eps_pri.sum() * (mu + v * (v @ (pri_mean - mu)))
        ) / e
        np.testing.assert_allclose(got[layer].ravel(), expected, atol=1e-12)
        fresh = pfa_subspace.fit_layer_subspace(pub_rows, 1)
        np.testing.assert_allclose(
            _projector(new[layer].basis), _projector(fresh.basis), atol=1e-12
        )
        np.testing.assert_allclose(new[layer].center, pub_rows.mean(axis=0))
    assert diag[pfa.DIAG_STALE_SUBSPACE] == 0.0


def test_pfa_plus_without_public_clients_keeps_the_stale_subspace():
    rng = np.random.default_rng(15)
    old = [
        pfa_subspace.fit_layer_subspace(rng.normal(size=(3, int(np.prod(s)))), 1, shape=s)
        for s in SHAPES
    ]
    private = _updates(rng, 4)
    eps = rng.uniform(0.1, 1, 4)
    coords = [
        [
            pfa_plus.encode_coordinates(layer, s.basis, center=s.center)
            for layer, s in zip(u, old, strict=True)
        ]
        for u in private
    ]
    got, new, diag = pfa_plus_projection.pfa_plus_aggregate([], coords, [], eps, old)
    assert new == old and diag[pfa.DIAG_STALE_SUBSPACE] == 1.0
    for layer, s in enumerate(old):
        mean = eps @ np.stack([u[layer].ravel() for u in private]) / eps.sum()
        np.testing.assert_allclose(
            got[layer].ravel(), pfa_subspace.project(mean, s.basis, center=s.center)
        )


@pytest.mark.parametrize("k", [1, 2, 3])
def test_coordinates_of_a_layer_have_exactly_k_values(k):
    rng = np.random.default_rng(16)
    updates = _updates(rng, 10)
    eps = np.concatenate([rng.uniform(9, 10, 4), rng.uniform(0.1, 1, 6)])
    _, subspaces, _ = pfa.pfa_aggregate(
        updates, eps, k=k, public_mask=np.arange(10) < 4
    )
    coords = [
        pfa_plus.encode_coordinates(layer, s.basis, center=s.center)
        for layer, s in zip(updates[7], subspaces, strict=True)
    ]
    assert [c.shape for c in coords] == [(k,)] * len(SHAPES)
    sizes = [int(np.prod(s)) for s in SHAPES]
    assert sum(c.size for c in coords) == pfa_plus_projection.uplink_floats(
        sizes, k, private=True, plus=True
    )
    assert pfa_plus_projection.uplink_floats(sizes, k, private=True, plus=False) == sum(sizes)
    assert pfa_plus_projection.uplink_floats(sizes, k, private=False, plus=True) == sum(sizes)


# --- public / private split ---------------------------------------------------------


def test_top_fraction_picks_the_largest_budgets():
    rng = np.random.default_rng(17)
    for m in (10, 20, 30, 50, 7, 25):
        eps = rng.uniform(0.1, 10, m)
        pub, pri = pfa_split.split_public_private(
            eps, method="top-fraction", public_fraction=0.1
        )
        assert len(pub) == max(1, int(np.ceil(0.1 * m - 1e-9)))
        assert set(pub) == set(np.argsort(eps)[::-1][: len(pub)].tolist())
        assert sorted(pub + pri) == list(range(m))
        assert eps[pub].min() > eps[pri].max()


def test_top_fraction_keeps_ties_together():
    pub, pri = pfa_split.split_public_private([1.0, 5.0, 3.0, 5.0, 2.0], public_fraction=0.2)
    assert pub == [1, 3] and pri == [0, 2, 4]


def _mixgauss1(rng, m):
    high = rng.random(m) < 0.1
    high[rng.integers(m)] = True
    eps = np.where(high, rng.normal(10.0, 0.1, m), rng.normal(0.1, 0.01, m))
    return eps, high


def test_two_cluster_separates_a_bimodal_budget_set():
    rng = np.random.default_rng(18)
    for _ in range(20):
        eps, high = _mixgauss1(rng, 30)
        pub, pri = pfa_split.split_public_private(eps, method="two-cluster")
        assert pub == np.flatnonzero(high).tolist()
        assert pri == np.flatnonzero(~high).tolist()


def test_two_cluster_is_the_optimal_2_means_partition():
    rng = np.random.default_rng(19)
    for _ in range(10):
        eps = rng.uniform(0.1, 10, 9)
        best = min(
            (
                mask
                for mask in itertools.product([False, True], repeat=9)
                if 0 < sum(mask) < 9
            ),
            key=lambda mask: sum(
                ((eps[g] - eps[g].mean()) ** 2).sum()
                for g in (np.array(mask), ~np.array(mask))
            ),
        )
        best = np.array(best)
        expected_public = best if eps[best].mean() > eps[~best].mean() else ~best
        pub, _ = pfa_split.split_public_private(eps, method="two-cluster")
        assert pub == np.flatnonzero(expected_public).tolist()


@pytest.mark.parametrize("method", pfa_split.SPLIT_METHODS)
def test_split_is_deterministic_and_permutation_equivariant(method):
    rng = np.random.default_rng(20)
    eps, _ = _mixgauss1(rng, 30)
    first = pfa_split.split_public_private(eps, method=method)
    assert pfa_split.split_public_private(eps, method=method) == first
    perm = rng.permutation(30)
    pub_perm, _ = pfa_split.split_public_private(eps[perm], method=method)
    assert sorted(perm[pub_perm].tolist()) == first[0]


# --- validation -----------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_invalid_k_is_rejected(k):
    rng = np.random.default_rng(21)
    with pytest.raises(ValueError, match="k must be (an integer|>= 1)"):
        pfa_subspace.public_subspace(rng.normal(size=(3, 10)), k)
    with pytest.raises(ValueError, match="k must be"):
        pfa.pfa_aggregate(_updates(rng, 3), [1.0, 2.0, 3.0], k=k)


@pytest.mark.parametrize(
    "bad", [[1.0, -0.5, 2.0], [1.0, 0.0, 2.0], [1.0, np.nan, 2.0], [1.0, np.inf, 2.0]]
)
def test_invalid_epsilons_are_rejected(bad):
    rng = np.random.default_rng(22)
    with pytest.raises(ValueError, match="finite and > 0"):
        pfa.pfa_aggregate(_updates(rng, 3), bad)
    with pytest.raises(ValueError, match="finite and > 0"):
        pfa_split.split_public_private(bad)
    with pytest.raises(ValueError, match="finite and > 0"):
        pfa.weiavg_weights(bad)


def test_shape_and_length_mismatches_are_rejected():
    rng = np.random.default_rng(23)
    updates = _updates(rng, 3)
    ragged = [*updates[:2], [np.zeros((6, 4)), np.zeros(5), np.zeros((2, 3, 2))]]
    with pytest.raises(ValueError, match="ragged"):
        pfa.pfa_aggregate(ragged, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="ragged"):
        layers.weighted_mean(ragged, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="3 updates but 2 epsilons"):
        pfa.pfa_aggregate(updates, [1.0, 2.0])
    with pytest.raises(ValueError, match="one entry per update"):
        layers.weighted_mean(updates, [1.0, 2.0])
    with pytest.raises(ValueError, match="public_mask"):
        pfa.pfa_aggregate(updates, [1.0, 2.0, 3.0], public_mask=[True, False])
    with pytest.raises(ValueError, match="same length d"):
        pfa.pfa_aggregate_layer(np.zeros((2, 5)), np.zeros((3, 4)), [1, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="eps_private has 2 budgets"):
        pfa.pfa_aggregate_layer(np.ones((2, 5)), np.ones((3, 5)), [1, 1], [1, 1])
    with pytest.raises(ValueError, match="basis must have shape"):
        pfa_subspace.project(np.zeros(5), np.zeros((4, 1)))
    with pytest.raises(ValueError, match="coords must have shape"):
        pfa_plus.decode_coordinates(np.zeros(2), np.zeros((5, 1)))


def test_pfa_plus_rejects_wrong_coordinates_and_missing_subspaces():
    rng = np.random.default_rng(24)
    public = _updates(rng, 2)
    subs = [
        pfa_subspace.fit_layer_subspace(np.stack([u[i].ravel() for u in public]), 1, shape=s)
        for i, s in enumerate(SHAPES)
    ]
    wrong = [[np.zeros(2), np.zeros(1), np.zeros(1)]]
    with pytest.raises(ValueError, match="coordinate shapes"):
        pfa_plus_projection.pfa_plus_aggregate(public, wrong, [5.0, 6.0], [0.5], subs)
    with pytest.raises(ValueError, match="warm-up"):
        pfa_plus_projection.pfa_plus_aggregate(public, [], [5.0, 6.0], [], [])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: pfa_split.split_public_private([1.0, 2.0], method="kmeans"),
            "method must be one of",
        ),
        (
            lambda: pfa_split.split_public_private([1.0, 2.0], public_fraction=0.0),
            "public_fraction",
        ),
        (
            lambda: pfa_split.split_public_private([1.0, 2.0], public_fraction=1.5),
            "public_fraction",
        ),
        (
            lambda: pfa_subspace.public_subspace(np.ones((2, 3)), 1, method="lanczos"),
            "method must be",
        ),
        (
            lambda: pfa.pfa_aggregate([[np.ones(2)]], [1.0], no_public="skip"),
            "no_public",
        ),
        (
            lambda: pfa.pfa_aggregate([[np.ones(2)]], [1.0], split_method="gmm"),
            "split_method must be one of",
        ),
        (
            lambda: pfa_plus_projection.uplink_floats([], 1, private=True, plus=True),
            "num_params_per_layer",
        ),
    ],
)
def test_invalid_options_name_the_allowed_values(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_random_subspace_ablation_is_orthonormal_seeded_and_ignores_the_public_updates():
    rng = np.random.default_rng(7)
    public_a, public_b = rng.normal(size=(4, 50)), rng.normal(size=(4, 50))
    basis_a = pfa_subspace.public_subspace(public_a, 3, method="random", seed=11)
    basis_b = pfa_subspace.public_subspace(public_b, 3, method="random", seed=11)
    np.testing.assert_allclose(basis_a.T @ basis_a, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(basis_a, basis_b)  # depends on the seed only
    assert not np.allclose(basis_a, pfa_subspace.public_subspace(public_a, 3, method="random", seed=12))
    x = rng.normal(size=50)
    px = pfa_subspace.project(x, basis_a)
    np.testing.assert_allclose(pfa_subspace.project(px, basis_a), px, atol=1e-12)
