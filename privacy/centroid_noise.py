"""Noise for DP-FedC's centroid uploads: the rigorous mode and the paper's eq. (29).

What a sampled client releases in round t is W̃_i = W^t + Δ_i + ξ_i with Δ_i = W_i^t − W^t
its local change of the broadcast centroids (docs/notes/dpfedc.md §3.1, eq. 19) and ξ_i i.i.d. Gaussian.

**Rigorous mode** (``"rigorous"``, the default). Explicit clipping of the round's *update*
Δ_i to Frobenius norm C (per-update clipping; the W phase may also clip every minibatch
gradient to G, which only keeps SGD stable). Whatever the client's data and H_i, the
clipped update lies in the ball of radius C, so replacing any one record (indeed any part
of the local data set) moves the release's mean by at most 2C: each round is exactly the
project's replace-one Gaussian mechanism ``(σ = z, q = 1, 1 step)`` with ξ ~ N(0, z²C²) per
entry, and H_i, which never leaves the client, enters only through Δ_i (adaptive
composition covers its persistence across rounds). No amplification is claimed: the
server's client sampling is seeded, hence public, and Table I's data-sampling ratio
q = Q₂b/n_i = 2.5 exceeds 1. z is calibrated with the project's accountant
(:func:`privacy.calibration.noise_multiplier_for`) so that the rounds the client plans to
join stay within ε at δ; the client's ledger charges every round it actually joins
(mode ``update``), like every other mode.

**Paper mode** (``"paper"``, for reproduction). σ² from eq. (29) with the per-round ε
obtained by inverting Theorem 3's (32) with c₀ = 1 (the paper's c₀ is unknown), the
minibatch gradients clipped to G (so Lemma 2's sensitivity s = 2GQ₂/η holds), and the
notes' fixes: (31)'s constant is 8, not 4; amplification (Theorem 1) only for q < 1/2;
q clipped to 1/2 in (32), which is undefined at q >= 1 (Table I has q = 2.5). The ε̄ this
produces is the **paper's nominal figure**, not a guarantee (Lemma 1 needs ε < 1, c₀ is
unknown, and Theorem 1's without-replacement bound is misapplied at q >= 1). The rigorous ε
of the same run is computed beside it: the release is the Gaussian mechanism above with
C = Q₂G/η and z = σ/C; it treats η (which the paper derives from λ_max(H_iH_iᵀ), a
data-dependent figure) as public, and the reports say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privacy.accountants import DEFAULT_ACCOUNTANT, epsilon_of
from privacy.calibration import noise_multiplier_for
from privacy.checks import check_delta
from privacy.randomness import NoiseSource

#: Calibration modes of DP-FedC.
CALIBRATIONS = ("rigorous", "paper", "none")


def _check_epsilon(eps: float, name: str = "epsilon") -> float:
    eps = float(eps)
    if not (eps > 0) or math.isnan(eps):
        raise ValueError(f"{name} must be > 0; found {eps}")
    return eps


# ------------------------------------------------------------------------ paper (eq. 29)
def paper_round_epsilon(eps_bar: float, q: float, p: float, rounds: int, c0: float = 1.0) -> float:
    """Per-round ε from Theorem 3 (32) inverted: ε = ε̄ √(1 − q̃) / (c₀ q̃² √(pR)).

    q̃ = min(q, 1/2): (32) is undefined for q >= 1, and Theorem 1 stops amplifying at
    q >= 1/2 (docs/notes/dpfedc.md A4, A7). p = K/N (uniform fixed-size client sampling).
    """
    eps_bar = _check_epsilon(eps_bar, "epsilon-bar")
    if not 0 < p <= 1:
        raise ValueError(f"client sampling probability p must be in (0, 1]; found {p}")
    if rounds < 1 or c0 <= 0 or q <= 0:
        raise ValueError(f"need rounds >= 1, c0 > 0, q > 0; found {rounds}, {c0}, {q}")
    qq = min(float(q), 0.5)
    return eps_bar * math.sqrt(1.0 - qq) / (c0 * qq * qq * math.sqrt(p * rounds))


def paper_noise_std(grad_bound: float, q2: int, eta: float, eps: float, delta: float, q: float) -> float:
    """σ of eq. (29).

    σ² = 32 G² Q₂² q² ln(1.25q/δ) / (η² ε²) for q < 1/2, else the un-amplified
    σ² = 8 G² Q₂² ln(1.25/δ) / (η² ε²) ((30) with s = 2GQ₂/η; (31)'s "4" is a typo).
    """
    delta = check_delta(delta)
    eps = _check_epsilon(eps)
    if not (grad_bound > 0 and eta > 0 and q2 >= 1 and q > 0):
        raise ValueError(f"need G > 0, eta > 0, Q2 >= 1, q > 0; found {grad_bound}, {eta}, {q2}, {q}")
    base = 8.0 * grad_bound ** 2 * q2 ** 2 / (eta ** 2 * eps ** 2)
    if q < 0.5 and 1.25 * q / delta > 1.0:
        return math.sqrt(base * 4.0 * q * q * math.log(1.25 * q / delta))
    return math.sqrt(base * math.log(1.25 / delta))


def paper_noise_multiplier(eps: float, delta: float, q: float) -> float:
    """Eq. (29)'s σ in units of the clipped update's radius, z = σ / (Q₂G/η).

    It does not depend on G, Q₂ or η, so the server can derive (and verify) it from
    public figures.
    """
    return paper_noise_std(1.0, 1, 1.0, eps, delta, q)


# ------------------------------------------------------------------------ rigorous
def rigorous_noise_multiplier(epsilon: float, delta: float, rounds: int, *,
                              accountant: str = DEFAULT_ACCOUNTANT,
                              prior_history: Sequence[tuple[float, float, int]] = ()) -> float:
    """Smallest z within (ε, δ) for ``rounds`` Gaussian releases.

    The releases are replace-one (z, q=1) on top of ``prior_history``, under the project's
    accountant.
    """
    _check_epsilon(epsilon)
    check_delta(delta)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1; found {rounds}")
    return noise_multiplier_for(epsilon, delta, 1.0, int(rounds), accountant=accountant,
                                prior_history=list(prior_history))


def rigorous_epsilon(multipliers: Sequence[float], delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """ε of the rounds actually joined, one ``(z, 1, 1)`` Gaussian release each.

    Replace-one, record level (and in fact client level).
    """
    return epsilon_of([(float(z), 1.0, 1) for z in multipliers], delta, accountant) if multipliers else 0.0


@dataclass(frozen=True)
class Release:
    """One privatised upload and what the ledger needs to know about it."""

    centroids: np.ndarray  # W̃_i = W^t + clip(Δ_i, C) + ξ_i
    noise_multiplier: float  # z: ξ ~ N(0, z²C²) per entry
    clip: float  # C
    update_norm: float  # ‖Δ_i‖_F before clipping (data-dependent: not released by default)


def privatize_centroids(w_global: np.ndarray, w_local: np.ndarray, clip: float, noise_multiplier: float,
                        noise: NoiseSource | None) -> Release:
    """W^t + clip(W_local − W^t, C) + N(0, (zC)²) entrywise; z = 0 (or ``noise`` None): no noise.

    Raises
    ------
    ValueError
        If the shapes differ, C <= 0, z < 0, or z > 0 without a noise source.
    """
    w_global, w_local = np.asarray(w_global, np.float64), np.asarray(w_local, np.float64)
    if w_global.shape != w_local.shape:
        raise ValueError(f"local centroids {w_local.shape} do not match the global {w_global.shape}")
    if not clip > 0:
        raise ValueError(f"clip must be > 0; found {clip}")
    if not noise_multiplier >= 0:
        raise ValueError(f"noise multiplier must be >= 0; found {noise_multiplier}")
    delta = w_local - w_global
    norm = float(np.linalg.norm(delta))
    if math.isfinite(clip) and norm > clip:
        delta = delta * (clip / norm)
    out = w_global + delta
    if noise_multiplier > 0:
        if noise is None:
            raise ValueError("a positive noise multiplier needs a noise source")
        out = out + noise.normal(out.shape, noise_multiplier * clip)
    return Release(out, float(noise_multiplier), float(clip), norm)
