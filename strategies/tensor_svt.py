"""The tensor singular value thresholding FedCEO smooths with (Eq. (3), (12); Lu et al.'s t-SVD).

Clients' copies of one parameter tensor are stacked along a third, "client" mode
(:func:`stack_clients`), transformed by the unnormalised DFT along that mode, and every Fourier
slice is soft-thresholded at ``thr`` (:func:`svt_matrix`, :func:`tensor_svt`). Why this is the
proximal operator of the tensor nuclear norm, and how the threshold is set, is the docstring of
:mod:`strategies.fedceo_smoothing`. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from privacy.checks import check_nonnegative_finite

Model = Sequence[np.ndarray]

# Upper bound on the complex slices handed to one batched SVD call (64 MiB). Bounds
# the working memory (one LeNet-5 fc1 slice is 1600×512 complex128 = 13 MB) and avoids
# page-fault overhead; it does not change the result.
_CHUNK_BYTES = 1 << 26


def same_shapes(tensors: Sequence[np.ndarray], what: str) -> tuple[int, ...]:
    """The common shape of every client's copy; ValueError naming ``what`` if none or they differ."""
    if len(tensors) == 0:
        raise ValueError(f"{what}: need at least one client; found none")
    shape = np.shape(tensors[0])
    for k, tensor in enumerate(tensors):
        if np.shape(tensor) != shape:
            raise ValueError(
                f"{what}: client {k} has shape {np.shape(tensor)}, "
                f"client 0 has shape {shape}"
            )
    return shape


def float_dtype(array: np.ndarray, name: str) -> np.dtype:
    """``array``'s dtype, which must be real floating point (TypeError naming ``name``)."""
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"{name} must have a real floating dtype; found {array.dtype}")
    return array.dtype


# ------------------------------------------------------------------- tensor layout
def _matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """(n1, n2) of one client's frontal slice: n2 = shape[0], n1 = prod(shape[1:])."""
    if len(shape) == 0:
        return 1, 1
    return math.prod(shape[1:]), shape[0]


def stack_clients(
    tensors: Sequence[np.ndarray],
) -> tuple[NDArray[np.generic], tuple[int, ...]]:
    """Fold K client copies of one parameter into a third-order tensor (n1, n2, K).

    Follows the authors' code: ``np.array([P_1, ..., P_K]).transpose()`` reverses all
    axes, putting the client index last, then the leading axes are flattened (C order)
    into n1. For a parameter of PyTorch shape ``(d0, d1, ..., dm)`` the frontal slice of
    client k is the ``(d1·…·dm) × d0`` matrix of its reversed axes, so n2 is always the
    output dimension d0:

    - Linear ``(out, in)`` -> ``(in, out, K)``, ``T[c, o, k] = W_k[o, c]``
      (d = in_features, h = out_features in the paper's d × h × K).
    - Conv2d ``(out, in, kh, kw)`` -> ``(kw·kh·in, out, K)``,
      ``T[(j·kh + i)·in + c, o, k] = W_k[o, c, i, j]``.
    - bias ``(out,)`` -> ``(1, out, K)``, ``T[0, o, k] = b_k[o]``; each slice is a row
      vector, so SVT shrinks its Euclidean norm per frequency.
    - scalar ``()`` -> ``(1, 1, K)``, ``T[0, 0, k] = s_k``.

    A row permutation of the slices (kw·kh·in versus kh·kw·in) does not change the
    result of :func:`tensor_svt`, since SVT is equivariant under permutations.

    Parameters
    ----------
    tensors : sequence of ndarray
        The K clients' copies of one parameter, all of the same shape, in client order.

    Returns
    -------
    tensor3 : ndarray, shape (n1, n2, K)
        The stacked tensor (dtype as ``np.stack`` gives it).
    original_shape : tuple of int
        The parameter shape, for :func:`unstack_clients`.

    Raises
    ------
    ValueError
        If there are no clients or the shapes differ across clients.
    """
    shape = same_shapes(tensors, "stack_clients")
    n1, n2 = _matrix_shape(shape)
    stacked = np.stack([np.asarray(t) for t in tensors])  # (K, d0, ..., dm)
    tensor3 = stacked.transpose().reshape(n1, n2, len(tensors))
    return tensor3, shape


def unstack_clients(
    tensor3: np.ndarray, original_shape: Sequence[int]
) -> list[NDArray[np.generic]]:
    """Inverse of :func:`stack_clients`: split (n1, n2, K) into K arrays of the shape.

    Raises
    ------
    ValueError
        If ``tensor3`` is not 3-D or its first two axes do not match the shape.
    """
    shape = tuple(int(d) for d in original_shape)
    if tensor3.ndim != 3:
        raise ValueError(f"tensor3 must be 3-D (n1, n2, K); found {tensor3.shape}")
    if tensor3.shape[:2] != _matrix_shape(shape):
        raise ValueError(
            f"tensor3 of shape {tensor3.shape} does not fold back to parameter shape "
            f"{shape}: expected leading axes {_matrix_shape(shape)}"
        )
    num_clients = tensor3.shape[2]
    per_client = tensor3.reshape(shape[::-1] + (num_clients,)).transpose()
    return [np.array(per_client[k], order="C") for k in range(num_clients)]


# --------------------------------------------------------------- thresholding
def _svt_batch(slices: np.ndarray, threshold: float) -> np.ndarray:
    """Soft-threshold the singular values of a batch of matrices (..., n1, n2).

    Returns ``U diag(max(σ − thr, 0)) V^H`` for each matrix (Eq. (12)), computed from
    one batched thin SVD. Only the components that survive are multiplied back.
    """
    u, s, vh = np.linalg.svd(slices, full_matrices=False)
    s = np.maximum(s - threshold, 0.0)
    rank = int(np.count_nonzero(s, axis=-1).max(initial=0))  # σ sorted descending
    u, s, vh = u[..., :rank], s[..., :rank], vh[..., :rank, :]
    return np.matmul(u * s[..., None, :], vh)


def svt_matrix(m: np.ndarray, threshold: float) -> np.ndarray:
    """Matrix singular value thresholding ``SVT(M, thr) = U diag(max(σ − thr, 0)) V^H``.

    The proximal operator of the matrix nuclear norm (Cai et al. 2010; Lemma B.1)::

        SVT(M, thr) = argmin_X ½‖X − M‖_F² + thr‖X‖_*.

    The FedCEO global model on a smoothing round is ``SVT(mean_k W_k, thr/K)`` for each
    parameter matrix (see :func:`smoothed_mean_model` and the module docstring).

    Parameters
    ----------
    m : ndarray, shape (n1, n2)
        Real floating or complex matrix.
    threshold : float
        thr >= 0.

    Returns
    -------
    ndarray, shape (n1, n2)
        Computed in double precision, returned in the dtype of ``m``.

    Raises
    ------
    ValueError
        If ``m`` is not 2-D or the threshold is negative or not finite.
    TypeError
        If ``m`` is neither real floating nor complex.
    """
    thr = check_nonnegative_finite("threshold", threshold)
    m = np.asarray(m)
    if m.ndim != 2:
        raise ValueError(f"svt_matrix expects a 2-D matrix; found shape {m.shape}")
    if np.issubdtype(m.dtype, np.complexfloating):
        work = m.astype(np.complex128, copy=False)
    else:
        float_dtype(m, "svt_matrix input")
        work = m.astype(np.float64, copy=False)
    return _svt_batch(work[None], thr)[0].astype(m.dtype, copy=False)


def tensor_svt(
    tensor3: np.ndarray, threshold: float, *, half_spectrum: bool = True
) -> np.ndarray:
    """T-tSVD: tensor singular value thresholding along the client mode (Algorithm 4).

    Computes ``IDFT(fold([SVT(Ȳ^(0), thr), …, SVT(Ȳ^(K−1), thr)]), 3)`` with the
    unnormalised DFT, which is (module docstring; Theorem 3.1, Eq. (3))::

        argmin_X  ½‖X − Y‖_F² + thr · ‖X‖_⊛,   ‖X‖_⊛ = (1/K) Σ_k ‖X̄^(k)‖_*
        = argmin_X  (1/(2·thr))‖X − Y‖_F² + ‖X‖_⊛.

    Parameters
    ----------
    tensor3 : ndarray, shape (n1, n2, K)
        Real floating tensor, clients along axis 2 (see :func:`stack_clients`).
    threshold : float
        thr >= 0, applied to the singular values of every Fourier slice.
    half_spectrum : bool, default True
        Use ``rfft``/``irfft(n=K)`` and threshold only the ⌊K/2⌋+1 non-redundant
        slices; slice K−k is the complex conjugate of slice k for real input, and SVT
        commutes with conjugation. ``False`` thresholds all K slices of ``fft``
        (the reference computation of the authors' code).

    Returns
    -------
    ndarray, shape (n1, n2, K)
        Real part of the inverse DFT, computed in float64, returned in the input dtype.

    Raises
    ------
    ValueError
        If the input is not 3-D or the threshold is negative or not finite.
    TypeError
        If the input is not real floating point.
    """
    thr = check_nonnegative_finite("threshold", threshold)
    tensor3 = np.asarray(tensor3)
    if tensor3.ndim != 3:
        raise ValueError(f"tensor_svt expects shape (n1, n2, K); found {tensor3.shape}")
    dtype = float_dtype(tensor3, "tensor_svt input")
    num_clients = tensor3.shape[2]
    # Clients first, so that every Fourier slice is a contiguous (n1, n2) matrix.
    work = np.moveaxis(tensor3, 2, 0).astype(np.float64, copy=False)
    if half_spectrum:
        spectrum = np.fft.rfft(work, axis=0)  # (K//2 + 1, n1, n2)
    else:
        spectrum = np.fft.fft(work, axis=0)  # (K, n1, n2)
    # Batched SVDs, in chunks of slices that bound the working memory.
    step = max(1, _CHUNK_BYTES // max(1, spectrum[0].nbytes))
    for start in range(0, spectrum.shape[0], step):
        chunk = spectrum[start : start + step]
        spectrum[start : start + step] = _svt_batch(chunk, thr)
    if half_spectrum:
        out = np.fft.irfft(spectrum, n=num_clients, axis=0)
    else:
        out = np.fft.ifft(spectrum, axis=0).real
    return np.ascontiguousarray(np.moveaxis(out, 0, 2), dtype=dtype)
