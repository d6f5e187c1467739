"""Server-side mathematics of FedCEO: tensor low-rank smoothing of client models.

Paper: Li et al., "Clients Collaborate: Flexible Differentially Private Federated
Learning with Guaranteed Improvement of Utility-Privacy Trade-off" (FedCEO), ICML 2025,
https://arxiv.org/abs/2402.07002. Equation numbers below refer to the arXiv version.

Pure numpy; no Flower imports. The strategy module converts records and calls these.

Notation
--------
K clients upload one copy each of a parameter tensor. The copies are stacked along a
third ("client") mode into ``Y`` of shape ``(n1, n2, K)`` (see :func:`stack_clients`).
``Ȳ = DFT(Y, 3)`` is the **unnormalised** DFT along the client mode, ``numpy.fft.fft``
with its default ``norm="backward"``, and ``Ȳ^(k)`` is its k-th frontal slice
(k = 0 .. K-1; k = 0 is the DC slice, ``Ȳ^(0) = Σ_k Y^(k) = K · mean_k Y^(k)``).

Tensor nuclear norm (Definition 2.2, Lu et al. 2016/2019)::

    ‖X‖_⊛ = (1/K) Σ_{k=0}^{K-1} ‖X̄^(k)‖_*      (mean of the slice nuclear norms)

What the closed form minimises (derived here; Theorem 3.1 / Eq. (3), proof Eq. (8))
-------------------------------------------------------------------------------------
For a threshold ``thr ≥ 0``::

    tensor_svt(Y, thr) = argmin_X  ½‖X − Y‖_F² + thr · ‖X‖_⊛
                       = argmin_X  ½‖X − Y‖_F² + (thr/K) Σ_k ‖X̄^(k)‖_*
                       = argmin_X  τ‖X − Y‖_F² + ‖X‖_⊛    with τ = 1/(2·thr), thr > 0.

Proof: the unnormalised DFT satisfies Parseval as ‖X‖_F² = (1/K)‖X̄‖_F², so the first
objective equals (1/K) Σ_k [½‖X̄^(k) − Ȳ^(k)‖_F² + thr‖X̄^(k)‖_*]. It separates over
the Fourier slices, and each slice is solved by matrix singular value thresholding at
``thr`` (SVT lemma, Cai et al. 2010; Lemma B.1): U diag(max(σ − thr, 0)) V^H (Eq. (12)).
SVT commutes with complex conjugation, so the slice-wise minimisers keep the conjugate
symmetry Ȳ^(K−k) = conj(Ȳ^(k)) of a real tensor, their inverse DFT is real, and the
minimiser over complex tensors is also the minimiser over real ones.

FedCEO's server objective (Eq. (2)) is ``(λ/ϑ^{t/I})‖W − W_N‖_F² + ‖W‖_⊛``: the third
form above with τ = λ/ϑ^{t/I}, hence the threshold of :func:`smoothing_threshold`,
``thr(t) = ϑ^{t/I} / (2λ)``. The threshold scale is tied to the unnormalised DFT: with
``norm="ortho"`` every slice singular value shrinks by √K and the same λ would mean a
threshold √K times larger relative to the spectrum.

Global model (Proposition 3.2, Eq. (17), generalised)
------------------------------------------------------
Averaging over clients keeps only the DC slice of the inverse DFT, and the DC slice of
the data is K times the plain average. Hence, for every threshold (not only those above
the non-DC spectrum, which is the case Proposition 3.2 states)::

    mean_k [tensor_svt(Y, thr)]^(k) = SVT(Ȳ^(0), thr) / K = SVT(mean_k Y^(k), thr / K).

So on a smoothing round the FedCEO global model is the FedAvg average with each
parameter matrix soft-thresholded at ``thr/K`` (:func:`smoothed_mean_model`); the
non-DC slices only shape the personalised client models ŵ_k(t).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privacy.checks import check_int, check_nonnegative_finite, check_positive_finite, check_real
from strategies.tensor_svt import (
    Model,
    float_dtype,
    same_shapes,
    stack_clients,
    svt_matrix,
    tensor_svt,
    unstack_clients,
)

__all__ = [
    "is_smoothing_round",
    "mean_model",
    "smooth_client_models",
    "smoothed_mean_model",
    "smoothing_threshold",
    "stack_clients",
    "svt_matrix",
    "tensor_svt",
    "unstack_clients",
]



# --------------------------------------------------------------------------- validation


def _check_models(models: Sequence[Model]) -> int:
    """Check that all clients hold the same parameter list; return its length."""
    if len(models) == 0:
        raise ValueError("need at least one client model; found none")
    num_params = len(models[0])
    for k, model in enumerate(models):
        if len(model) != num_params:
            raise ValueError(
                f"client {k} has {len(model)} parameter tensors, "
                f"client 0 has {num_params}"
            )
    for i in range(num_params):
        same_shapes([model[i] for model in models], f"parameter {i}")
    return num_params


def _select_layers(
    model: Model, layers: Sequence[int] | None, num_params: int
) -> list[int]:
    """Explicit, checked ``layers``; or, for None, every floating-point parameter."""
    if layers is None:
        return [
            i
            for i in range(num_params)
            if np.issubdtype(np.asarray(model[i]).dtype, np.floating)
        ]
    selected = [check_int("layer index", i, minimum=0) for i in layers]
    for i in selected:
        if i >= num_params:
            raise ValueError(
                f"layer index {i} out of range for a model with {num_params} parameters"
            )
    if len(set(selected)) != len(selected):
        raise ValueError(f"layers contains duplicates: {list(layers)}")
    return selected


# ------------------------------------------------------------------------ schedule
def smoothing_threshold(
    server_round: int, *, lam: float, theta: float, interval: int
) -> float:
    """Adaptive T-tSVD threshold ``thr(t) = ϑ^{t/I} / (2λ)`` (Eq. (2), Theorem 3.1).

    Eq. (2) weights the proximity term by ``τ = λ/ϑ^{t/I}``; Theorem 3.1 turns
    ``τ‖W − W_N‖_F² + ‖W‖_⊛`` into a T-tSVD with threshold ``1/(2τ)``. The threshold
    grows geometrically with the number of smoothing events t/I when ϑ > 1;
    ϑ = 1 gives the constant threshold 1/(2λ) of the "FedCEO (ϑ=1)" ablation.

    Parameters
    ----------
    server_round : int
        Round t >= 0 (Flower rounds start at 1; t = 0 gives the initial 1/(2λ)).
    lam : float
        Initial coefficient λ > 0. Smaller λ means a larger threshold.
    theta : float
        Common ratio ϑ >= 1.
    interval : int
        Smoothing interval I >= 1.

    Returns
    -------
    float
        The threshold applied to the singular values of every Fourier slice of the
        unnormalised DFT (see the module docstring).

    Raises
    ------
    ValueError
        If λ <= 0, ϑ < 1, I < 1, t < 0, or a value is not finite.
    """
    t = check_int("server_round", server_round, minimum=0)
    lam_ = check_positive_finite("lam", lam)
    theta_ = check_real("theta", theta, minimum=1.0)
    i = check_int("interval", interval, minimum=1)
    return theta_ ** (t / i) / (2.0 * lam_)


def is_smoothing_round(server_round: int, interval: int) -> bool:
    """Whether round t smooths, i.e. ``t % I == 0`` (Algorithm 2, line 11).

    Raises
    ------
    ValueError
        If t < 0 or I < 1.
    """
    t = check_int("server_round", server_round, minimum=0)
    i = check_int("interval", interval, minimum=1)
    return t % i == 0


# ------------------------------------------------------------------ whole models
def smooth_client_models(
    client_models: Sequence[Model],
    threshold: float,
    *,
    layers: Sequence[int] | None = None,
    half_spectrum: bool = True,
) -> list[list[np.ndarray]]:
    """FedCEO server step: smooth every parameter tensor across clients (Alg. 2, l. 13).

    For each parameter index i, the K clients' copies are folded into W_N ∈ R^{n1×n2×K}
    (:func:`stack_clients`), replaced by ``tensor_svt(W_N, thr)`` (Eq. (2)-(3)) and
    unfolded again, giving the personalised models ŵ_k(t). Each parameter tensor is
    smoothed independently with the same threshold, as in the authors' code.

    Parameters
    ----------
    client_models : sequence of sequences of ndarray
        ``client_models[k][i]``: parameter i of client k. All clients must have the same
        parameter shapes. Client order is the order along the client mode; the result
        depends on it except through the mean (DC slice).
    threshold : float
        thr >= 0, e.g. :func:`smoothing_threshold`.
    layers : sequence of int, optional
        Parameter indices to smooth (the paper's §3.3 suggests only the last layers for
        large models). Others are returned unchanged, as copies. ``None`` smooths every
        floating-point parameter and leaves non-floating ones (e.g. integer counters).
    half_spectrum : bool, default True
        See :func:`tensor_svt`.

    Returns
    -------
    list of list of ndarray
        ``out[k][i]``: smoothed parameter i of client k, in the input dtype.

    Raises
    ------
    ValueError
        On an empty client list, ragged parameter lists or shapes, a bad layer index or
        a bad threshold.
    TypeError
        If an explicitly selected parameter is not floating point.
    """
    thr = check_nonnegative_finite("threshold", threshold)
    num_params = _check_models(client_models)
    selected = _select_layers(client_models[0], layers, num_params)
    out = [[np.array(p, copy=True) for p in model] for model in client_models]
    for i in selected:
        tensor3, shape = stack_clients([model[i] for model in client_models])
        float_dtype(tensor3, f"parameter {i}")
        smoothed = tensor_svt(tensor3, thr, half_spectrum=half_spectrum)
        for k, param in enumerate(unstack_clients(smoothed, shape)):
            out[k][i] = param
    return out


def mean_model(models: Sequence[Model]) -> list[np.ndarray]:
    """Unweighted FedAvg average ``w = (1/K) Σ_k w_k`` of each parameter.

    Accumulates in float64; floating parameters are returned in their own dtype,
    others as float64.

    Raises
    ------
    ValueError
        On an empty list or ragged parameter lists or shapes.
    """
    num_params = _check_models(models)
    averaged: list[np.ndarray] = []
    for i in range(num_params):
        first = np.asarray(models[0][i])
        stacked = np.stack([np.asarray(m[i]) for m in models])
        avg = np.mean(stacked, axis=0, dtype=np.float64)
        if np.issubdtype(first.dtype, np.floating):
            avg = avg.astype(first.dtype, copy=False)
        averaged.append(np.asarray(avg))
    return averaged


def smoothed_mean_model(
    client_models: Sequence[Model],
    threshold: float,
    *,
    layers: Sequence[int] | None = None,
) -> list[np.ndarray]:
    """Global FedCEO model on a smoothing round without the tensor SVD.

    Implements the identity (module docstring; Proposition 3.2, Eq. (17))::

        mean_k smooth_client_models(W, thr)[k][i] = SVT(mean_k W_k[i], thr / K),

    where each averaged parameter is viewed as the (n1, n2) matrix of
    :func:`stack_clients` (a single frontal slice). The DC slice of the unnormalised
    DFT is ``K · mean``, and averaging the inverse DFT over clients keeps only that
    slice, so ``SVT(K·mean, thr)/K = SVT(mean, thr/K)``. Costs one SVD per parameter
    instead of ⌊K/2⌋+1.

    Parameters
    ----------
    client_models, threshold, layers
        As in :func:`smooth_client_models`; parameters outside ``layers`` are plainly
        averaged.

    Returns
    -------
    list of ndarray
        The global model w'(t) = (1/K) Σ_k ŵ_k(t) (Algorithm 2; App. B.3).
    """
    thr = check_nonnegative_finite("threshold", threshold)
    num_params = _check_models(client_models)
    averaged = mean_model(client_models)
    selected = _select_layers(client_models[0], layers, num_params)
    scaled = thr / len(client_models)
    for i in selected:
        float_dtype(np.asarray(client_models[0][i]), f"parameter {i}")
        tensor3, shape = stack_clients([averaged[i]])
        matrix = svt_matrix(tensor3[:, :, 0], scaled)
        averaged[i] = unstack_clients(matrix[:, :, None], shape)[0]
    return averaged
