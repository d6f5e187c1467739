"""The IDX file format (the MNIST family's on-disk arrays): read and write, gzip-compressed or not.

An IDX file is a 4-byte magic number ``0x00 0x00 <type code> <ndim>``, ``ndim`` big-endian
uint32 dimensions, then the array's items in big-endian C order (:data:`_IDX_DTYPES` maps the
type codes to dtypes).
"""

from __future__ import annotations

import gzip
import math
import struct
from pathlib import Path
from typing import Any, Final

import numpy as np

__all__ = ["idx_read", "idx_write"]

_IDX_DTYPES: Final[dict[int, np.dtype[Any]]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    """File content, gunzipped when it starts with the gzip magic number."""
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def idx_read(path: str | Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzip-compressed or not.

    Parameters
    ----------
    path : str or Path
        The file. Compression is detected from the content, not the name.

    Returns
    -------
    np.ndarray
        The array with the dimensions given in the header, in native byte order.

    Raises
    ------
    ValueError
        If the header is not a valid IDX header or the size does not match it.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (the magic number must start with 0x0000)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise ValueError(f"{path}: unknown IDX type code 0x{code:02X}; allowed: {allowed}")
    dtype = _IDX_DTYPES[code]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions announced)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    count = math.prod(dims)
    if len(raw) - header != count * dtype.itemsize:
        raise ValueError(
            f"{path}: IDX header announces shape {dims} ({count * dtype.itemsize} bytes) "
            f"but {len(raw) - header} bytes follow"
        )
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=header)
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def idx_write(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file, gzip-compressed when ``path`` ends in ``.gz``.

    Useful for test fixtures in the MNIST on-disk format.

    Raises
    ------
    ValueError
        If the dtype has no IDX type code.
    """
    path = Path(path)
    array = np.asarray(array)
    codes = {dt.newbyteorder("="): code for code, dt in _IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        allowed = ", ".join(str(dt) for dt in codes)
        raise ValueError(f"idx_write: dtype {array.dtype} has no IDX code; allowed: {allowed}")
    code = codes[native]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(_IDX_DTYPES[code]).tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)
