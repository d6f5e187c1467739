"""PFA's subspace of the public clients' updates, per layer (Alg. 3 lines 2-4, 7; Appendix D.2).

:func:`fit_layer_subspace` finds the top-k right singular vectors V_k of the public
updates matrix A (centred on the unweighted public mean μ in the authors' variant) and
:func:`project` maps a vector onto μ + V_k V_kᵀ (x − μ). Paper and code variants:
:mod:`strategies.pfa_projection`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from privacy.checks import check_choice, check_int
from protocol.pfa_plus import check_basis
from strategies.layers import check_matrix

_LOG = logging.getLogger(__name__)

SUBSPACE_METHODS: Final = ("exact", "randomized", "random")


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
    public = check_matrix("public_layer_updates", public_layer_updates, min_rows=1)
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
    ``docs/notes/original-code.md`` §2, so an exact method is the default.)

    Parameters
    ----------
    public_layer_updates : np.ndarray
        Shape (n_pub, d), one flattened layer update per public client.
    k : int
        Requested dimension, ≥ 1. Clipped (with a logged note) to the numerical rank of
        A, which is ≤ n_pub − 1 when centred and ≤ n_pub otherwise: directions with a
        zero singular value are arbitrary and would project on noise (docs/notes/pfa.md §7.5).
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
    k = check_int("k", k, minimum=1)
    check_choice("method", method, SUBSPACE_METHODS)
    public = check_matrix("public_layer_updates", public_layer_updates, min_rows=1)
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
    public = check_matrix("public_layer_updates", public_layer_updates, min_rows=1)
    d = public.shape[1]
    shape = (d,) if shape is None else tuple(shape)
    if math.prod(shape) != d:
        raise ValueError(f"shape {shape} does not hold d={d} values")
    basis = public_subspace(public, k, center=center, method=method, seed=seed)
    return LayerSubspace(
        basis=basis, center=public_center(public, center=center), shape=shape
    )


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
    basis = check_basis(basis, x.shape[-1], center)
    offset = 0.0 if center is None else np.asarray(center, dtype=np.float64)
    projected: np.ndarray = offset + ((x - offset) @ basis) @ basis.T
    return projected
