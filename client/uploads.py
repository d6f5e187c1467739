"""What a client uploads: its full model (default) or a compressed form a method asks for.

The server chooses the format per node in the train config (``upload-format``); the only
compressed format is PFA+'s ``coordinates`` (the update projected on the basis the server
sent down, k values per layer, :mod:`client.pfa_coordinates`). The table of encoders lives
here so that the ClientApp stays free of method-specific code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from client.pfa_coordinates import encode_pfa_coordinates
from protocol import keys

#: format name -> encoder(request content, global weights, trained weights) -> ArrayRecord
Encoder = Callable[[RecordDict, Sequence[np.ndarray], Sequence[np.ndarray]], ArrayRecord]
ENCODERS: dict[str, Encoder] = {keys.UPLOAD_COORDINATES: encode_pfa_coordinates}


def encode_upload(
    request: RecordDict, global_weights: Sequence[np.ndarray], trained: Sequence[np.ndarray]
) -> ArrayRecord:
    """The ArrayRecord to send back, in the format the request asked for."""
    fmt = str(request[keys.CONFIG].get(keys.UPLOAD_FORMAT, keys.UPLOAD_FULL))
    if fmt == keys.UPLOAD_FULL:
        return ArrayRecord([np.asarray(w) for w in trained])
    if fmt not in ENCODERS:
        raise ValueError(f"'{keys.UPLOAD_FORMAT}' must be one of {[keys.UPLOAD_FULL, *ENCODERS]}; found {fmt!r}")
    return ENCODERS[fmt](request, global_weights, trained)
