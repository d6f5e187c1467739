"""DP-FedC's four baselines (docs/notes/dpfedc.md §8), federated and privatised, in one process.

All share the DP-FedC run's set-up: the same clients X_i, the same schedule S^t of K
sampled clients, the same initial centroids W⁰ (except DK++, whose point is its own seeding)
and the same evaluation (:func:`evaluate`: every sample to its nearest centroid, accuracy
with the optimal matching, NMI, k-means cost). The paper says only that "DP noise that
guarantees (ε, δ)-DP at each round" is added (A13). Our choices, one for all four:

* every record is clipped to ‖x‖ <= B (:data:`RECORD_BOUND`, in pixel units: 10 × the pixel
  range; a deterministic per-record map);
* what a sampled client uploads is a **sum of per-record contributions** each in the ball of
  radius C (FKM, FZKM: per-cluster sums and counts, a record contributing (x e_l, B e_l), C = √2·B,
  the counts divided by B after the noise, so the mechanism does not depend on the pixel units;
  DK++/DKM: selected points, C = B), released with N(0, z²C²) per entry: the project's
  replace-one Gaussian mechanism, one ``(z, 1, 1)`` step per participation, so the rigorous ε
  is computed exactly as DP-FedC's;
* z: ``paper`` — the classical Gaussian calibration at DP-FedC's per-round ε (same ε̄ by (32));
  ``rigorous`` — the accountant's z for the planned participations (same as DP-FedC's).

Documented gaps: DK++'s d²-sampling and DKM's cost-proportional sampling choose *which*
records are released with probabilities that depend on the data; only the released points
are noised (the paper is silent; a full treatment would need private selection), so their
rigorous ε covers the values, not the selection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tasks.clustering import PAPER_PIXEL_SCALE, accuracies, kmeans_cost, nearest_centroid, nmi

#: ‖x‖ bound of every record for the baselines' sums, 10 × the pixel range (MNIST digits in
#: [0, 255]^784 have norms of 5-15 × 255).
RECORD_BOUND = 10.0 * PAPER_PIXEL_SCALE
BASELINES = ("FKM", "FZKM", "DK++", "DKM")

Noise = Callable[[tuple[int, ...], float], np.ndarray]


def clip_records(x: np.ndarray, bound: float = RECORD_BOUND) -> np.ndarray:
    """Columns scaled to norm <= bound."""
    norms = np.linalg.norm(x, axis=0)
    return x * np.minimum(1.0, bound / np.maximum(norms, 1e-12))


def evaluate(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], w: np.ndarray) -> dict[str, float]:
    """Both accuracies (``accuracy``: one-to-one matching; ``accuracy_majority``), NMI and the
    k-means cost / N (``objective``) of centroids W over all clients' data, every sample to its
    nearest centroid.
    """
    pred = np.concatenate([nearest_centroid(x, w) for x in xs])
    labels = np.concatenate(ys)
    return {**accuracies(pred, labels), "nmi": nmi(pred, labels),
            "objective": float(np.mean([kmeans_cost(x, w) for x in xs]))}


def _noisy(a: np.ndarray, z: float, c: float, noise: Noise | None) -> np.ndarray:
    return a + noise(a.shape, z * c) if z > 0 and noise is not None else a


def _noisy_stats(sums: np.ndarray, counts: np.ndarray, z: float, c: float, noise: Noise | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums and (possibly fuzzy) counts released as one Gaussian mechanism.

    A record's contribution is (Σ_l u_l x e_l, c Σ_l u_l e_l) with ‖x‖ <= c and Σ_l u_l² <= 1
    (hard or fuzzy memberships), so its norm is <= √2·c: both parts get N(0, 2z²c²), and the
    counts, scaled by c for the release, come back with noise of std √2·z whatever the pixel units.
    """
    cc = float(np.sqrt(2.0)) * c
    return _noisy(sums, z, cc, noise), _noisy(c * counts, z, cc, noise) / c


def _lloyd_stats(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lab = nearest_centroid(x, w)
    onehot = np.eye(w.shape[1])[lab].T  # k × n
    return x @ onehot.T, onehot.sum(axis=1)


def _weighted_kmeans(points: np.ndarray, weights: np.ndarray, w: np.ndarray, iters: int = 10) -> np.ndarray:
    """Weighted Lloyd on columns ``points`` from centroids ``w`` (empty clusters keep theirs)."""
    weights = np.maximum(weights, 0.0)
    for _ in range(iters):
        lab = nearest_centroid(points, w)
        for l in range(w.shape[1]):
            m = lab == l
            s = weights[m].sum()
            if s > 1e-9:
                w[:, l] = points[:, m] @ weights[m] / s
    return w


def fkm(xs, w0, plan, z, noise, c=RECORD_BOUND):
    """FKM [5]: federated Lloyd. Sampled clients send per-cluster sums and counts
    (:func:`_noisy_stats`); centroid_l = Σ sums_l / Σ counts_l.
    """
    w = w0.copy()
    for sampled in plan:
        sums, counts = np.zeros_like(w), np.zeros(w.shape[1])
        for i in sampled:
            s, n = _noisy_stats(*_lloyd_stats(xs[i], w), z, c, noise)
            sums += s
            counts += n
        ok = counts > 1.0
        w[:, ok] = sums[:, ok] / counts[ok]
        yield w.copy()


def fzkm(xs, w0, plan, z, noise, c=RECORD_BOUND, fuzzifier=1.1, local_iters=10):
    """FZKM [13] (FFCM): each sampled client runs ``local_iters`` fuzzy c-means iterations from the
    global centroids, u_lj ∝ ‖x_j − c_l‖^{−2/(m_f−1)}; it uploads fuzzy sums Σ_j u_lj^{m_f} x_j and
    weights Σ_j u_lj^{m_f} of its last iteration (Σ_l u^{m_f} <= 1; released by :func:`_noisy_stats`);
    m_f = 1.1: with m_f = 2, FCM from a data-independent start collapses to the data mean in
    784 dimensions (every run gave 11.3 %). The server forms the K·k local centroids and runs weighted k-means on them from the
    current global centroids (the paper's description of FFCM's server step).
    """
    w = w0.copy()
    for sampled in plan:
        pts, wts = [], []
        for i in sampled:
            x = xs[i]
            lw = w.copy()
            for _ in range(local_iters):  # local FCM from the global centroids
                d = np.maximum(np.sum(lw * lw, 0)[:, None] + np.sum(x * x, 0)[None, :] - 2 * lw.T @ x, 1e-9)
                logu = -np.log(d) / (fuzzifier - 1.0)  # u ∝ d^{-1/(m_f-1)}, computed stably
                u = np.exp(logu - logu.max(axis=0, keepdims=True))
                u /= u.sum(axis=0, keepdims=True)
                um = u ** fuzzifier
                lw = (x @ um.T) / np.maximum(um.sum(axis=1), 1e-12)
            s, n = _noisy_stats(x @ um.T, um.sum(axis=1), z, c, noise)
            ok = n > 1.0
            pts.append(s[:, ok] / n[ok])
            wts.append(n[ok])
        if pts:
            w = _weighted_kmeans(np.concatenate(pts, axis=1), np.concatenate(wts), w.copy())
        yield w.copy()


def dkpp(xs, w0, plan, z, noise, c=RECORD_BOUND, seeding_rounds=5, oversample=2.0, seed=0):
    """DK++ [27] (k-means‖ seeding, then federated Lloyd): in the first ``seeding_rounds``
    rounds each sampled client draws each of its points with probability ℓ·d²(x,C)/φ_local
    (ℓ = ``oversample``·k/K) and uploads them noised (each a record, norm <= B); the server
    reclusters the candidates to k centres (k-means++ then weighted Lloyd), then FKM rounds.
    """
    rng = np.random.default_rng(seed)
    k = w0.shape[1]
    first = next(iter(plan[0]))
    cand = [xs[first][:, [int(rng.integers(xs[first].shape[1]))]]]
    w = w0.copy()
    for t, sampled in enumerate(plan):
        if t < seeding_rounds:
            centers = np.concatenate(cand, axis=1)
            ell = oversample * k / max(len(sampled), 1)
            for i in sampled:
                x = xs[i]
                d = np.maximum(np.sum(x * x, 0)[None, :] + np.sum(centers * centers, 0)[:, None]
                               - 2 * centers.T @ x, 0).min(axis=0)
                prob = np.minimum(1.0, ell * d / max(d.sum(), 1e-12))
                pick = rng.random(x.shape[1]) < prob
                if pick.any():
                    cand.append(_noisy(x[:, pick], z, c, noise))
            pts = np.concatenate(cand, axis=1)
            idx = [int(rng.integers(pts.shape[1]))]  # k-means++ on the candidates
            for _ in range(1, k):
                d = np.maximum(np.sum(pts * pts, 0)[None, :] + np.sum(pts[:, idx] ** 2, 0)[:, None]
                               - 2 * pts[:, idx].T @ pts, 0).min(axis=0)
                idx.append(int(rng.choice(pts.shape[1], p=d / d.sum())) if d.sum() > 0 else int(rng.integers(pts.shape[1])))
            w = _weighted_kmeans(pts, np.ones(pts.shape[1]), pts[:, idx].copy())
            yield w.copy()
        else:
            w = next(fkm(xs, w, [sampled], z, noise, c))
            yield w.copy()


def dkm(xs, w0, plan, z, noise, c=RECORD_BOUND, points_per_client=10, seed=0):
    """DKM [30] (distributed coreset): each sampled client runs local k-means (5 Lloyd steps
    from the global centroids), uploads its local centres as noisy sums/counts and
    ``points_per_client`` points sampled ∝ their local cost, noised, with weights; the server
    keeps the union coreset of the last 10 rounds and runs weighted Lloyd on it from the current W.
    """
    rng = np.random.default_rng(seed)
    w = w0.copy()
    core_pts, core_w = [], []
    for sampled in plan:
        for i in sampled:
            x = xs[i]
            lw = w.copy()
            for _ in range(5):
                s, n = _lloyd_stats(x, lw)
                ok = n > 0
                lw[:, ok] = s[:, ok] / n[ok]
            s, n = _lloyd_stats(x, lw)
            s, n = _noisy_stats(s, n, z, c, noise)
            ok = n > 1.0
            lab = nearest_centroid(x, lw)
            cost = np.sum((x - lw[:, lab]) ** 2, axis=0)
            pr = cost / cost.sum() if cost.sum() > 0 else np.full(x.shape[1], 1 / x.shape[1])
            pick = rng.choice(x.shape[1], min(points_per_client, x.shape[1]), replace=False, p=pr)
            core_pts += [s[:, ok] / n[ok], _noisy(x[:, pick], z, c, noise)]
            core_w += [n[ok] * 0.5, 0.5 / (points_per_client * pr[pick])]
        core_pts, core_w = core_pts[-2 * 10 * len(sampled):], core_w[-2 * 10 * len(sampled):]  # last 10 rounds
        w = _weighted_kmeans(np.concatenate(core_pts, axis=1), np.concatenate(core_w), w.copy(), iters=5)
        yield w.copy()


RUNNERS = {"FKM": fkm, "FZKM": fzkm, "DK++": dkpp, "DKM": dkm}
