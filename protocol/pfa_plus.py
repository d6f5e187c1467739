"""PFA+'s wire format: k coordinates per layer instead of the layer (Alg. 4 l. 13, Alg. 5 l. 4).

The server sends, beside the global model, the ArrayRecord ``keys.PFA_BASIS_RECORD`` holding
for every model array ℓ the previous round's orthonormal basis ``"basis/<ℓ>"`` (V_ℓ, d_ℓ × k_ℓ)
and, when it centres, the centre ``"center/<ℓ>"`` (μ_ℓ, d_ℓ). A private client uploads
c_ℓ = V_ℓᵀ(Δ_ℓ − μ_ℓ), one vector of k_ℓ values per model array, in the model's order and
dtype, under the model arrays' names; the server lifts it back with V_ℓ c_ℓ + μ_ℓ. Both sides
use the two functions below (:mod:`client.pfa_coordinates` encodes, :mod:`strategies.pfa`
decodes), so the format lives here once.
"""

from __future__ import annotations

import numpy as np


def check_basis(basis: np.ndarray, d: int, center: np.ndarray | None) -> np.ndarray:
    """V as float64 (d, k), after checking its shape and that μ, if given, has shape (d,)."""
    basis = np.asarray(basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[0] != d:
        raise ValueError(f"basis must have shape (d={d}, k); found {basis.shape}")
    if center is not None and np.shape(center) != (d,):
        raise ValueError(f"center must have shape ({d},); found {np.shape(center)}")
    return basis



def encode_coordinates(
    update_layer: np.ndarray, basis: np.ndarray, *, center: np.ndarray | None = None
) -> np.ndarray:
    """PFA+ client side: the k coordinates c = Vᵀ (Δ − μ) of one layer (Alg. 4 line 13).

    ``update_layer`` may have the layer's tensor shape; it is flattened (size d).
    Returns a float64 vector of length k = ``basis.shape[1]``.
    """
    x = np.asarray(update_layer, dtype=np.float64).ravel()
    basis = check_basis(basis, x.size, center)
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
    check_basis(basis, basis.shape[0], center)
    lifted = basis @ c
    return lifted if center is None else lifted + np.asarray(center, dtype=np.float64)
