"""Client updates as lists of layers: shapes, stacking, dtypes and the weighted mean.

An *update* is one client's list of numpy arrays, one per model tensor. Every aggregation
rule (FedAvg's example-weighted mean, WeiAvg's ε-weighted mean, PFA's projection) works
layer by layer on these helpers; :func:`weighted_mean` is the one weighted mean of the
project.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Update = Sequence[np.ndarray]


def as_epsilons(name: str, epsilons: Sequence[float] | np.ndarray) -> np.ndarray:
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


def check_matrix(name: str, matrix: np.ndarray, *, min_rows: int = 0) -> np.ndarray:
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


def layer_shapes(
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


def output_dtype(layers: Sequence[np.ndarray]) -> np.dtype:
    """Floating dtype of the inputs (float32 stays float32), float64 for non-floats."""
    dtype = np.result_type(*[np.asarray(layer).dtype for layer in layers])
    return dtype if np.issubdtype(dtype, np.floating) else np.dtype(np.float64)


def stack_layer(updates: Sequence[Update], layer: int) -> np.ndarray:
    """Rows = clients, columns = flattened layer ``layer``, float64."""
    rows = np.empty((len(updates), np.size(updates[0][layer])), dtype=np.float64)
    for row, update in zip(rows, updates, strict=True):
        row[:] = np.ravel(update[layer])  # one pass: copy and widen to float64
    return rows


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
    shapes = layer_shapes(updates)
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
        dtype = output_dtype([u[layer] for u in updates])
        # a running sum, one client at a time: memory of one layer, not of every client's copy
        # of it (120 clients × a 1.7M-parameter model stacked in float64 is 1.6 GB)
        mean = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=np.float64)
        scaled = np.empty_like(mean)
        for weight, update in zip(w, updates, strict=True):
            np.multiply(np.ravel(update[layer]), weight, out=scaled, dtype=np.float64)
            mean += scaled
        result.append(mean.reshape(shape).astype(dtype, copy=False))
    return result
