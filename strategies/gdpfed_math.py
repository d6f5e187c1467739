"""The pure mathematics of GDPFed / GDPFed+ (paper 003), free of Flower.

Notation (docs/notes/gdpfed.md §2.1): n clients in M groups G_m, global sampling ratio q,
per-group ratio q_m, r_m = q_m·|G_m| clients per round, σ_m the group's noise multiplier,
T rounds, τ local iterations, η the learning rate, k_m/d the kept fraction of top-k.

Decisions on what the paper leaves open (docs/notes/gdpfed.md §8), made here once:

* **Problem 1 (§8.5)**: σ_m² in the objective follows Theorem 1's closed form
  ``7 q_m² T (ε_m + 2 ln(1/δ)) / ε_m²`` (the paper's own analysis; with the numerical
  accountant the optimum collapses onto one group, docs/notes/gdpfed.md §2.8), ω_m is a function of
  r_m inside the objective, φ*_m is Remark 3's optimum (clipped to [0, 1]); solved with
  scipy SLSQP over q_m ∈ [q_min, 1] under Σ q_m|G_m| = q·n. Table 1's q_m are not exactly
  reproducible (nobody has); the reproduction uses the paper's q_m (``sampling = "paper"``).
* **r_m rounding (§8.2)**: r_m = q_m|G_m| rounded by the largest-remainder method so that
  Σ r_m = round(q·n) exactly ("14 … 7 clients" in the paper are integers); a group whose
  q_m|G_m| < 1 is a configuration error, not rounded up silently.
* **ω_m (§8.3)**: the literal Appendix B.2 formula ω_m = (1/(qn))·r_m²/Σ_j r_j² applied to
  the group *sum* (``weighting = "paper"``, the default, for faithful replication; it acts
  as a server learning rate ≈ 1/M), or the normalised sanity variant
  ω'_m·ȳ_m/r_m with ω'_m = r_m²/Σ r_j² (``"normalised"``); DP-FedAvg uses the plain mean.
* **top-k scope (§8.7)**: one global magnitude top-k over the flattened update of all
  layers (Algorithm 3 takes one vector x ∈ R^d); ties are broken by the lower index; k_m =
  round(a_m·d), at least 1.
* **lr decay unit (§8.13)**: per round, η_t = η·0.99^(t−1) (client side, fresh optimiser).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "LR_DECAY",
    "group_weights",
    "idp_scale_clips",
    "lr_at_round",
    "optimal_sampling",
    "problem1_objective",
    "round_counts",
    "sparsify_top_k",
    "theorem1_sigma2",
    "top_k_count",
]

#: The paper's learning-rate decay ratio, applied once per round.
LR_DECAY = 0.99


def lr_at_round(lr: float, server_round: int, decay: float = LR_DECAY) -> float:
    """η_t = η·decay^(t−1) for round t >= 1 (decay unit: one server round, docs/notes/gdpfed.md §8.13)."""
    return float(lr) * float(decay) ** max(0, int(server_round) - 1)


def theorem1_sigma2(epsilon: float, delta: float, q: float, rounds: int) -> float:
    """Theorem 1's σ² lower bound, 7 q² T (ε + 2 ln(1/δ)) / ε² (used only inside Problem 1)."""
    return 7.0 * q * q * rounds * (epsilon + 2.0 * math.log(1.0 / delta)) / (epsilon * epsilon)


def group_weights(counts: Sequence[float], scheme: str = "paper") -> np.ndarray:
    """ω_m applied to the group's noisy *sum* ȳ_m.

    ``"paper"``: ω_m = (1/Σ r)·r_m²/Σ_j r_j² (Appendix B.2, with qn = Σ r_m).
    ``"normalised"``: ω'_m/r_m with ω'_m = r_m²/Σ r_j², i.e. a ω'-weighted mean of the group means.
    ``"mean"``: 1/Σ r for every group, the plain mean of all sampled updates (DP-FedAvg).
    """
    r = np.asarray(counts, dtype=np.float64)
    if r.ndim != 1 or len(r) == 0 or np.any(r <= 0):
        raise ValueError(f"counts must be positive numbers, one per group; found {counts!r}")
    share = r**2 / np.sum(r**2)
    if scheme == "paper":
        return share / r.sum()
    if scheme == "normalised":
        return share / r
    if scheme == "mean":
        return np.full_like(r, 1.0 / r.sum())
    raise ValueError(f"weighting must be one of paper, normalised, mean; found {scheme!r}")


def idp_scale_clips(clip: float, sigmas: Sequence[float], sizes: Sequence[int]) -> list[float]:
    """IDP's Scale rule (Boenisch et al. 2023, §3.2): per-group clips C_m for one common noise std.

    C_m = C·σ̄/σ_m with σ̄ = (Σ_m (|G_m|/n)/σ_m)^(−1), so that

    * the size-weighted mean of the C_m is the run's clip C, and
    * one noise std s = C·σ̄ = C_m·σ_m gives every group exactly its calibrated multiplier σ_m
      (no group is over-noised, unlike fixed C_m with s = max_m C_m σ_m).

    The looser a group's budget, the smaller its σ_m and the larger its clip.
    """
    s = np.asarray(sigmas, dtype=np.float64)
    g = np.asarray(sizes, dtype=np.float64)
    if s.ndim != 1 or s.shape != g.shape or len(s) == 0 or np.any(~np.isfinite(s)) or np.any(s <= 0) or np.any(g <= 0):
        raise ValueError(f"need one finite σ_m > 0 and one size > 0 per group; found {list(sigmas)}, {list(sizes)}")
    sigma_bar = 1.0 / float(np.sum(g / g.sum() / s))
    return [float(clip) * sigma_bar / float(x) for x in s]


def round_counts(sample_rates: Sequence[float], sizes: Sequence[int], *, key: str = "gdpfed.sample-rates") -> list[int]:
    """Integer r_m from q_m|G_m| by largest remainder, Σ r_m = round(Σ q_m|G_m|).

    Raises
    ------
    ValueError
        Naming ``key`` if some group is empty, some q_m is outside (0, 1], or q_m|G_m| < 1
        (the group would be sampled zero times per round).
    """
    q = np.asarray(sample_rates, dtype=np.float64)
    g = np.asarray(sizes, dtype=np.int64)
    if len(q) != len(g):
        raise ValueError(f"'{key}': {len(q)} sample rates for {len(g)} groups")
    for m, (qm, gm) in enumerate(zip(q, g, strict=True)):
        if gm < 1:
            raise ValueError(f"'{key}': group {m + 1} is empty (no client declared a budget in its range)")
        if not 0 < qm <= 1:
            raise ValueError(f"'{key}': group {m + 1} sample rate {qm:g} is outside (0, 1]")
        if qm * gm < 1 - 1e-9:
            raise ValueError(f"'{key}': group {m + 1} has q_m*|G_m| = {qm:g}*{gm} = {qm * gm:.3g} < 1: "
                             "no client would be sampled; raise its sample rate or the group size")
    exact = q * g
    total = int(round(exact.sum()))
    base = np.maximum(np.floor(exact + 1e-9).astype(np.int64), 1)
    order = np.argsort(-(exact - base), kind="stable")
    i = 0
    while base.sum() < total:
        m = order[i % len(order)]
        if base[m] < g[m]:
            base[m] += 1
        i += 1
    return [int(x) for x in base]


def top_k_count(fraction: float, dim: int, *, key: str = "gdpfed.sparsity") -> int:
    """K = round(a·d) for a kept fraction a ∈ (0, 1], at least 1."""
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise ValueError(f"'{key}': k_m/d = {fraction!r} is outside (0, 1]")
    return max(1, min(dim, int(round(fraction * dim))))


def sparsify_top_k(layers: Sequence[np.ndarray], fraction: float) -> list[np.ndarray]:
    """Algorithm 3 over the flattened update: keep the k = round(a·d) largest |x_j|, zero the rest.

    Post-processing of an already private vector: costs no privacy (Lemma 2).
    """
    flat = np.concatenate([np.ravel(a) for a in layers])
    k = top_k_count(fraction, flat.size)
    if k < flat.size:
        keep = np.argsort(-np.abs(flat), kind="stable")[:k]
        mask = np.zeros(flat.size, dtype=bool)
        mask[keep] = True
        flat = np.where(mask, flat, 0.0).astype(flat.dtype)
    out, start = [], 0
    for a in layers:
        out.append(flat[start:start + a.size].reshape(a.shape).astype(a.dtype, copy=False))
        start += a.size
    return out


def problem1_objective(
    sample_rates: Sequence[float],
    sizes: Sequence[int],
    epsilons: Sequence[float],
    delta: float,
    rounds: int,
    *,
    lr: float = 0.1,
    local_steps: int = 5,
    sigma2: Callable[[float, float, float, int], float] = theorem1_sigma2,
) -> float:
    """Problem 1's objective (Appendix F): Σ_m ω_m (μ4(1+φ*_m) + μ5(1−√φ*_m) ω_m σ_m²/r_m²).

    μ4 = 32ητ + η + η/τ, μ5 = 4/(ητ), ω_m = (1/Σr)·r_m²/Σr_j², φ*_m = (2ω_mσ_m²/(ητμ4 r_m²))²
    (Remark 3, clipped to [0, 1]), r_m = q_m|G_m| (real-valued here), σ_m² = ``sigma2(ε_m, δ, q_m, T)``.
    """
    q = np.asarray(sample_rates, dtype=np.float64)
    r = q * np.asarray(sizes, dtype=np.float64)
    eta, tau = float(lr), float(local_steps)
    mu4 = 32 * eta * tau + eta + eta / tau
    mu5 = 4.0 / (eta * tau)
    w = group_weights([float(x) for x in r], "paper")
    s2 = np.array([sigma2(e, delta, qm, rounds) for e, qm in zip(epsilons, q, strict=True)])
    phi = np.clip((2 * w * s2 / (eta * tau * mu4 * r**2)) ** 2, 0.0, 1.0)
    return float(np.sum(w * (mu4 * (1 + phi) + mu5 * (1 - np.sqrt(phi)) * w * s2 / r**2)))


def optimal_sampling(
    sizes: Sequence[int],
    epsilons: Sequence[float],
    q: float,
    delta: float,
    rounds: int,
    *,
    lr: float = 0.1,
    local_steps: int = 5,
    sigma2: Callable[[float, float, float, int], float] = theorem1_sigma2,
) -> list[float]:
    """Problem 1: argmin of :func:`problem1_objective` s.t. Σ q_m|G_m| = q·n, 1/|G_m| <= q_m <= 1.

    Solved with scipy's SLSQP in the variables x_m = r_m/(qn) (the simplex), started from
    uniform sampling and from r_m ∝ ε_m/√(ε_m + 2 ln 1/δ) (the closed-form optimum of the
    Theorem-1 model when φ* ≈ 0, docs/notes/gdpfed.md §2.8); the better feasible result is returned.
    """
    from scipy.optimize import minimize  # 0.4 s of imports, paid only by a GDPFed server that solves Problem 1

    g = np.asarray(sizes, dtype=np.float64)
    n_sampled = q * g.sum()
    lo = np.maximum(1.0 / n_sampled, 1e-9) * np.ones_like(g)
    hi = np.minimum(g / n_sampled, 1.0)

    def f(x: np.ndarray) -> float:
        return problem1_objective(x * n_sampled / g, sizes, epsilons, delta, rounds,
                                  lr=lr, local_steps=local_steps, sigma2=sigma2)

    e = np.asarray(epsilons, dtype=np.float64)
    starts = [g / g.sum(), (e / np.sqrt(e + 2 * math.log(1 / delta))) / np.sum(e / np.sqrt(e + 2 * math.log(1 / delta)))]
    best_x, best_f = None, math.inf
    for x0 in starts:
        x0 = np.clip(x0, lo, hi)
        res = minimize(f, x0, method="SLSQP", bounds=list(zip(lo, hi, strict=True)),
                       constraints=[{"type": "eq", "fun": lambda x: np.sum(x) - 1.0}],
                       options={"ftol": 1e-14, "maxiter": 500})
        x = np.clip(res.x, lo, hi)
        x = x / x.sum()
        val = f(x)
        if val < best_f:
            best_x, best_f = x, val
    assert best_x is not None
    return [float(v) for v in best_x * n_sampled / g]
