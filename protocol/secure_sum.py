"""The records of privet's secure-sum stages, and what their signatures cover, for both sides.

The server (:mod:`strategies.secure_sum`) and each member (:mod:`client.secure_sum`) read the
same :class:`SumParameters` and sign or verify the same transcripts (:mod:`protocol.roster`).

A sum runs one of two modes (:data:`SUM_MODES`): ``"secagg+"`` (each member's float update,
Gaussian noise already added, stochastically quantised: :mod:`privacy.secure_sum`) or
``"secagg+ddg"`` (each member's rotated, rounded update with a discrete Gaussian share:
:mod:`privacy.mechanisms.ddg`). The mode and every number of the distributed discrete Gaussian
(d, s, β, σ², B², b and the wrap-around target) are parameters, so each member's signature
covers them: members shown different parameters compute different digests and their signature
checks fail. Each member also recomputes them (:meth:`SumParameters.ddg_mismatch`).

**A masked input on the wire.** A member's collect reply carries its masked input under
``keys.SECAGG_MASKED`` (``"masked"``) as one byte string: every coordinate of its arrays (the
model's arrays in order, each in C order; a ``secagg+ddg`` sum's one vector of d' integers), each a
value mod M, packed in w = log₂ M bits (:func:`pack_masked`, the bit layout of
:mod:`protocol.bitpack`): ⌈D·w/8⌉ bytes for D coordinates, with no header (D, M and the shapes
come from the sum's signed parameters and the model). For ``secagg+ddg`` w = b = ``secagg.bits``.
For ``secagg+`` w = log₂ M with M the smallest power of two above K·(2^b − 1) (b the quantisation's
bits, K the members): a masked coordinate is uniform on [0, M), so it needs all log₂ M bits, about
b + log₂ K. The server reads it back with :func:`unpack_masked`, which refuses a payload of any
other length, or with a padding bit set (a vector has exactly one encoding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from privacy.distributed_discrete_gaussian import MAX_BITS as DDG_MAX_BITS
from privacy.distributed_discrete_gaussian import DDGParameters, ddg_parameters
from protocol import keys
from protocol.bitpack import PackError, pack, packed_size, unpack
from protocol.config import typed
from protocol.roster import digest, transcript

__all__ = ["DDG", "GAUSSIAN", "SUM_MODES", "PackError", "SumParameters", "consistency_threshold", "keys_transcript",
           "pack_masked", "rotation_seed", "survivors_transcript", "unpack_masked", "wire_bits"]

#: The largest modulus whose sums int64 arithmetic holds exactly.
MAX_MODULUS = 2**62

#: The sum modes, named as the run config's ``secure-aggregation`` names them.
GAUSSIAN = "secagg+"
DDG = "secagg+ddg"
SUM_MODES = (GAUSSIAN, DDG)

#: Relative tolerance when a member compares the server's DDG numbers with its own: libm's log and
#: exp may differ by an ulp between platforms; σ² and B² are integers (or on a 2⁻²⁰ grid), one unit apart.
_DDG_RTOL = 1e-9


@dataclass(frozen=True)
class SumParameters:
    """One secure sum's parameters, sent at setup and signed (through :meth:`digest`) by every member.

    Attributes
    ----------
    sum_id : str
        Unique per run, round and sum (the signatures of one sum cannot be replayed in another).
    members, threshold, min_survivors : int
        n sampled members, the Shamir threshold t (2 <= t <= n) and the server's r_min.
    clipping_range, levels, modulus : float, int, int
        The quantisation (:class:`privacy.secure_sum.Quantisation`).
    clip, noise_multiplier, noise_shares : float, float, int
        The mechanism every member runs (C, σ, m): a member refuses a train config that differs.
    mode : str
        One of :data:`SUM_MODES`.
    dim, scale, beta, local_sigma_sq, norm_bound_sq, bits, wrap_target : int, float, float, str, int, int, float
        The distributed discrete Gaussian (``mode = "secagg+ddg"``; zeros and "" otherwise): d, s, β,
        σ² as ``"numerator/denominator"``, B², b (M = 2^b = ``modulus``) and the wrap-around
        probability the scale was chosen for (:class:`privacy.distributed_discrete_gaussian.DDGParameters`).
    """

    sum_id: str
    members: int
    threshold: int
    min_survivors: int
    clipping_range: float
    levels: int
    modulus: int
    clip: float
    noise_multiplier: float
    noise_shares: int
    mode: str = GAUSSIAN
    dim: int = 0
    scale: float = 0.0
    beta: float = 0.0
    local_sigma_sq: str = ""
    norm_bound_sq: int = 0
    bits: int = 0
    wrap_target: float = 0.0

    def __post_init__(self) -> None:
        if not 2 <= self.threshold <= self.members:
            raise ValueError(f"Shamir threshold {self.threshold} outside [2, {self.members}]")
        if not 1 <= self.min_survivors <= self.members:
            raise ValueError(f"'{keys.SECURE_MIN_SURVIVORS}' {self.min_survivors} outside [1, {self.members}]")
        if not (2 <= self.modulus <= MAX_MODULUS and self.modulus & (self.modulus - 1) == 0):
            raise ValueError(f"modulus {self.modulus} is not a power of two in [2, 2**62]")
        if self.mode not in SUM_MODES:
            raise ValueError(f"the sum's mode {self.mode!r} is not one of {', '.join(SUM_MODES)}")
        if not (self.clip > 0 and self.noise_multiplier >= 0 and self.noise_shares >= 1):
            raise ValueError("the sum's mechanism is out of range")
        if self.mode == GAUSSIAN and not (self.clipping_range > 0 and self.levels >= 1):
            raise ValueError("the sum's quantisation is out of range")
        if self.mode == DDG:
            self.ddg()  # every number of the distributed discrete Gaussian present and in range

    @classmethod
    def for_ddg(cls, sum_id: str, members: int, threshold: int, min_survivors: int, noise_multiplier: float,
                noise_shares: int, params: DDGParameters, wrap_target: float) -> SumParameters:
        """A distributed-discrete-Gaussian sum's parameters (``params``: what ``ddg_parameters`` chose).

        ``params`` comes from :func:`~privacy.distributed_discrete_gaussian.ddg_parameters`.
        """
        sigma_sq = params.local_sigma_sq
        return cls(sum_id, members, threshold, min_survivors, 0.0, 0, params.modulus, float(params.clip),
                   float(noise_multiplier), int(noise_shares), DDG, params.dim, float(params.scale), float(params.beta),
                   f"{sigma_sq.numerator}/{sigma_sq.denominator}", int(params.norm_bound_sq), params.bits,
                   float(wrap_target))

    def ddg(self) -> DDGParameters:
        """The distributed discrete Gaussian these parameters describe; ValueError if one is missing or out of range."""
        if self.mode != DDG:
            raise ValueError(f"a '{self.mode}' sum has no discrete Gaussian parameters")
        try:
            sigma_sq = Fraction(self.local_sigma_sq)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"the sum's sigma^2 {self.local_sigma_sq!r} is not a fraction") from None
        if not (1 <= self.dim and 0 < self.scale < math.inf and 0.0 <= self.beta < 1.0 and sigma_sq >= Fraction(1, 4)
                and self.norm_bound_sq >= 1 and 2 <= self.bits <= DDG_MAX_BITS and self.modulus == 1 << self.bits
                and 0.0 < self.wrap_target < 1.0):
            raise ValueError("the sum's discrete Gaussian parameters are missing or out of range")
        return DDGParameters(dim=self.dim, clip=self.clip, scale=self.scale, beta=self.beta, local_sigma_sq=sigma_sq,
                             norm_bound_sq=self.norm_bound_sq, bits=self.bits, max_members=self.members)

    def ddg_mismatch(self) -> str | None:
        """Why the server's DDG numbers are not the ones its inputs give (None: they are), as a member checks.

        The member recomputes :func:`~privacy.distributed_discrete_gaussian.ddg_parameters` from C, z, m, b,
        d, n, β and the wrap target it signed; s must agree to ``1e-9`` relative, σ² and B² to that or one
        unit of their grid (platforms' libm may differ by an ulp).
        """
        given = self.ddg()
        try:
            own = ddg_parameters(clip=self.clip, dim=self.dim, bits=self.bits, noise_multiplier=self.noise_multiplier,
                                 noise_shares=self.noise_shares, max_members=self.members, beta=self.beta,
                                 wrap_probability_target=self.wrap_target)
        except ValueError as exc:
            return f"its parameters admit no discrete Gaussian sum ({exc})"
        unit = Fraction(1) if own.local_sigma_sq >= 1 else Fraction(1, 2**20)
        checks = (("scale", abs(given.scale - own.scale) <= _DDG_RTOL * own.scale),
                  ("sigma^2", abs(given.local_sigma_sq - own.local_sigma_sq)
                   <= max(unit, Fraction(_DDG_RTOL) * own.local_sigma_sq)),
                  ("B^2", abs(given.norm_bound_sq - own.norm_bound_sq) <= max(1.0, _DDG_RTOL * own.norm_bound_sq)))
        wrong = [name for name, ok in checks if not ok]
        if wrong:
            return (f"its {', '.join(wrong)} differ from what C, sigma, m, bits, d, n, beta and the wrap target give "
                    f"(sent scale={given.scale:.10g}, sigma^2={given.local_sigma_sq}, B^2={given.norm_bound_sq}; "
                    f"computed {own.scale:.10g}, {own.local_sigma_sq}, {own.norm_bound_sq})")
        return None

    def encode(self) -> dict[str, Any]:
        """The setup record's entries."""
        return {f"param/{k}": v for k, v in asdict(self).items()}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SumParameters:
        """Read the setup record; ValueError naming what is missing or malformed."""
        kinds = {"sum_id": str, "members": int, "threshold": int, "min_survivors": int, "clipping_range": float,
                 "levels": int, "modulus": int, "clip": float, "noise_multiplier": float, "noise_shares": int,
                 "mode": str, "dim": int, "scale": float, "beta": float, "local_sigma_sq": str, "norm_bound_sq": int,
                 "bits": int, "wrap_target": float}
        values = {}
        for name, kind in kinds.items():
            key = f"param/{name}"
            if key not in record:
                raise ValueError(f"the setup has no '{key}'")
            values[name] = typed(key, record[key], kind)
        return cls(**values)

    def digest(self) -> bytes:
        """SHA-256 of every parameter: what each member's signatures bind its keys to."""
        return digest(*(f"{k}={v!r}" for k, v in asdict(self).items()))


def keys_transcript(sum_digest: bytes, client_id: str, node_id: int, pk1: bytes, pk2: bytes) -> bytes:
    """What a member signs at setup: its two public keys for this sum, under its name and node."""
    return transcript("secagg-keys", sum_digest, client_id, node_id, pk1, pk2)


def rotation_seed(sum_digest: bytes, nodes: Sequence[int], names: Sequence[str], pk1s: Sequence[bytes],
                  pk2s: Sequence[bytes]) -> bytes:
    """The seed of a DDG sum's rotation: SHA-256 of the sum's digest and every keyed member's signed keys.

    Every member derives it from the key list it verified at share keys (fresh keys each member drew at
    setup), the server from the list it sent: no number the server picks alone. (The rotation is
    not privacy randomness: the accounting holds for any orthogonal rotation, the seed only has to
    be common, and independent of the data for the wrap-around bound.)
    """
    entries = sorted(zip(nodes, names, pk1s, pk2s, strict=True))
    return digest("ddg-rotation", sum_digest, *(part for entry in entries for part in entry))


def survivors_transcript(sum_digest: bytes, survivors: Sequence[int]) -> bytes:
    """What a member signs in the consistency round: the survivor set it saw, sorted."""
    return transcript("secagg-survivors", sum_digest, *sorted(int(s) for s in survivors))


def consistency_threshold(threshold: int, members: int) -> int:
    """Signatures over one survivor set a member needs before it unmasks: a strict majority and t.

    Every honest member signs one set only, so two different sets can never both gather a majority
    (Bonawitz et al. 2017, the malicious-server variant).
    """
    return max(threshold, members // 2 + 1)


def wire_bits(modulus: int) -> int:
    """The bits, log₂ M, one coordinate of a masked input takes on the wire (M a power of two in [2, 2^62])."""
    if not (2 <= modulus <= MAX_MODULUS and modulus & (modulus - 1) == 0):
        raise ValueError(f"modulus {modulus} is not a power of two in [2, 2**62]")
    return modulus.bit_length() - 1


def pack_masked(arrays: Sequence[npt.ArrayLike], modulus: int) -> bytes:
    """A member's masked input as it travels (module docstring): every coordinate, in order, in log₂ M bits.

    Raises
    ------
    ValueError
        If a coordinate is not an integer in [0, M).
    """
    flat = [np.asarray(a).ravel() for a in arrays]
    values = np.concatenate(flat) if flat else np.zeros(0, np.int64)
    return pack(values, wire_bits(modulus))


def unpack_masked(payload: object, shapes: Sequence[tuple[int, ...]], modulus: int) -> list[npt.NDArray[np.int64]]:
    """The masked arrays of ``shapes`` (int64, in [0, M)) from a member's payload, as the server reads it.

    Raises
    ------
    PackError
        If the payload is not one byte string of exactly ⌈D·log₂ M/8⌉ bytes (D the coordinates of
        ``shapes``), or a padding bit after the last coordinate is set; the message says which.
    """
    width = wire_bits(modulus)
    sizes = [math.prod(shape) for shape in shapes]
    if not isinstance(payload, bytes):
        raise PackError(f"expected one byte string of {packed_size(sum(sizes), width)} bytes "
                        f"({sum(sizes)} coordinates of {width} bits); found {type(payload).__name__}")
    flat = unpack(payload, sum(sizes), width).astype(np.int64)
    out, start = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        out.append(flat[start:start + size].reshape(shape))
        start += size
    return out
