"""The records of privet's secure-sum stages, and what their signatures cover, for both sides.

The server (:mod:`strategies.secure_sum`) and each member (:mod:`client.secure_sum`) read the
same :class:`SumParameters` and sign or verify the same transcripts (:mod:`protocol.roster`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from protocol import keys
from protocol.config import typed
from protocol.roster import digest, transcript

__all__ = ["SumParameters", "consistency_threshold", "keys_transcript", "survivors_transcript"]

#: The largest modulus whose sums int64 arithmetic holds exactly.
MAX_MODULUS = 2**62


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

    def __post_init__(self) -> None:
        if not 2 <= self.threshold <= self.members:
            raise ValueError(f"Shamir threshold {self.threshold} outside [2, {self.members}]")
        if not 1 <= self.min_survivors <= self.members:
            raise ValueError(f"'{keys.SECURE_MIN_SURVIVORS}' {self.min_survivors} outside [1, {self.members}]")
        if not (2 <= self.modulus <= MAX_MODULUS and self.modulus & (self.modulus - 1) == 0):
            raise ValueError(f"modulus {self.modulus} is not a power of two in [2, 2**62]")
        if not (self.clipping_range > 0 and self.levels >= 1 and self.clip > 0 and self.noise_multiplier >= 0
                and self.noise_shares >= 1):
            raise ValueError("the sum's quantisation or mechanism is out of range")

    def encode(self) -> dict[str, Any]:
        """The setup record's entries."""
        return {f"param/{k}": v for k, v in asdict(self).items()}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SumParameters:
        """Read the setup record; ValueError naming what is missing or malformed."""
        kinds = {"sum_id": str, "members": int, "threshold": int, "min_survivors": int, "clipping_range": float,
                 "levels": int, "modulus": int, "clip": float, "noise_multiplier": float, "noise_shares": int}
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


def survivors_transcript(sum_digest: bytes, survivors: Sequence[int]) -> bytes:
    """What a member signs in the consistency round: the survivor set it saw, sorted."""
    return transcript("secagg-survivors", sum_digest, *sorted(int(s) for s in survivors))


def consistency_threshold(threshold: int, members: int) -> int:
    """Signatures over one survivor set a member needs before it unmasks: a strict majority and t.

    Every honest member signs one set only, so two different sets can never both gather a majority
    (Bonawitz et al. 2017, the malicious-server variant).
    """
    return max(threshold, members // 2 + 1)
