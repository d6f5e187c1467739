"""Server-side aggregation of WeiAvg, PFA and PFA+ (pure numpy, no Flower).

The split of the clients by budget is :mod:`strategies.pfa_split`, the public subspace and
the projection :mod:`strategies.pfa_subspace`, the layer helpers and the weighted mean
:mod:`strategies.layers`, PFA+'s coordinate format :mod:`protocol.pfa_plus`.

Paper: J. Liu, J. Lou, L. Xiong, J. Liu, X. Meng, "Projected Federated Averaging with
Heterogeneous Differential Privacy", PVLDB 15(4), 2022, doi:10.14778/3503585.3503592.
Authors' code: ``JunxuLiu/PFA`` (``modules/server.py``, class ``WeiPFA``).

Vocabulary
----------
* An *update* is one client's model delta Δ = x_global − x_local (Alg. 7; the server
  applies x ← x − Δ̄), given as a list of numpy arrays, one per parameter tensor.
* Everything projection-related is done **per layer** (per tensor), on the layer's
  flattened vector of length d, as in the authors' code; the paper's pseudo-code uses
  one flattened p-vector, but its communication figures ("2kF bits for LogR") need the
  per-tensor form (``docs/notes/pfa.md`` §2.6, §7.2).
* E_pub = Σ_{m∈S_pub} ε_m, E_pri = Σ_{m∈S_pri} ε_m, E = E_pub + E_pri, and
  W_S(ε_m) = ε_m / Σ_{m'∈S} ε_m' (the WeiAvg weight, §4.3).

PFA for one layer (Alg. 3, in the variant selected by ``center``)::

    Δ̄_pub = Σ_{S_pub} W_{S_pub}(ε_m) Δ_m           ε-weighted public mean   (line 2)
    V_k   = top-k right singular vectors of A       A = public updates, n_pub × d
    Δ̄_pri = Σ_{S_pri} W_{S_pri}(ε_m) Δ_m           ε-weighted private mean  (line 6)
    Δ̂_pri = μ + V_k V_kᵀ (Δ̄_pri − μ)               projection               (line 7)
    Δ̄     = (E_pub/E) Δ̄_pub + (E_pri/E) Δ̂_pri                               (line 10)

Paper versus authors' code (``center``)
---------------------------------------
Alg. 3 line 3 literally forms Σ = Δ̄_pub Δ̄_pubᵀ of the single averaged vector, which
has rank 1 and makes k > 1 meaningless; §4.4 and Appendix D.2 instead use the "public
updates matrix" A, i.e. Σ = AᵀA over the *individual* public updates. Two variants:

* ``center=False`` (paper, Appendix D.2): V_k from the uncentred second moment AᵀA and
  the linear projection μ = 0, Δ̂_pri = V_k V_kᵀ Δ̄_pri. PFA+ then needs only V_k on the
  downlink, as the paper describes.
* ``center=True`` (**default**, authors' code): when n_pub ≥ 2, A is centred on the
  *unweighted* public mean μ before the decomposition (PCA), and the projection is the
  affine one around μ shown above; with a single public client the code leaves A
  uncentred and uses μ = 0, and so do we. This is the variant that produced every figure
  of the paper, hence the default. Note that centring removes one dimension
  (rank ≤ n_pub − 1), and that private clients in PFA+ then need μ as well as V_k.

The centre and the basis are kept together in :class:`LayerSubspace`, so PFA's
projection and PFA+'s encode/decode always use the same affine map: for weights that sum
to one, ``decode(Σ w_m encode(x_m)) == project(Σ w_m x_m)``.

Both the paper and the code weight the two means by E_pub/E and E_pri/E, and both
weight within each group by ε. (The code also has a count-weighted class ``PFA``; the
README and the paper's PFA are the ε-weighted ``WeiPFA`` implemented here.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

import numpy as np

from privacy.checks import check_choice, check_int
from protocol.pfa_plus import decode_coordinates, encode_coordinates
from strategies.layers import Update, as_epsilons, check_matrix, layer_shapes, output_dtype, stack_layer, weighted_mean
from strategies.pfa_split import SPLIT_METHODS, split_public_private
from strategies.pfa_subspace import SUBSPACE_METHODS, LayerSubspace, fit_layer_subspace

_LOG = logging.getLogger(__name__)

NO_PUBLIC_POLICIES: Final = ("weiavg", "redraw", "error")

# Diagnostic keys (kebab-case, like the wire keys in ``strategies/keys.py``).
DIAG_NUM_PUBLIC: Final = "pfa-num-public"
DIAG_NUM_PRIVATE: Final = "pfa-num-private"
DIAG_PUBLIC_WEIGHT: Final = "pfa-public-weight"  # E_pub / E
DIAG_K_MIN: Final = "pfa-k-min"  # smallest effective k over layers
DIAG_K_MAX: Final = "pfa-k-max"  # largest effective k over layers
# private-mean energy inside the subspace: Σ_ℓ ‖Vᵀ(Δ̄_pri − μ)‖² / Σ_ℓ ‖Δ̄_pri − μ‖²
DIAG_PRIVATE_ENERGY_KEPT: Final = "pfa-private-energy-kept"
DIAG_FALLBACK_WEIAVG: Final = "pfa-fallback-weiavg"  # 1.0 when no public client
DIAG_STALE_SUBSPACE: Final = "pfa-stale-subspace"  # PFA+: 1.0 when the basis is reused


# --------------------------------------------------------------------------------------
# WeiAvg (Alg. 1)
# --------------------------------------------------------------------------------------


def weiavg_weights(epsilons: Sequence[float] | np.ndarray) -> np.ndarray:
    """WeiAvg weights W_S(ε_m) = ε_m / Σ_{m'∈S} ε_m' (§4.3).

    Returns
    -------
    np.ndarray
        Float64 weights, same order as ``epsilons``, summing to one.
    """
    eps = as_epsilons("epsilons", epsilons)
    if eps.size == 0:
        raise ValueError("epsilons must contain at least one budget; found none")
    weights: np.ndarray = eps / eps.sum()
    return weights


# --------------------------------------------------------------------------------------
# PFA (Alg. 2 + Alg. 3)
# --------------------------------------------------------------------------------------


def _combine(
    mean_public: np.ndarray, mean_private: np.ndarray, e_public: float, e_private: float
) -> np.ndarray:
    """Alg. 3 line 10 / Alg. 5 line 6: (E_pub/E) Δ̄_pub + (E_pri/E) Δ̂_pri."""
    total = e_public + e_private
    return (e_public / total) * mean_public + (e_private / total) * mean_private


def _pfa_layer(
    public: np.ndarray,
    private: np.ndarray,
    e_pub: np.ndarray,
    e_pri: np.ndarray,
    *,
    k: int,
    center: bool,
    method: str,
    seed: int,
) -> tuple[np.ndarray, LayerSubspace, float, float]:
    """Alg. 3 on validated float64 rows; also returns ‖Vᵀ(Δ̄_pri − μ)‖², ‖Δ̄_pri − μ‖²."""
    subspace = fit_layer_subspace(public, k, center=center, method=method, seed=seed)
    mean_public = (e_pub / e_pub.sum()) @ public
    if private.shape[0] == 0:
        return mean_public, subspace, 0.0, 0.0
    mean_private = (e_pri / e_pri.sum()) @ private
    coords = encode_coordinates(mean_private, subspace.basis, center=subspace.center)
    projected = decode_coordinates(coords, subspace.basis, center=subspace.center)
    offset = 0.0 if subspace.center is None else subspace.center
    energy_total = float(np.sum((mean_private - offset) ** 2))
    combined = _combine(mean_public, projected, e_pub.sum(), e_pri.sum())
    return combined, subspace, float(coords @ coords), energy_total


def pfa_aggregate_layer(
    public: np.ndarray,
    private: np.ndarray,
    eps_public: Sequence[float] | np.ndarray,
    eps_private: Sequence[float] | np.ndarray,
    *,
    k: int = 1,
    center: bool = True,
    method: str = "exact",
    seed: int = 0,
) -> tuple[np.ndarray, LayerSubspace]:
    """ProjectedFedAvg for one flattened layer (Alg. 3).

    Computes::

        Δ̄_pub = Σ_{S_pub} (ε_m / E_pub) Δ_m           (line 2)
        V_k, μ = fit on the public rows                (lines 3-4; μ = 0 if not centred)
        Δ̄_pri = Σ_{S_pri} (ε_m / E_pri) Δ_m           (line 6)
        Δ̂_pri = μ + V_k V_kᵀ (Δ̄_pri − μ)             (line 7)
        Δ̄     = (E_pub / E) Δ̄_pub + (E_pri / E) Δ̂_pri  (line 10)

    Projecting the weighted private mean equals averaging the projected private updates
    (§4.4 step 3) because the weights sum to one. With no private row the result is
    Δ̄_pub (the authors' code uses the unweighted public mean there; the ε-weighted mean
    keeps this consistent with WeiAvg over the same clients).

    Parameters
    ----------
    public, private : np.ndarray
        Shapes (n_pub, d) with n_pub ≥ 1 and (n_pri, d) with n_pri ≥ 0.
    eps_public, eps_private : sequence of float
        Budgets of the rows of ``public`` and ``private``.
    k, center, method, seed
        See :func:`public_subspace`.

    Returns
    -------
    tuple of (np.ndarray, LayerSubspace)
        The aggregated layer update Δ̄ (d,), float64, and the fitted subspace.
    """
    k = check_int("k", k, minimum=1)
    check_choice("method", method, SUBSPACE_METHODS)
    public = check_matrix("public", public, min_rows=1)
    private = np.asarray(private, dtype=np.float64)
    if private.size == 0:
        private = private.reshape(0, public.shape[1])
    private = check_matrix("private", private)
    if private.shape[1] != public.shape[1]:
        raise ValueError(
            f"public and private rows must have the same length d; "
            f"found {public.shape[1]} and {private.shape[1]}"
        )
    e_pub = as_epsilons("eps_public", eps_public)
    e_pri = as_epsilons("eps_private", eps_private)
    for name, rows, eps in (("public", public, e_pub), ("private", private, e_pri)):
        if eps.size != rows.shape[0]:
            raise ValueError(
                f"eps_{name} has {eps.size} budgets but {name} has {rows.shape[0]} rows"
            )
    aggregate, subspace, _, _ = _pfa_layer(
        public, private, e_pub, e_pri, k=k, center=center, method=method, seed=seed
    )
    return aggregate, subspace


def _public_mask(
    eps: np.ndarray,
    public_mask: Sequence[bool] | None,
    split_method: str,
    public_fraction: float,
) -> tuple[list[int], list[int]]:
    if public_mask is None:
        return split_public_private(
            eps, method=split_method, public_fraction=public_fraction
        )
    mask = np.asarray(public_mask)
    if mask.shape != eps.shape or mask.dtype != np.bool_:
        raise ValueError(
            f"public_mask must be {eps.size} booleans, one per update; "
            f"found {mask.dtype} array of shape {mask.shape}"
        )
    return np.flatnonzero(mask).tolist(), np.flatnonzero(~mask).tolist()


def pfa_aggregate(
    updates: Sequence[Update],
    epsilons: Sequence[float] | np.ndarray,
    *,
    k: int = 1,
    split_method: str = "top-fraction",
    public_fraction: float = 0.1,
    public_mask: Sequence[bool] | None = None,
    center: bool = True,
    method: str = "exact",
    no_public: str = "weiavg",
    seed: int = 0,
) -> tuple[list[np.ndarray], list[LayerSubspace], dict[str, float]]:
    """PFA server aggregation of one round, layer by layer (Alg. 2 lines 5 and 8).

    The sampled clients are split into public and private groups (Alg. 2 line 5, by
    :func:`split_public_private` on *these* budgets, or by a precomputed
    ``public_mask``, e.g. the authors' split computed once over all M clients), then
    :func:`pfa_aggregate_layer` runs on every layer.

    Edge cases (the paper is silent; the code resamples until a public client is drawn):

    * no public client and ``no_public="weiavg"``: the result is WeiAvg,
      Σ_m W_S(ε_m) Δ_m, no subspace is returned, and
      ``diagnostics["pfa-fallback-weiavg"] = 1.0``; ``no_public="error"`` raises.
    * no private client: the ε-weighted public mean (= WeiAvg over the round).

    Parameters
    ----------
    updates : sequence of list of np.ndarray
        The sampled clients' updates, same layer shapes for every client.
    epsilons : sequence of float
        Their budgets ε_m > 0, in the same order.
    k : int
        Projection dimension per layer (paper recommends 1, Remark 3).
    split_method, public_fraction
        See :func:`split_public_private`; ignored when ``public_mask`` is given.
    public_mask : sequence of bool, optional
        ``True`` for public clients, one per update.
    center, method, seed
        See :func:`public_subspace`.
    no_public : {"weiavg", "error"}
        Policy for a round without public clients.

    Returns
    -------
    tuple
        ``(aggregate, subspaces, diagnostics)``: the aggregated update (one array per
        layer, the layers' shapes and floating dtype); one :class:`LayerSubspace` per
        layer (empty list in the WeiAvg fallback), which PFA+ sends to private clients
        for the next round; and scalar diagnostics keyed by the ``DIAG_*`` constants.
    """
    check_int("k", k, minimum=1)
    check_choice("split_method", split_method, SPLIT_METHODS)
    check_choice("method", method, SUBSPACE_METHODS)
    check_choice("no_public", no_public, NO_PUBLIC_POLICIES)
    shapes = layer_shapes(updates)
    eps = as_epsilons("epsilons", epsilons)
    if eps.size != len(updates):
        raise ValueError(f"got {len(updates)} updates but {eps.size} epsilons")
    pub, pri = _public_mask(eps, public_mask, split_method, public_fraction)
    diagnostics = {
        DIAG_NUM_PUBLIC: float(len(pub)),
        DIAG_NUM_PRIVATE: float(len(pri)),
        DIAG_PUBLIC_WEIGHT: float(eps[pub].sum() / eps.sum()),
        DIAG_FALLBACK_WEIAVG: 0.0,
    }
    if not pub:
        if no_public == "error":
            raise ValueError(
                f"no public client among the {len(updates)} updates "
                f"(epsilons {eps.tolist()})"
            )
        _LOG.info("PFA: no public client this round; falling back to WeiAvg")
        diagnostics[DIAG_FALLBACK_WEIAVG] = 1.0
        return weighted_mean(updates, weiavg_weights(eps)), [], diagnostics

    public_updates = [updates[m] for m in pub]
    private_updates = [updates[m] for m in pri]
    aggregate, subspaces = [], []
    kept, total = 0.0, 0.0
    for layer, shape in enumerate(shapes):
        private_rows = (
            stack_layer(private_updates, layer)
            if pri
            else np.empty((0, math.prod(shape)))
        )
        agg, sub, layer_kept, layer_total = _pfa_layer(
            stack_layer(public_updates, layer),
            private_rows,
            eps[pub],
            eps[pri],
            k=k,
            center=center,
            method=method,
            seed=seed,
        )
        kept, total = kept + layer_kept, total + layer_total
        dtype = output_dtype([u[layer] for u in updates])
        aggregate.append(agg.reshape(shape).astype(dtype, copy=False))
        subspaces.append(replace(sub, shape=shape))
    diagnostics.update(k_diagnostics(subspaces))
    diagnostics[DIAG_PRIVATE_ENERGY_KEPT] = kept / total if total > 0 else 1.0
    return aggregate, subspaces, diagnostics


def k_diagnostics(subspaces: Sequence[LayerSubspace]) -> dict[str, float]:
    """The smallest and largest effective k over the layers' subspaces (PFA and PFA+ diagnostics)."""
    ks = [s.k for s in subspaces]
    return {DIAG_K_MIN: float(min(ks)), DIAG_K_MAX: float(max(ks))}
