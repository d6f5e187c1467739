"""PFA+ (Liu et al. 2021, Alg. 4 and 5): private clients upload coordinates in the public subspace.

After a warm-up round, the server sends each private client the basis V of the public clients'
subspace; the client uploads Vᵀ(Δ − μ), k numbers per layer, and the server rebuilds
V·c + μ and aggregates as PFA does (:mod:`strategies.pfa_projection`, whose docstring states
the projection and the weights). :func:`uplink_floats` counts what a round's uplink carries.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from privacy.checks import check_int
from protocol.pfa_plus import decode_coordinates
from strategies.layers import Update, as_epsilons, layer_shapes, output_dtype, stack_layer
from strategies.pfa_projection import (
    DIAG_FALLBACK_WEIAVG,
    DIAG_NUM_PRIVATE,
    DIAG_NUM_PUBLIC,
    DIAG_PUBLIC_WEIGHT,
    DIAG_STALE_SUBSPACE,
    k_diagnostics,
)
from strategies.pfa_subspace import LayerSubspace, fit_layer_subspace

_LOG = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------
# PFA+ (Alg. 4 + Alg. 5)
# --------------------------------------------------------------------------------------


def pfa_plus_aggregate(
    public_updates: Sequence[Update],
    private_coordinates: Sequence[Sequence[np.ndarray]],
    eps_public: Sequence[float] | np.ndarray,
    eps_private: Sequence[float] | np.ndarray,
    subspaces: Sequence[LayerSubspace],
    *,
    k: int = 1,
    center: bool = True,
    method: str = "exact",
    seed: int = 0,
) -> tuple[list[np.ndarray], list[LayerSubspace], dict[str, float]]:
    """PFA+ server aggregation after the warm-up round (Alg. 5, ProjectedFedAvgPro).

    Private client m uploaded, per layer ℓ, c_{m,ℓ} = V_ℓ[t−1]ᵀ (Δ_{m,ℓ} − μ_ℓ[t−1])
    (:func:`encode_coordinates`, Alg. 4 line 13) computed with the **previous** round's
    subspace ``subspaces``; public clients uploaded full updates. Per layer::

        c̄     = Σ_{S_pri} (ε_m / E_pri) c_m                     (line 3)
        Δ̂_pri = V[t−1] c̄ + μ[t−1]                              (line 4)
        Δ̄_pub = Σ_{S_pub} (ε_m / E_pub) Δ_m                     (line 8; the paper's
                                                                  line 6 uses it first)
        Δ̄     = (E_pub / E) Δ̄_pub + (E_pri / E) Δ̂_pri          (line 6)
        V[t], μ[t] = fit on this round's public updates         (lines 9-10)

    Because the weights sum to one, Δ̂_pri equals PFA's projection of the private mean on
    the same subspace (centred or not), so PFA+ differs from PFA only by the subspace's
    one-round delay. The warm-up round (no previous subspace) is plain
    :func:`pfa_aggregate` with full private updates; it returns the first subspaces.

    Edge cases: no private client gives the ε-weighted public mean. No public client
    gives the reconstructed private mean Δ̂_pri, and the previous subspaces are returned
    again (``diagnostics["pfa-stale-subspace"] = 1.0``): nothing new can be fitted.

    Parameters
    ----------
    public_updates : sequence of list of np.ndarray
        Full updates of the public clients (possibly empty).
    private_coordinates : sequence of list of np.ndarray
        Per private client, one coordinate vector per layer, of length
        ``subspaces[ℓ].k``.
    eps_public, eps_private : sequence of float
        Budgets of the public and private clients, in the same orders.
    subspaces : sequence of LayerSubspace
        The previous round's subspaces, one per layer (sent to the private clients).
    k, center, method, seed
        For fitting the new subspaces, see :func:`public_subspace`.

    Returns
    -------
    tuple
        ``(aggregate, new_subspaces, diagnostics)`` as in :func:`pfa_aggregate`.
    """
    check_int("k", k, minimum=1)
    e_pub = as_epsilons("eps_public", eps_public)
    e_pri = as_epsilons("eps_private", eps_private)
    if e_pub.size != len(public_updates) or e_pri.size != len(private_coordinates):
        raise ValueError(
            f"got {len(public_updates)} public updates with {e_pub.size} budgets and "
            f"{len(private_coordinates)} private coordinate sets with "
            f"{e_pri.size} budgets"
        )
    if e_pub.size + e_pri.size == 0:
        raise ValueError("pfa_plus_aggregate needs at least one client; found none")
    if len(subspaces) == 0:
        raise ValueError(
            "subspaces must hold one LayerSubspace per layer; found none "
            "(the warm-up round is pfa_aggregate, which returns the first subspaces)"
        )
    shapes = [s.shape for s in subspaces]
    public_shapes = (
        layer_shapes(public_updates, "public_updates") if public_updates else shapes
    )
    if public_shapes != shapes:
        raise ValueError(
            f"public update layer shapes {public_shapes} do not match the subspaces' "
            f"shapes {shapes}"
        )
    private_means = _mean_coordinates(private_coordinates, e_pri, subspaces)
    diagnostics = {
        DIAG_NUM_PUBLIC: float(e_pub.size),
        DIAG_NUM_PRIVATE: float(e_pri.size),
        DIAG_PUBLIC_WEIGHT: float(e_pub.sum() / (e_pub.sum() + e_pri.sum())),
        DIAG_FALLBACK_WEIAVG: 0.0,
        DIAG_STALE_SUBSPACE: 0.0 if public_updates else 1.0,
    }
    aggregate, new_subspaces = [], []
    for layer, old in enumerate(subspaces):
        means, totals = [], []  # Alg. 5 line 6 as Σ_groups E_g · mean_g / E
        new = old  # no public update: nothing new to fit, keep the stale subspace
        if private_means is not None:
            means.append(
                decode_coordinates(private_means[layer], old.basis, center=old.center)
            )
            totals.append(e_pri.sum())
        if public_updates:
            rows = stack_layer(public_updates, layer)
            means.append((e_pub / e_pub.sum()) @ rows)
            totals.append(e_pub.sum())
            new = fit_layer_subspace(
                rows, k, center=center, method=method, seed=seed, shape=old.shape
            )
        agg = sum(t * m for t, m in zip(totals, means, strict=True)) / sum(totals)
        dtype = output_dtype(
            [u[layer] for u in public_updates]
            or [c[layer] for c in private_coordinates]
        )
        aggregate.append(agg.reshape(old.shape).astype(dtype, copy=False))
        new_subspaces.append(new)
    diagnostics.update(k_diagnostics(new_subspaces))
    return aggregate, new_subspaces, diagnostics


def _mean_coordinates(
    private_coordinates: Sequence[Sequence[np.ndarray]],
    eps_private: np.ndarray,
    subspaces: Sequence[LayerSubspace],
) -> list[np.ndarray] | None:
    """Per-layer ε-weighted mean of the private coordinates (Alg. 5 line 3)."""
    if len(private_coordinates) == 0:
        return None
    expected = [(s.k,) for s in subspaces]
    for m, coords in enumerate(private_coordinates):
        found = [tuple(np.shape(c)) for c in coords]
        if found != expected:
            raise ValueError(
                f"private client {m} sent coordinate shapes {found}; the subspaces "
                f"expect {expected} (k per layer)"
            )
    weights = eps_private / eps_private.sum()
    means = []
    for layer in range(len(subspaces)):
        rows = np.stack(
            [np.asarray(c[layer], dtype=np.float64) for c in private_coordinates]
        )
        means.append(weights @ rows)
    return means


# --------------------------------------------------------------------------------------
# Communication (§4.5, §5.2.2)
# --------------------------------------------------------------------------------------


def uplink_floats(
    num_params_per_layer: Sequence[int], k: int, *, private: bool, plus: bool
) -> int:
    """Floats one client uploads in one round (§4.5): Σ_ℓ d_ℓ, or Σ_ℓ min(k, d_ℓ).

    Only a *private* client under PFA+ (``plus``), after the warm-up round, sends k
    coordinates per layer (the paper's "2kF bits" for 2-tensor LogR); everyone else
    sends the full update. This is the nominal k: the effective k of a round can be
    smaller (rank clipping in :func:`public_subspace`). Multiply by 4 for float32 bytes.
    """
    check_int("k", k, minimum=1)
    sizes = [int(d) for d in num_params_per_layer]
    if not sizes or any(d < 1 for d in sizes):
        raise ValueError(
            f"num_params_per_layer must be positive integers; found {sizes}"
        )
    if private and plus:
        return sum(min(k, d) for d in sizes)
    return sum(sizes)
