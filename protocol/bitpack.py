"""w-bit packing of unsigned integer vectors: how a secure sum's masked vectors travel.

**Format.** n values v_0, …, v_{n−1}, each in [0, 2^w) with 1 ≤ w ≤ 64, become one byte string of
``packed_size(n, w)`` = ⌈n·w/8⌉ bytes, a little-endian bit stream: bit j of v_i (j = 0 the least
significant) is bit k mod 8 of byte ⌊k/8⌋, where k = i·w + j. The 8·⌈n·w/8⌉ − n·w bits after the
last value (fewer than 8) are zero. So w = 8, 16, 32, 64 give the values' little-endian bytes, and
the string carries no length, width or type: the reader knows n and w from elsewhere (a secure
sum's from its signed parameters: :mod:`protocol.secure_sum`) and refuses any other length, and
any padding bit that is set (:func:`unpack`), so one vector has exactly one encoding.

**How** (vectorised, no per-value Python loop). Eight consecutive values fill exactly w bytes, so
the values are cut into groups of eight, and value j of every group (a *phase*) starts at the same
bit offset 8·o_j + s_j = j·w of its group. For each of the eight phases, :func:`pack` shifts the
phase's values left by s_j as 64-bit words (a ninth byte takes the bits shifted out when w + s_j
> 64) and ORs their ⌈(w + s_j)/8⌉ low bytes into bytes o_j, o_j + 1, … of every group (kept as a
w × groups matrix, so that each operation runs over contiguous memory); within one phase the
values' bytes do not overlap, and the last phase ends at bit 8·w of its group, so no value spills
into the next group. :func:`unpack` reads the same bytes back and shifts right. About w + 8 numpy
operations over n/8 elements each way (w = 8, 16, 32, 64 are a plain cast).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_WIDTH", "PackError", "pack", "packed_size", "unpack"]

#: The widest value the format holds (one 64-bit word).
MAX_WIDTH = 64

_GROUP = 8  # values per group: 8 values of w bits fill exactly w bytes
_WHOLE_BYTES = (8, 16, 32, 64)  # widths whose packing is a plain cast (same format, faster)


class PackError(ValueError):
    """A byte string that is not the packing of ``count`` values of ``width`` bits (wrong length, padding set)."""


def _check_width(width: int) -> None:
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"a packed width must be in [1, {MAX_WIDTH}] bits; found {width}")


def packed_size(count: int, width: int) -> int:
    """⌈count·width/8⌉: the bytes of ``count`` values of ``width`` bits."""
    _check_width(width)
    if count < 0:
        raise ValueError(f"count must be >= 0; found {count}")
    return (count * width + 7) // 8


def _phases(width: int) -> list[tuple[int, int, int]]:
    """(column o_j, shift s_j, bytes touched) of phase j = 0..7 within a group of ``width`` bytes."""
    return [((j * width) >> 3, (j * width) & 7, (((j * width) & 7) + width + 7) >> 3) for j in range(_GROUP)]


def pack(values: npt.ArrayLike, width: int) -> bytes:
    """The ``width``-bit packing of ``values`` (flattened in C order; module docstring).

    Raises
    ------
    ValueError
        If a value is not an integer in [0, 2^width).
    """
    _check_width(width)
    v = np.asarray(values)
    if v.size and not np.issubdtype(v.dtype, np.integer):
        raise ValueError(f"only integers are packed; found {v.dtype}")
    v = v.ravel()
    if v.size and (int(v.min()) < 0 or int(v.max()) > (1 << width) - 1):
        raise ValueError(f"a value lies outside [0, 2^{width})")
    n = v.size
    if width in _WHOLE_BYTES:  # the format is then the values' little-endian bytes
        return v.astype(f"<u{width // 8}").tobytes()
    groups = -(-n // _GROUP)
    words = np.zeros((groups, _GROUP), np.uint64)
    words.reshape(-1)[:n] = v  # a view of the contiguous matrix; the last group's tail stays zero
    phase = np.ascontiguousarray(words.T)  # row j: value j of every group
    out = np.zeros((width, groups), np.uint8)  # byte c of every group, transposed: every operation is contiguous
    for j, (col, shift, touched) in enumerate(_phases(width)):
        low = phase[j] << np.uint64(shift)
        for c in range(min(touched, 8)):
            out[col + c] |= (low >> np.uint64(8 * c)).astype(np.uint8)
        if touched > 8:  # bits shifted out of the 64-bit word: width + shift > 64
            out[col + 8] |= (phase[j] >> np.uint64(64 - shift)).astype(np.uint8)
    return out.T.tobytes()[:packed_size(n, width)]


def unpack(data: bytes, count: int, width: int) -> npt.NDArray[np.uint64]:
    """The ``count`` values of ``width`` bits packed in ``data``, as uint64 (inverse of :func:`pack`).

    Raises
    ------
    PackError
        If ``data`` is not exactly :func:`packed_size` bytes, or a padding bit after the last value is set.
    """
    expected = packed_size(count, width)
    if not isinstance(data, bytes):
        raise PackError(f"expected {expected} bytes; found {type(data).__name__}")
    if len(data) != expected:
        raise PackError(f"{len(data)} bytes, not the {expected} that {count} values of {width} bits take")
    used = count * width
    if used % 8 and np.frombuffer(data, np.uint8, 1, expected - 1)[0] >> (used % 8):
        raise PackError(f"padding bits after the last of {count} values of {width} bits are set")
    if width in _WHOLE_BYTES:
        return np.frombuffer(data, f"<u{width // 8}").astype(np.uint64)
    groups = -(-count // _GROUP)
    buf = np.zeros(groups * width, np.uint8)
    buf[:expected] = np.frombuffer(data, np.uint8)
    matrix = buf.reshape(groups, width)
    mask = np.uint64((1 << width) - 1)
    words = np.empty((groups, _GROUP), np.uint64)
    for j, (col, shift, touched) in enumerate(_phases(width)):
        cells = np.zeros((groups, 8), np.uint8)
        cells[:, :min(touched, 8)] = matrix[:, col:col + min(touched, 8)]
        value = cells.view("<u8").reshape(groups) >> np.uint64(shift)
        if touched > 8:
            value |= matrix[:, col + 8].astype(np.uint64) << np.uint64(64 - shift)
        words[:, j] = value & mask
    return words.reshape(-1)[:count].astype(np.uint64)
