"""The server side of secure sums: Flower's SecAgg+ stages driven from a Message-API strategy.

A round with secure aggregation runs, for each *sum* (a subset of the round's clients; the
subsets are disjoint, several per round, e.g. one per GDPFed budget group):

    stage 0  setup           every member gets the sum's parameters, answers two public keys
    stage 1  share keys      every member gets the others' public keys, answers encrypted
                             Shamir shares of its self-mask seed and secret key
    stage 2  collect         the train message, with the shares addressed to the member;
                             the member trains, then answers its masked, quantised update
    stage 3  unmask          every surviving member gets the survivors and the dropouts,
                             answers the shares that remove the masks; the server combines
                             them (t of them per secret) and learns Σ over survivors only

Stages 0–1 run in ``configure_train`` (:func:`open_sums`), stage 2 is the round's train
message (:func:`collect_messages`), stage 3 runs in ``aggregate_train``
(:func:`release_sums`). The client side is :mod:`client.secure_sum`; the arithmetic both
share (quantisation, modulus, masks) is :mod:`privacy.secure_sum`. Every member is a
neighbour of every other (the complete graph: SecAgg with Shamir threshold t): a coalition
of the server and fewer than t members learns nothing about one member's input beyond the
sum. The server never holds an individual unmasked update: it only ever adds masked
vectors mod M before it removes the masks of the sum.

A sum with fewer than ``max(t, r_min)`` members left after any stage is abandoned (logged,
not released); honest clients enforce r_min themselves (they train only when at least
r_min members shared keys, and unmask only when at least r_min inputs reached the sum).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.common.secure_aggregation.quantization import dequantize
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.serverapp import Grid
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from privacy.secure_sum import MAX_BITS, Quantisation, add_mod, mask, wire_dtype
from protocol import keys
from protocol.config import kebab

log = logging.getLogger("privet.strategy")


#: Values of the run config's ``secure-aggregation``.
SECURE_AGGREGATION = ("none", "secagg+")


class SecureAggregation(BaseModel):
    """The ``[tool.flwr.app.config.secagg]`` section (keys ``secagg.*``): how secure sums run.

    Attributes
    ----------
    threshold : float
        t as a fraction of a sum's members (Shamir threshold; at least 2): the server and
        fewer than t members together learn nothing about one member's input.
    min_survivors : int
        r_min: the fewest inputs a released sum may hold; 0 means ``noise-shares`` (m).
        Each member charges σ·√(r_min/m).
    bits : int
        Quantisation bits b (L = 2^b − 1 levels per coordinate), 8 to 30.
    clip_probability : float
        Bound on the probability that the quantiser clips any coordinate (eq. 1 of
        :mod:`privacy.secure_sum`).
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    threshold: float = Field(0.5, gt=0.0, le=1.0)
    min_survivors: int = Field(0, ge=0)
    bits: int = Field(24, ge=8, le=MAX_BITS)
    clip_probability: float = Field(1e-9, gt=0.0, lt=1.0)

    def shamir_threshold(self, members: int) -> int:
        """T for a sum of ``members`` clients: ⌈fraction·members⌉, at least 2, at most members."""
        return min(members, max(2, math.ceil(self.threshold * members)))


@dataclass
class SumState:
    """One secure sum in flight."""

    index: int
    members: list[int]
    threshold: int
    min_survivors: int
    quantisation: Quantisation
    public_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    shared: list[int] = field(default_factory=list)  # members whose shares went out (stage 1)
    forward: dict[int, tuple[list[int], list[bytes]]] = field(default_factory=dict)
    abandoned: str = ""

    @property
    def floor(self) -> int:
        """The fewest members the sum can go on with."""
        return max(self.threshold, self.min_survivors)


@dataclass(frozen=True)
class SumResult:
    """What a secure sum released: Σ_i ỹ_i over ``survivors`` (None: not released, ``reason``)."""

    index: int
    members: list[int]
    survivors: list[int]
    total: list[np.ndarray] | None
    reason: str = ""


def _message(node: int, record: ConfigRecord, ttl: float | None, content: RecordDict | None = None) -> Message:
    content = content if content is not None else RecordDict()
    content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(dict(record))  # one record per message
    return Message(content, dst_node_id=node, message_type=MessageType.TRAIN, ttl=ttl)


def _answers(grid: Grid, messages: list[Message], timeout: float) -> dict[int, Message]:
    """Send, wait, and map each successful reply to its node (errors are logged)."""
    asked = {m.metadata.dst_node_id for m in messages}
    out: dict[int, Message] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        if node not in asked:
            continue
        if reply.has_error():
            log.warning("secure sum: node %d: %s", node, reply.error.reason)
            continue
        out[node] = reply
    return out


def open_sums(grid: Grid, groups: Sequence[Sequence[int]], quantisations: Sequence[Quantisation],
              min_survivors: Sequence[int], cfg: SecureAggregation, timeout: float,
              ttl: float | None) -> list[SumState]:
    """Stages 0 and 1 for every sum at once; returns the sums, some possibly abandoned.

    Sum i has the members ``groups[i]``, the quantisation ``quantisations[i]`` and the floor
    r_min = ``min_survivors[i]``.
    """
    sums = [SumState(i, sorted(g), cfg.shamir_threshold(len(g)), r, q)
            for i, (g, q, r) in enumerate(zip(groups, quantisations, min_survivors, strict=True))]
    setup = []
    for s in sums:
        if len(s.members) < s.floor:
            s.abandoned = f"{len(s.members)} members, fewer than max(threshold, min-survivors) = {s.floor}"
            continue
        record = ConfigRecord({
            Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: len(s.members), Key.SHARE_NUMBER: len(s.members),
            Key.THRESHOLD: s.threshold, Key.CLIPPING_RANGE: float(s.quantisation.clipping_range),
            Key.TARGET_RANGE: s.quantisation.levels, Key.MOD_RANGE: s.quantisation.modulus, Key.MAX_WEIGHT: 1.0,
            keys.SECURE_MIN_SURVIVORS: s.min_survivors,
        })
        setup += [_message(n, record, ttl) for n in s.members]
    keys_of = _answers(grid, setup, timeout)
    share = []
    for s in sums:
        if s.abandoned:
            continue
        for n in s.members:
            if n in keys_of:
                rec = keys_of[n].content.config_records.get(RECORD_KEY_CONFIGS, ConfigRecord())
                pk1, pk2 = rec.get(Key.PUBLIC_KEY_1), rec.get(Key.PUBLIC_KEY_2)
                if isinstance(pk1, bytes) and isinstance(pk2, bytes):
                    s.public_keys[n] = (pk1, pk2)
        if _too_few(s, s.public_keys, "answered the setup"):
            continue
        for n in s.public_keys:
            record = ConfigRecord({str(m): list(k) for m, k in s.public_keys.items()})
            record[Key.STAGE] = Stage.SHARE_KEYS
            share.append(_message(n, record, ttl))
    shares_of = _answers(grid, share, timeout)
    for s in sums:
        if s.abandoned:
            continue
        s.shared = sorted(n for n in s.public_keys if n in shares_of)
        if _too_few(s, s.shared, "shared their keys"):
            continue
        s.forward = {n: ([], []) for n in s.shared}
        for src in s.shared:
            rec = shares_of[src].content.config_records.get(RECORD_KEY_CONFIGS, ConfigRecord())
            dsts = cast(list[int], rec.get(Key.DESTINATION_LIST, []))
            texts = cast(list[bytes], rec.get(Key.CIPHERTEXT_LIST, []))
            for dst, text in zip(dsts, texts, strict=False):
                if dst in s.forward and dst != src:
                    s.forward[dst][0].append(src)
                    s.forward[dst][1].append(text)
    return sums


def _too_few(s: SumState, nodes: Iterable[int], what: str) -> bool:
    count = len(list(nodes))
    if count < s.floor:
        s.abandoned = f"only {count} of {len(s.members)} members {what}, fewer than max(threshold, min-survivors) " \
                      f"= {s.floor}; not released, nothing of it trained or charged"
        log.warning("secure sum %d abandoned: %s", s.index, s.abandoned)
        return True
    return False


def collect_messages(sums: Sequence[SumState], train: dict[int, Message]) -> list[Message]:
    """Stage 2: each member's train message, carrying the shares addressed to it."""
    out = []
    for s in sums:
        if s.abandoned:
            continue
        for node in s.shared:
            srcs, texts = s.forward[node]
            msg = train[node]
            msg.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({
                Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.CIPHERTEXT_LIST: texts, Key.SOURCE_LIST: srcs})
            out.append(msg)
    return out


def masked_input(reply: Message, shapes: Sequence[tuple[int, ...]], modulus: int) -> list[np.ndarray] | str:
    """A member's masked vector from its stage-2 reply, or why it is unusable."""
    rec = reply.content.config_records.get(RECORD_KEY_CONFIGS)
    raw = rec.get(Key.MASKED_PARAMETERS) if rec is not None else None
    if not isinstance(raw, list) or len(raw) != len(shapes) or not all(isinstance(b, bytes) for b in raw):
        return f"expected {len(shapes)} masked arrays in '{RECORD_KEY_CONFIGS}'"
    try:
        arrays = [bytes_to_ndarray(cast(bytes, b)) for b in raw]
    except (ValueError, TypeError, OSError) as exc:
        return f"masked arrays cannot be read ({exc})"
    wire = wire_dtype(modulus)
    for a, shape in zip(arrays, shapes, strict=True):
        if a.shape != tuple(shape) or a.dtype != wire or (a.size and int(a.max()) >= modulus):
            return f"a masked array is not {wire} of shape {tuple(shape)} in [0, {modulus})"
    return [a.astype(np.int64) for a in arrays]


def release_sums(grid: Grid, sums: Sequence[SumState], inputs: dict[int, list[np.ndarray]],
                 shapes: Sequence[tuple[int, ...]], timeout: float, ttl: float | None) -> list[SumResult]:
    """Stage 3 for every open sum: unmask Σ over the members whose masked input is in ``inputs``."""
    results: dict[int, SumResult] = {}
    unmask, masked = [], {}
    for s in sums:
        alive = [n for n in s.shared if n in inputs]
        if s.abandoned or len(alive) < s.floor:
            reason = s.abandoned or (f"only {len(alive)} inputs reached the sum, fewer than max(threshold, "
                                     f"min-survivors) = {s.floor}; not released")
            results[s.index] = SumResult(s.index, s.members, alive, None, reason)
            continue
        total = [np.zeros(shape, np.int64) for shape in shapes]
        for n in alive:
            total = add_mod(total, inputs[n], s.quantisation.modulus)
        masked[s.index] = (total, alive)
        dead = [n for n in s.shared if n not in inputs]
        record = ConfigRecord({Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: alive,
                               Key.DEAD_NODE_ID_LIST: dead})
        unmask += [_message(n, record, ttl) for n in alive]
    answers = _answers(grid, unmask, timeout)
    for s in sums:
        if s.index in results:
            continue
        total, alive = masked[s.index]
        results[s.index] = _unmask(s, total, alive, answers, shapes)
    return [results[s.index] for s in sums]


def _unmask(s: SumState, total: list[np.ndarray], alive: list[int], answers: dict[int, Message],
            shapes: Sequence[tuple[int, ...]]) -> SumResult:
    """Remove the self masks of the survivors and the pairwise masks of the dropouts."""
    shares: dict[int, list[bytes]] = {n: [] for n in s.shared}
    for node in alive:
        if node not in answers:
            continue
        rec = answers[node].content.config_records.get(RECORD_KEY_CONFIGS, ConfigRecord())
        owners = cast(list[int], rec.get(Key.NODE_ID_LIST, []))
        values = cast(list[bytes], rec.get(Key.SHARE_LIST, []))
        for owner, share in zip(owners, values, strict=False):
            if owner in shares and isinstance(share, bytes):
                shares[owner].append(share)
    modulus = s.quantisation.modulus
    try:
        for owner, owner_shares in shares.items():
            if len(owner_shares) < s.threshold:
                raise ValueError(f"{len(owner_shares)} shares for node {owner}, fewer than the threshold {s.threshold}")
            secret = combine_shares(owner_shares[: s.threshold])
            if owner in alive:  # its self mask
                total = add_mod(total, mask(secret, modulus, shapes), modulus, -1)
                continue
            for other in alive:  # a dropout: the pairwise masks the survivors added with it
                pairwise = mask(generate_shared_key(bytes_to_private_key(secret),
                                                    bytes_to_public_key(s.public_keys[other][0])), modulus, shapes)
                total = add_mod(total, pairwise, modulus, 1 if owner > other else -1)
    except (ValueError, TypeError, KeyError) as exc:
        reason = f"cannot remove the masks ({exc}); not released"
        log.warning("secure sum %d: %s", s.index, reason)
        return SumResult(s.index, s.members, alive, None, reason)
    q = s.quantisation
    real = dequantize(total, q.clipping_range, q.levels)  # Σ_i (q_i·step − c) + (k−1)·c was shifted once
    offset = (len(alive) - 1) * q.clipping_range
    return SumResult(s.index, s.members, alive, [np.asarray(r - offset, np.float64) for r in real])


def check_sum(result: SumResult, clip: float, noise_std: float, step: float) -> str | None:
    """The checks a released sum can take: finite, and ‖Σ‖ ≤ r·C + a noise and rounding bound.

    Σ of r members is (signal of norm ≤ r·C) + N(0, r·s²·I_d) + rounding (|e| ≤ r·step per
    coordinate). The noise norm exceeds s·√r·(√d + 10) with probability below e^{−50}
    (Laurent–Massart), so a larger norm means a member sent more than a clipped update.
    """
    if result.total is None:
        return result.reason
    if not all(np.isfinite(a).all() for a in result.total):
        return "the unmasked sum is not finite"
    r = len(result.survivors)
    d = sum(a.size for a in result.total)
    bound = r * clip + noise_std * math.sqrt(r) * (math.sqrt(d) + 10.0) + r * step * math.sqrt(d)
    norm = math.sqrt(sum(float(np.sum(np.square(a))) for a in result.total))
    if norm > bound:
        return (f"the unmasked sum of {r} inputs has norm {norm:.4g}, above r·C + noise bound {bound:.4g}: "
                "a member sent an unclipped update (secure aggregation cannot stop a malicious client)")
    return None
