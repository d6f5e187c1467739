"""The w-bit packing of masked vectors (:mod:`protocol.bitpack`, :func:`protocol.secure_sum.pack_masked`).

Every packing is compared with a reference written here bit by bit from the format's definition
(bit j of value i is bit k mod 8 of byte ⌊k/8⌋, k = i·w + j; zero padding), apart from the
vectorised implementation.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocol.bitpack import PackError, pack, packed_size, unpack
from protocol.secure_sum import pack_masked, unpack_masked, wire_bits


def reference_pack(values: list[int], width: int) -> bytes:
    """The format's definition, one bit at a time."""
    out = bytearray((len(values) * width + 7) // 8)
    for i, value in enumerate(values):
        for j in range(width):
            if (value >> j) & 1:
                k = i * width + j
                out[k // 8] |= 1 << (k % 8)
    return bytes(out)


def reference_unpack(data: bytes, count: int, width: int) -> list[int]:
    """The inverse, one bit at a time."""
    return [sum(((data[(i * width + j) // 8] >> ((i * width + j) % 8)) & 1) << j for j in range(width))
            for i in range(count)]


def _random_values(rng: np.random.Generator, count: int, width: int) -> list[int]:
    values = [int(x) for x in rng.integers(0, 2**32, size=(count, 2), dtype=np.uint64) @ [1, 2**32]] \
        if width > 32 else [int(x) for x in rng.integers(0, 2**width, size=count, dtype=np.int64)]
    values = [v & ((1 << width) - 1) for v in values]
    if count >= 2:  # the extremes, where a carry or a sign would show
        values[0], values[-1] = 0, (1 << width) - 1
    return values


@pytest.mark.parametrize("seed", range(4))
def test_pack_and_unpack_agree_with_the_bit_by_bit_reference(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        width = int(rng.integers(1, 33)) if rng.random() < 0.8 else int(rng.integers(33, 65))
        count = int(rng.integers(0, 70))
        values = _random_values(rng, count, width)
        packed = pack(np.array(values, np.uint64), width)
        assert packed == reference_pack(values, width), (width, count)
        assert len(packed) == packed_size(count, width) == -(-count * width // 8)
        assert unpack(packed, count, width).tolist() == values == reference_unpack(packed, count, width)


def test_lengths_whose_bits_are_not_whole_bytes_are_covered():
    # d·b mod 8 takes every value 0..7 over these (d, b): the padding is exercised, not only whole bytes
    residues = {(count * width) % 8 for count in range(1, 9) for width in (3, 5, 7, 12, 20, 23)}
    assert residues == set(range(8))
    rng = np.random.default_rng(7)
    for count in range(1, 9):
        for width in (3, 5, 7, 12, 20, 23):
            values = _random_values(rng, count, width)
            assert pack(values, width) == reference_pack(values, width)


def test_a_large_vector_round_trips_at_every_width_of_the_experiments():
    rng = np.random.default_rng(3)
    for width in (12, 16, 20, 24, 29, 32):
        values = rng.integers(0, 2**width, size=2**17 + 3, dtype=np.int64)
        packed = pack(values, width)
        assert len(packed) == -(-values.size * width // 8)
        assert np.array_equal(unpack(packed, values.size, width), values.astype(np.uint64))
        head = [int(v) for v in values[:40]]  # the reference on a prefix (whole groups of 8: same bytes)
        assert packed[: 40 * width // 8] == reference_pack(head, width)


def test_values_outside_the_width_are_not_packed():
    with pytest.raises(ValueError, match="outside"):
        pack(np.array([0, 16]), 4)
    with pytest.raises(ValueError, match="outside"):
        pack(np.array([-1, 3]), 4)
    with pytest.raises(ValueError, match="integers"):
        pack(np.array([0.5]), 4)
    with pytest.raises(ValueError, match="width"):
        pack(np.array([1]), 0)


@pytest.mark.parametrize(("count", "width"), [(5, 12), (3, 5), (7, 23), (9, 1)])
def test_a_payload_with_a_padding_bit_set_or_the_wrong_length_is_refused(count, width):
    values = [(1 << width) - 1] * count
    good = pack(values, width)
    assert unpack(good, count, width).tolist() == values
    pad = len(good) * 8 - count * width
    assert 0 < pad < 8
    for bit in range(8 - pad, 8):  # each padding bit alone
        bad = good[:-1] + bytes([good[-1] | (1 << bit)])
        with pytest.raises(PackError, match="padding"):
            unpack(bad, count, width)
    for wrong in (good[:-1], good + b"\x00", b""):
        with pytest.raises(PackError, match=f"not the {len(good)}"):
            unpack(wrong, count, width)


def test_masked_arrays_travel_in_log2_m_bits_and_come_back_in_their_shapes():
    rng = np.random.default_rng(11)
    shapes = [(3, 5), (7,), (2, 2, 3)]
    for modulus in (2**12, 2**20, 2**29, 2**40):
        arrays = [rng.integers(0, modulus, size=s, dtype=np.int64) for s in shapes]
        payload = pack_masked(arrays, modulus)
        width = wire_bits(modulus)
        flat = [int(v) for a in arrays for v in a.ravel()]
        assert payload == reference_pack(flat, width) and len(payload) == -(-34 * width // 8)
        back = unpack_masked(payload, shapes, modulus)
        assert all(b.dtype == np.int64 and b.shape == s and np.array_equal(a, b)
                   for a, b, s in zip(arrays, back, shapes, strict=True))
    with pytest.raises(PackError, match="byte string"):
        unpack_masked([payload], shapes, 2**40)  # the old list-of-arrays form
    with pytest.raises(ValueError, match="outside"):
        pack_masked([np.array([2**12])], 2**12)
