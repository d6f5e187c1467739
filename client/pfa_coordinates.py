"""PFA+'s ``coordinates`` upload: k values per layer instead of the model (Alg. 4 l. 13).

The wire format (the basis record, c_ℓ = V_ℓᵀ(Δ_ℓ − μ_ℓ) per model array) is
:mod:`protocol.pfa_plus`. :mod:`client.uploads` lists the encoder.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from protocol import keys
from protocol.pfa_plus import encode_coordinates


def encode_pfa_coordinates(
    request: RecordDict, global_weights: Sequence[np.ndarray], trained: Sequence[np.ndarray]
) -> ArrayRecord:
    """The k coordinates of this round's update in the subspace the server sent.

    Raises
    ------
    ValueError
        If the request lacks the basis record, a layer's basis or centre, or a shape
        does not match the model.
    """
    if keys.PFA_BASIS_RECORD not in request.array_records:
        raise ValueError(
            f"'{keys.UPLOAD_FORMAT}' = '{keys.UPLOAD_COORDINATES}' needs the ArrayRecord "
            f"'{keys.PFA_BASIS_RECORD}' in the request; found {list(request.array_records)}"
        )
    subspace = request.array_records[keys.PFA_BASIS_RECORD]
    names = list(request[keys.ARRAYS].keys())
    coordinates: dict[str, Array] = {}
    for name, start, end in zip(names, global_weights, trained, strict=True):
        basis_key = keys.PROJECTION_BASIS_PREFIX + name
        if basis_key not in subspace:
            raise ValueError(f"'{keys.PFA_BASIS_RECORD}' has no '{basis_key}'")
        center_key = keys.PROJECTION_CENTER_PREFIX + name
        center = subspace[center_key].numpy() if center_key in subspace else None
        update = np.asarray(end, np.float64) - np.asarray(start, np.float64)
        coords = encode_coordinates(update, subspace[basis_key].numpy(), center=center)
        coordinates[name] = Array(coords.astype(np.asarray(end).dtype))
    return ArrayRecord(coordinates)
