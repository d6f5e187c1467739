"""Server-side mathematics of WeiAvg, PFA and PFA+ (pure numpy, no Flower).

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
  per-tensor form (notes ``pfa.md`` §2.6, §7.2).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

_LOG = logging.getLogger(__name__)

SPLIT_METHODS: Final = ("top-fraction", "two-cluster")
SUBSPACE_METHODS: Final = ("exact", "randomized", "random")
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

Update = Sequence[np.ndarray]


@dataclass(frozen=True, eq=False)
class LayerSubspace:
    """The affine subspace {μ + V c} that one layer's private updates are projected on.

    Attributes
    ----------
    basis : np.ndarray
        V_k, shape (d, k), orthonormal columns, float64.
    center : np.ndarray or None
        μ, shape (d,): the unweighted public mean when the subspace was fitted on
        centred updates, ``None`` for a linear subspace (μ = 0).
    shape : tuple of int
        Shape of the layer tensor, with ``prod(shape) == d``; used to un-flatten.
    """

    basis: np.ndarray
    center: np.ndarray | None
    shape: tuple[int, ...]

    @property
    def k(self) -> int:
        """Effective projection dimension (number of basis columns)."""
        return int(self.basis.shape[1])


# --------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------


def _as_epsilons(name: str, epsilons: Sequence[float] | np.ndarray) -> np.ndarray:
    """Return ``epsilons`` as a 1-D float64 array, checking that each is finite, > 0."""
    if any(
        isinstance(e, (bool, np.bool_))
        for e in np.asarray(epsilons, dtype=object).ravel()
    ):
        raise ValueError(
            f"{name} must be real numbers, not booleans; found {epsilons!r}"
        )
    eps = np.asarray(epsilons, dtype=np.float64)
    if eps.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional; found shape {eps.shape}")
    bad = ~np.isfinite(eps) | (eps <= 0.0)
    if bad.any():
        raise ValueError(
            f"{name} must be finite and > 0; found {eps[bad].tolist()} "
            f"at positions {np.flatnonzero(bad).tolist()}"
        )
    return eps


def _check_k(k: int) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1; found {k!r}")
    return int(k)


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}; found {value!r}")


def _check_matrix(name: str, matrix: np.ndarray, *, min_rows: int = 0) -> np.ndarray:
    """Return a 2-D float64 view of ``matrix`` (rows = clients, columns = d)."""
    arr = np.asarray(matrix, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D (clients × d) array; found shape {arr.shape}"
        )
    if arr.shape[0] < min_rows:
        raise ValueError(
            f"{name} needs at least {min_rows} row(s); found {arr.shape[0]}"
        )
    return arr


def _layer_shapes(
    updates: Sequence[Update], name: str = "updates"
) -> list[tuple[int, ...]]:
    """Check that every client sends the same list of layer shapes; return it."""
    if len(updates) == 0:
        raise ValueError(f"{name} must contain at least one client update; found none")
    shapes = [tuple(np.shape(layer)) for layer in updates[0]]
    if not shapes:
        raise ValueError(f"{name}[0] has no layers")
    for m, update in enumerate(updates[1:], start=1):
        other = [tuple(np.shape(layer)) for layer in update]
        if other != shapes:
            raise ValueError(
                f"{name} are ragged: client {m} has layer shapes {other}, "
                f"client 0 has {shapes}"
            )
    return shapes


def _output_dtype(layers: Sequence[np.ndarray]) -> np.dtype:
    """Floating dtype of the inputs (float32 stays float32), float64 for non-floats."""
    dtype = np.result_type(*[np.asarray(layer).dtype for layer in layers])
    return dtype if np.issubdtype(dtype, np.floating) else np.dtype(np.float64)


def _stack_layer(updates: Sequence[Update], layer: int) -> np.ndarray:
    """Rows = clients, columns = flattened layer ``layer``, float64."""
    rows = np.empty((len(updates), np.size(updates[0][layer])), dtype=np.float64)
    for row, update in zip(rows, updates, strict=True):
        row[:] = np.ravel(update[layer])  # one pass: copy and widen to float64
    return rows


# --------------------------------------------------------------------------------------
# Public / private split (Alg. 2 line 5, Remark 2)
# --------------------------------------------------------------------------------------


def _split_top_fraction(eps: np.ndarray, public_fraction: float) -> np.ndarray:
    n_public = max(1, math.ceil(round(public_fraction * eps.size, 9)))
    threshold = np.sort(eps)[-n_public]
    is_public: np.ndarray = eps >= threshold
    return is_public


def _within_cluster_sse(values: np.ndarray) -> float:
    return float(np.sum((values - values.mean()) ** 2))


def _split_two_cluster(eps: np.ndarray, public_fraction: float) -> np.ndarray:
    del public_fraction  # not used by the clustering rule
    order = np.sort(eps)
    # Exact 1-D 2-means: an optimal 2-clustering of points on a line is a threshold
    # split of the sorted values, so score every split between two distinct values.
    cuts = [i for i in range(1, order.size) if order[i - 1] < order[i]]
    if not cuts:  # all budgets equal: a single cluster, all public
        return np.ones(eps.size, dtype=bool)
    sse = [
        _within_cluster_sse(order[:i]) + _within_cluster_sse(order[i:]) for i in cuts
    ]
    # among equal scores keep the last cut, i.e. the fewest public clients
    best = max(range(len(cuts)), key=lambda j: (-sse[j], j))
    is_public: np.ndarray = eps >= order[cuts[best]]
    return is_public


_SPLITTERS: Final[dict[str, Callable[[np.ndarray, float], np.ndarray]]] = {
    "top-fraction": _split_top_fraction,
    "two-cluster": _split_two_cluster,
}


def split_public_private(
    epsilons: Sequence[float] | np.ndarray,
    *,
    method: str = "top-fraction",
    public_fraction: float = 0.1,
) -> tuple[list[int], list[int]]:
    """Split clients into "public" (large ε) and "private" (small ε) groups.

    Paper §4.4 step (1) and Remark 2 suggest 2-cluster clustering of the budgets, or the
    top-K clients by ε. Both are deterministic here.

    Parameters
    ----------
    epsilons : sequence of float
        Per-client budgets ε_m > 0.
    method : {"top-fraction", "two-cluster"}
        ``"top-fraction"`` (**default**, the authors' ``Server.set_public_clients``):
        n = max(1, ⌈public_fraction · M⌉), threshold = the n-th largest ε, and every
        client with ε_m ≥ threshold is public. Ties at the threshold are all public, as
        in the code, so equal budgets are treated equally (all-equal ε: everyone is
        public and PFA reduces to WeiAvg = FedAvg). For 0.1·M integral this is the
        code's 2/3/4/5 public of 20/30/40/50 (Table 5); the code's floor ``int(0.1·M)``
        makes *every* client public for M < 10, the ceiling here gives one.
        ``"two-cluster"``: 1-D 2-means on ε, solved exactly (the optimum is a
        threshold split of the sorted budgets, so all M − 1 splits between distinct
        values are scored by within-cluster sum of squares; no initialisation, no
        local optima). The high-ε cluster is public; an SSE tie goes to the split with
        fewer public clients; all-equal ε makes everyone public.
        Top-fraction is the default because it is what the paper's experiments used,
        and because 2-means on a unimodal distribution (Uniform, Gauss) makes about
        half of the clients "public".
    public_fraction : float
        Fraction in (0, 1] for ``"top-fraction"``; ignored by ``"two-cluster"``.

    Returns
    -------
    tuple of (list of int, list of int)
        Ascending indices of the public and of the private clients.
    """
    eps = _as_epsilons("epsilons", epsilons)
    if eps.size == 0:
        raise ValueError("epsilons must contain at least one budget; found none")
    _check_choice("method", method, SPLIT_METHODS)
    if isinstance(public_fraction, bool) or not 0.0 < public_fraction <= 1.0:
        raise ValueError(
            f"public_fraction must be in (0, 1]; found {public_fraction!r}"
        )
    is_public = _SPLITTERS[method](eps, float(public_fraction))
    return np.flatnonzero(is_public).tolist(), np.flatnonzero(~is_public).tolist()


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
    eps = _as_epsilons("epsilons", epsilons)
    if eps.size == 0:
        raise ValueError("epsilons must contain at least one budget; found none")
    weights: np.ndarray = eps / eps.sum()
    return weights


def weighted_mean(
    updates: Sequence[Update], weights: Sequence[float] | np.ndarray
) -> list[np.ndarray]:
    """Per-layer weighted mean Σ_m w_m Δ_m / Σ_m w_m.

    With ``weights = weiavg_weights(ε)`` this is WeiAvg (Alg. 1); with equal weights it
    is FedAvg (Alg. 6). Accumulates in float64 and returns the inputs' floating dtype.

    Parameters
    ----------
    updates : sequence of list of np.ndarray
        One update per client, all with the same layer shapes.
    weights : sequence of float
        Non-negative, finite, with a positive sum; one per client.
    """
    shapes = _layer_shapes(updates)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(updates),):
        raise ValueError(
            f"weights must have one entry per update ({len(updates)}); "
            f"found shape {w.shape}"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(
            f"weights must be finite, >= 0 and sum to > 0; found {w.tolist()}"
        )
    w = w / w.sum()
    result = []
    for layer, shape in enumerate(shapes):
        dtype = _output_dtype([u[layer] for u in updates])
        mean = w @ _stack_layer(updates, layer)
        result.append(mean.reshape(shape).astype(dtype, copy=False))
    return result


# --------------------------------------------------------------------------------------
# Subspace identification (Alg. 3 lines 2-4, Appendix D.2)
# --------------------------------------------------------------------------------------


def _exact_svd(matrix: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    del k, seed  # the thin SVD returns every direction; the caller keeps the top k
    _, sing, vt = np.linalg.svd(matrix, full_matrices=False)
    return sing, vt.T


def _randomized_svd(
    matrix: np.ndarray, k: int, seed: int, *, oversample: int = 5, power_iters: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    # Halko, Martinsson & Tropp (2011), Alg. 4.4 + 5.1, on Aᵀ (d × n): sketch the row
    # space of A with ℓ = k + oversample Gaussian combinations of its rows, sharpen it
    # with power iterations, then take an exact SVD of the small n × ℓ matrix A Q.
    n_rows, d = matrix.shape
    ell = min(k + oversample, n_rows, d)
    rng = np.random.default_rng(seed)
    sketch = matrix.T @ rng.standard_normal((n_rows, ell))
    for _ in range(power_iters):
        q, _ = np.linalg.qr(sketch)
        sketch = matrix.T @ (matrix @ q)
    q, _ = np.linalg.qr(sketch)
    _, sing, wt = np.linalg.svd(matrix @ q, full_matrices=False)
    return sing, q @ wt.T


def _random_subspace(matrix: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # The paper's ablation (Fig. 6, "random projection"): a uniformly random k-dimensional
    # subspace (QR of a Gaussian d × k matrix), ignoring the public updates altogether.
    d = matrix.shape[1]
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, min(k, d))))
    return np.ones(q.shape[1]), q


_SVD_SOLVERS: Final[
    dict[str, Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray]]]
] = {
    "exact": _exact_svd,
    "randomized": _randomized_svd,
    "random": _random_subspace,
}


def public_center(
    public_layer_updates: np.ndarray, *, center: bool = True
) -> np.ndarray | None:
    """Return the centre μ of the affine projection, as in the authors' code.

    Returns the *unweighted* mean of the public updates when ``center`` and there are
    at least two public clients; ``None`` (μ = 0) otherwise, because centring a single
    update would leave nothing to decompose (the code makes the same exception).
    """
    public = _check_matrix("public_layer_updates", public_layer_updates, min_rows=1)
    if not center or public.shape[0] < 2:
        return None
    mean: np.ndarray = public.mean(axis=0)
    return mean


def public_subspace(
    public_layer_updates: np.ndarray,
    k: int,
    *,
    center: bool = True,
    method: str = "exact",
    seed: int = 0,
) -> np.ndarray:
    """Top-k right singular vectors V_k of the public updates matrix (Alg. 3 lines 3-4).

    With A the n_pub × d matrix of public updates (centred on their unweighted mean μ
    when ``center`` and n_pub ≥ 2, see :func:`public_center`), V_k holds the top-k
    eigenvectors of AᵀA, i.e. the top-k right singular vectors of A. (Appendix D.2 uses
    Lanczos on A(Aᵀv); the authors' 256-step Lanczos without breakdown checks returns
    spurious vectors once the step count exceeds rank(A) ≤ n_pub, see
    ``original-code.md`` §2, so an exact method is the default.)

    Parameters
    ----------
    public_layer_updates : np.ndarray
        Shape (n_pub, d), one flattened layer update per public client.
    k : int
        Requested dimension, ≥ 1. Clipped (with a logged note) to the numerical rank of
        A, which is ≤ n_pub − 1 when centred and ≤ n_pub otherwise: directions with a
        zero singular value are arbitrary and would project on noise (notes §7.5).
    center : bool
        Centre A first (authors' code, default) or not (paper, Appendix D.2).
    method : {"exact", "randomized", "random"}
        ``"exact"``: thin ``np.linalg.svd`` of the n_pub × d matrix, O(n_pub² d); it is
        cheap because n_pub ≪ d, and more accurate than eigen-decomposing the Gram
        matrix AAᵀ, which squares the condition number. ``"randomized"``: randomized
        range finder with k + 5 oversampling and 2 power iterations, seeded by ``seed``
        (exact whenever k + 5 ≥ n_pub). ``"random"``: a uniformly random k-dimensional
        subspace that ignores the public updates (the paper's random-projection ablation,
        Fig. 6).
    seed : int
        Seed of the ``"randomized"`` sketch.

    Returns
    -------
    np.ndarray
        Shape (d, k_eff), k_eff ≤ k, orthonormal float64 columns, ordered by singular
        value; each column's sign makes its largest-magnitude entry positive.
    """
    k = _check_k(k)
    _check_choice("method", method, SUBSPACE_METHODS)
    public = _check_matrix("public_layer_updates", public_layer_updates, min_rows=1)
    mu = public_center(public, center=center)
    matrix = public if mu is None else public - mu
    sing, vecs = _SVD_SOLVERS[method](matrix, k, seed)
    tol = (sing[0] if sing.size else 0.0) * max(matrix.shape) * np.finfo(np.float64).eps
    rank = int(np.count_nonzero(sing > tol))
    if rank < k:
        _LOG.info(
            "PFA: k=%d exceeds the rank %d of the %s public updates matrix (%d x %d); "
            "using k=%d",
            k,
            rank,
            "centred" if mu is not None else "uncentred",
            *matrix.shape,
            rank,
        )
    basis = vecs[:, : min(k, rank)]
    signs = np.sign(basis[np.argmax(np.abs(basis), axis=0), np.arange(basis.shape[1])])
    return basis * np.where(signs == 0, 1.0, signs)


def fit_layer_subspace(
    public_layer_updates: np.ndarray,
    k: int,
    *,
    center: bool = True,
    method: str = "exact",
    seed: int = 0,
    shape: tuple[int, ...] | None = None,
) -> LayerSubspace:
    """Fit V_k and μ of one layer and bundle them as a :class:`LayerSubspace`.

    See :func:`public_subspace` and :func:`public_center`; ``shape`` is the layer
    tensor's shape (default ``(d,)``).
    """
    public = _check_matrix("public_layer_updates", public_layer_updates, min_rows=1)
    d = public.shape[1]
    shape = (d,) if shape is None else tuple(shape)
    if math.prod(shape) != d:
        raise ValueError(f"shape {shape} does not hold d={d} values")
    basis = public_subspace(public, k, center=center, method=method, seed=seed)
    return LayerSubspace(
        basis=basis, center=public_center(public, center=center), shape=shape
    )


# --------------------------------------------------------------------------------------
# Projection and PFA+ coordinates (Alg. 3 line 7, Alg. 4 line 13, Alg. 5 line 4)
# --------------------------------------------------------------------------------------


def _check_basis(basis: np.ndarray, d: int, center: np.ndarray | None) -> np.ndarray:
    basis = np.asarray(basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[0] != d:
        raise ValueError(f"basis must have shape (d={d}, k); found {basis.shape}")
    if center is not None and np.shape(center) != (d,):
        raise ValueError(f"center must have shape ({d},); found {np.shape(center)}")
    return basis


def project(
    vectors: np.ndarray, basis: np.ndarray, *, center: np.ndarray | None = None
) -> np.ndarray:
    """Project orthogonally onto the (affine) subspace: μ + V Vᵀ (x − μ) (Alg. 3 l. 7).

    Parameters
    ----------
    vectors : np.ndarray
        One vector (d,) or a stack (n, d).
    basis : np.ndarray
        V, shape (d, k), orthonormal columns.
    center : np.ndarray or None
        μ, shape (d,); ``None`` means μ = 0 (the paper's linear projection V Vᵀ x).

    Returns
    -------
    np.ndarray
        Float64 array of the same shape as ``vectors``.
    """
    x = np.asarray(vectors, dtype=np.float64)
    if x.ndim not in (1, 2):
        raise ValueError(f"vectors must have shape (d,) or (n, d); found {x.shape}")
    basis = _check_basis(basis, x.shape[-1], center)
    offset = 0.0 if center is None else np.asarray(center, dtype=np.float64)
    projected: np.ndarray = offset + ((x - offset) @ basis) @ basis.T
    return projected


def encode_coordinates(
    update_layer: np.ndarray, basis: np.ndarray, *, center: np.ndarray | None = None
) -> np.ndarray:
    """PFA+ client side: the k coordinates c = Vᵀ (Δ − μ) of one layer (Alg. 4 line 13).

    ``update_layer`` may have the layer's tensor shape; it is flattened (size d).
    Returns a float64 vector of length k = ``basis.shape[1]``.
    """
    x = np.asarray(update_layer, dtype=np.float64).ravel()
    basis = _check_basis(basis, x.size, center)
    if center is not None:
        x = x - np.asarray(center, dtype=np.float64)
    return basis.T @ x


def decode_coordinates(
    coords: np.ndarray, basis: np.ndarray, *, center: np.ndarray | None = None
) -> np.ndarray:
    """PFA+ server side: lift k coordinates back to R^d, V c + μ (Alg. 5 line 4).

    Returns a flat float64 vector of length d = ``basis.shape[0]``.
    """
    c = np.asarray(coords, dtype=np.float64)
    basis = np.asarray(basis, dtype=np.float64)
    if basis.ndim != 2 or c.shape != (basis.shape[1],):
        raise ValueError(
            f"coords must have shape (k,) = ({basis.shape[-1]},) to match basis "
            f"{basis.shape}; found {c.shape}"
        )
    _check_basis(basis, basis.shape[0], center)
    lifted = basis @ c
    return lifted if center is None else lifted + np.asarray(center, dtype=np.float64)


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
    k = _check_k(k)
    _check_choice("method", method, SUBSPACE_METHODS)
    public = _check_matrix("public", public, min_rows=1)
    private = np.asarray(private, dtype=np.float64)
    if private.size == 0:
        private = private.reshape(0, public.shape[1])
    private = _check_matrix("private", private)
    if private.shape[1] != public.shape[1]:
        raise ValueError(
            f"public and private rows must have the same length d; "
            f"found {public.shape[1]} and {private.shape[1]}"
        )
    e_pub = _as_epsilons("eps_public", eps_public)
    e_pri = _as_epsilons("eps_private", eps_private)
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
    _check_k(k)
    _check_choice("split_method", split_method, SPLIT_METHODS)
    _check_choice("method", method, SUBSPACE_METHODS)
    _check_choice("no_public", no_public, NO_PUBLIC_POLICIES)
    shapes = _layer_shapes(updates)
    eps = _as_epsilons("epsilons", epsilons)
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
            _stack_layer(private_updates, layer)
            if pri
            else np.empty((0, math.prod(shape)))
        )
        agg, sub, layer_kept, layer_total = _pfa_layer(
            _stack_layer(public_updates, layer),
            private_rows,
            eps[pub],
            eps[pri],
            k=k,
            center=center,
            method=method,
            seed=seed,
        )
        kept, total = kept + layer_kept, total + layer_total
        dtype = _output_dtype([u[layer] for u in updates])
        aggregate.append(agg.reshape(shape).astype(dtype, copy=False))
        subspaces.append(replace(sub, shape=shape))
    diagnostics.update(_k_diagnostics(subspaces))
    diagnostics[DIAG_PRIVATE_ENERGY_KEPT] = kept / total if total > 0 else 1.0
    return aggregate, subspaces, diagnostics


def _k_diagnostics(subspaces: Sequence[LayerSubspace]) -> dict[str, float]:
    ks = [s.k for s in subspaces]
    return {DIAG_K_MIN: float(min(ks)), DIAG_K_MAX: float(max(ks))}


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
    _check_k(k)
    e_pub = _as_epsilons("eps_public", eps_public)
    e_pri = _as_epsilons("eps_private", eps_private)
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
        _layer_shapes(public_updates, "public_updates") if public_updates else shapes
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
            rows = _stack_layer(public_updates, layer)
            means.append((e_pub / e_pub.sum()) @ rows)
            totals.append(e_pub.sum())
            new = fit_layer_subspace(
                rows, k, center=center, method=method, seed=seed, shape=old.shape
            )
        agg = sum(t * m for t, m in zip(totals, means, strict=True)) / sum(totals)
        dtype = _output_dtype(
            [u[layer] for u in public_updates]
            or [c[layer] for c in private_coordinates]
        )
        aggregate.append(agg.reshape(old.shape).astype(dtype, copy=False))
        new_subspaces.append(new)
    diagnostics.update(_k_diagnostics(new_subspaces))
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
    _check_k(k)
    sizes = [int(d) for d in num_params_per_layer]
    if not sizes or any(d < 1 for d in sizes):
        raise ValueError(
            f"num_params_per_layer must be positive integers; found {sizes}"
        )
    if private and plus:
        return sum(min(k, d) for d in sizes)
    return sum(sizes)
