"""The server side of secure sums: privet's SecAgg stages driven from a Message-API strategy.

A round with secure aggregation runs, for each *sum* (a subset of the round's clients; the
subsets are disjoint, several per round, e.g. one per GDPFed budget group):

    setup        every member gets the sum's parameters (:class:`protocol.secure_sum.SumParameters`),
                 answers two public keys, signed with its roster key over the parameters' digest
    share keys   every member gets the others' keys (each signature verified here against the
                 roster first: a member whose keys do not verify is left out, logged), answers
                 encrypted Shamir shares of its self-mask seed and pairwise secret key
    collect      the train message, with the shares addressed to the member; it trains, then
                 answers its masked input: its quantised noisy update (``secagg+``), or its
                 rotated, rounded update plus a discrete Gaussian share (``secagg+ddg``), packed
                 in log₂ M bits per coordinate (:func:`protocol.secure_sum.unpack_masked` reads
                 it; a payload of the wrong length or with padding bits set leaves the member out)
    consistency  (with a roster) every survivor gets the survivor set U3 and answers its signature
    unmask       every survivor gets the consistency signatures and answers its shares: the seed
                 share of each survivor, the key share of each member that dropped after sharing
                 keys; the server combines t of each and learns Σ over the survivors only

Setup and share keys run in ``configure_train`` (:func:`open_sums`), collect is the round's
train message (:func:`collect_messages`), consistency and unmask run in ``aggregate_train``
(:func:`release_sums`). The client side is :mod:`client.secure_sum`, which checks every list it
is sent (:mod:`client.secure_sum` says what and why); the arithmetic both share (quantisation,
modulus, masks) is :mod:`privacy.secure_sum`, and the distributed discrete Gaussian's (encoding,
rotation, decoding) :mod:`privacy.distributed_discrete_gaussian`. A ``secagg+ddg`` sum's input is one
vector of d' = 2^⌈log₂ d⌉ integers mod 2^b; its rotation seed is a hash of the sum's digest and
every keyed member's signed keys (:func:`protocol.secure_sum.rotation_seed`), which the server and
each member compute from the same list. Every member is a neighbour of every other (the
complete graph, Shamir threshold t): a coalition of the server and fewer than t members learns
nothing about one member's input beyond the sum. The server never holds an individual unmasked
update: it only adds masked vectors mod M before it removes the masks of the sum.

A sum with fewer than ``max(t, r_min)`` members left after any stage is abandoned (logged, not
released); honest members enforce r_min themselves.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.common.secure_aggregation.quantization import dequantize
from flwr.serverapp import Grid
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from privacy.distributed_discrete_gaussian import DDGParameters, decode
from privacy.secure_sum import Quantisation, add_mod, mask
from protocol import keys
from protocol.roster import Roster
from protocol.secure_sum import DDG, PackError, SumParameters, keys_transcript, rotation_seed, unpack_masked
from strategies.secagg_config import SECURE_AGGREGATION, SecureAggregation

__all__ = ["SECURE_AGGREGATION", "SecureAggregation", "SumMember", "SumResult", "SumState", "check_ddg_sum",
           "check_sum", "collect_messages", "masked_input", "open_sums", "release_sums"]

log = logging.getLogger("privet.strategy")


@dataclass(frozen=True)
class SumMember:
    """What one member answered at setup."""

    client_id: str
    pk1: bytes
    pk2: bytes
    signature: bytes


@dataclass
class SumState:
    """One secure sum in flight."""

    index: int
    members: list[int]
    params: SumParameters
    clip_probability: float = 0.0  # the quantiser's (``secagg+``)
    rotation_seed: bytes = b""  # ``secagg+ddg``: derived from the keys sent at share keys
    keyed: dict[int, SumMember] = field(default_factory=dict)  # answered setup (and verified)
    shared: list[int] = field(default_factory=list)  # members whose shares went out (share keys)
    forward: dict[int, tuple[list[int], list[bytes]]] = field(default_factory=dict)
    abandoned: str = ""
    left_out: dict[int, str] = field(default_factory=dict)  # member -> why it was left out

    @property
    def threshold(self) -> int:
        """t, the Shamir threshold."""
        return self.params.threshold

    @property
    def modulus(self) -> int:
        """M: inputs, masks and the sum live mod M."""
        return self.params.modulus

    @property
    def ddg(self) -> DDGParameters | None:
        """The distributed discrete Gaussian of a ``secagg+ddg`` sum (None: a quantised Gaussian one)."""
        return self.params.ddg() if self.params.mode == DDG else None

    @property
    def quantisation(self) -> Quantisation:
        """The quantisation of a ``secagg+`` sum."""
        p = self.params
        return Quantisation(p.clipping_range, p.levels, p.modulus, self.clip_probability)

    def input_shapes(self, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The shapes of one member's masked input for a model of ``shapes``: the model's, or one vector of d'."""
        ddg = self.ddg
        return [tuple(s) for s in shapes] if ddg is None else [(ddg.padded_dim,)]

    @property
    def floor(self) -> int:
        """The fewest members the sum can go on with."""
        return max(self.params.threshold, self.params.min_survivors)


@dataclass(frozen=True)
class SumResult:
    """What a secure sum released: Σ_i ỹ_i over ``survivors`` (None: not released, ``reason``)."""

    index: int
    members: list[int]
    survivors: list[int]
    total: list[np.ndarray] | None
    reason: str = ""


def _message(node: int, record: dict[str, Any], ttl: float | None, content: RecordDict | None = None) -> Message:
    content = content if content is not None else RecordDict()
    content.config_records[keys.SECAGG_RECORD] = ConfigRecord(dict(record))  # one record per message
    return Message(content, dst_node_id=node, message_type=MessageType.TRAIN, ttl=ttl)


def _answers(grid: Grid, messages: list[Message], timeout: float) -> dict[int, ConfigRecord]:
    """Send, wait, and map each successful reply's record to its node (errors are logged)."""
    asked = {m.metadata.dst_node_id for m in messages}
    out: dict[int, ConfigRecord] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = reply.metadata.src_node_id
        if node not in asked:
            continue
        if reply.has_error():
            log.warning("secure sum: node %d: %s", node, reply.error.reason)
            continue
        record = reply.content.config_records.get(keys.SECAGG_RECORD)
        if record is not None:
            out[node] = record
    return out


def open_sums(grid: Grid, groups: Sequence[Sequence[int]], parameters: Sequence[SumParameters],
              cfg: SecureAggregation, *, roster: Roster | None, timeout: float, ttl: float | None,
              abandoned: Sequence[str] = ()) -> list[SumState]:
    """Setup and share keys for every sum at once; returns the sums, some possibly abandoned.

    Sum i has the members ``groups[i]`` and the parameters ``parameters[i]`` (its id makes its
    signatures its own); ``abandoned[i]``, where given and not empty, is why sum i cannot run at all.
    """
    sums = []
    for i, (group, params) in enumerate(zip(groups, parameters, strict=True)):
        members = sorted(group)
        state = SumState(i, members, params, cfg.clip_probability)
        if i < len(abandoned) and abandoned[i]:
            state.abandoned = abandoned[i]
            log.warning("secure sum %d abandoned: %s", i, state.abandoned)
        elif len(members) < state.floor:
            state.abandoned = (f"{len(members)} members, fewer than max(threshold, min-survivors) = "
                               f"{state.floor}")
        sums.append(state)
    setup = []
    for s in sums:
        if s.abandoned:
            continue
        setup += [_message(n, {keys.SECAGG_STAGE: keys.STAGE_SETUP, **s.params.encode()}, ttl) for n in s.members]
    answers = _answers(grid, setup, timeout)
    share = []
    for s in sums:
        if s.abandoned:
            continue
        digest = s.params.digest()
        for n in s.members:
            member = _member(answers.get(n))
            if member is None:
                continue
            if roster is not None:
                why = roster.verify(member.client_id, member.signature,
                                    keys_transcript(digest, member.client_id, n, member.pk1, member.pk2))
                if why:
                    s.left_out[n] = f"its keys do not verify: {why}"
                    log.warning("secure sum %d: member %s (node %d) left out: %s", s.index, member.client_id, n, why)
                    continue
            s.keyed[n] = member
        if _too_few(s, s.keyed, "answered the setup with keys that verify"):
            continue
        nodes = sorted(s.keyed)
        names, pk1s, pk2s = ([s.keyed[n].client_id for n in nodes], [s.keyed[n].pk1 for n in nodes],
                             [s.keyed[n].pk2 for n in nodes])
        record = {keys.SECAGG_STAGE: keys.STAGE_SHARE_KEYS, keys.SECAGG_SUM_ID: s.params.sum_id,
                  keys.SECAGG_NODES: nodes, keys.SECAGG_NAMES: names, keys.SECAGG_PK1S: pk1s,
                  keys.SECAGG_PK2S: pk2s, keys.SECAGG_SIGNATURES: [s.keyed[n].signature for n in nodes]}
        if s.params.mode == DDG:  # what every member derives from the same list
            s.rotation_seed = rotation_seed(digest, nodes, names, pk1s, pk2s)
        share += [_message(n, record, ttl) for n in nodes]
    shares_of = _answers(grid, share, timeout)
    for s in sums:
        if s.abandoned:
            continue
        s.shared = sorted(n for n in s.keyed if n in shares_of)
        if _too_few(s, s.shared, "shared their keys"):
            continue
        s.forward = {n: ([], []) for n in s.shared}
        for src in s.shared:
            rec = shares_of[src]
            dsts = cast(list[int], rec.get(keys.SECAGG_DESTINATIONS, []))
            texts = cast(list[bytes], rec.get(keys.SECAGG_CIPHERTEXTS, []))
            for dst, text in zip(dsts, texts, strict=False):
                if dst in s.forward and dst != src and isinstance(text, bytes):
                    s.forward[dst][0].append(src)
                    s.forward[dst][1].append(text)
    return sums


def _member(record: ConfigRecord | None) -> SumMember | None:
    """A member's setup answer, or None if it is malformed."""
    if record is None:
        return None
    pk1, pk2 = record.get(keys.SECAGG_PK1), record.get(keys.SECAGG_PK2)
    name, signature = record.get(keys.CLIENT_ID), record.get(keys.SIGNATURE, b"")
    if not (isinstance(pk1, bytes) and isinstance(pk2, bytes) and isinstance(name, str)
            and isinstance(signature, bytes)):
        return None
    return SumMember(name, pk1, pk2, signature)


def _too_few(s: SumState, nodes: Iterable[int], what: str) -> bool:
    count = len(list(nodes))
    if count < s.floor:
        s.abandoned = (f"only {count} of {len(s.members)} members {what}, fewer than max(threshold, min-survivors) "
                       f"= {s.floor}; not released, nothing of it trained or charged")
        log.warning("secure sum %d abandoned: %s", s.index, s.abandoned)
        return True
    return False


def collect_messages(sums: Sequence[SumState], train: dict[int, Message]) -> list[Message]:
    """The collect stage: each member's train message, carrying the shares addressed to it."""
    out = []
    for s in sums:
        if s.abandoned:
            continue
        for node in s.shared:
            srcs, texts = s.forward[node]
            msg = train[node]
            msg.content.config_records[keys.SECAGG_RECORD] = ConfigRecord({
                keys.SECAGG_STAGE: keys.STAGE_COLLECT, keys.SECAGG_SUM_ID: s.params.sum_id,
                keys.SECAGG_CIPHERTEXTS: texts, keys.SECAGG_SOURCES: srcs})
            out.append(msg)
    return out


def masked_input(reply: Message, shapes: Sequence[tuple[int, ...]], modulus: int) -> list[np.ndarray] | str:
    """A member's masked vector from its collect reply (int64 arrays of ``shapes`` in [0, M)), or why it is unusable.

    The payload is one byte string, the coordinates packed in log₂ M bits
    (:func:`protocol.secure_sum.unpack_masked`): one of any other length, or with a padding bit set, is refused.
    """
    rec = reply.content.config_records.get(keys.SECAGG_RECORD)
    raw = rec.get(keys.SECAGG_MASKED) if rec is not None else None
    try:
        return unpack_masked(raw, shapes, modulus)
    except PackError as exc:
        return f"its masked input '{keys.SECAGG_RECORD}.{keys.SECAGG_MASKED}' is malformed: {exc}"


def release_sums(grid: Grid, sums: Sequence[SumState], inputs: dict[int, list[np.ndarray]],
                 shapes: Sequence[tuple[int, ...]], *, roster: Roster | None, timeout: float,
                 ttl: float | None) -> list[SumResult]:
    """Consistency (with a roster) and unmask for every open sum: Σ over the members whose input is in ``inputs``."""
    results: dict[int, SumResult] = {}
    masked: dict[int, tuple[list[np.ndarray], list[int]]] = {}
    for s in sums:
        alive = [n for n in s.shared if n in inputs]
        if s.abandoned or len(alive) < s.floor:
            reason = s.abandoned or (f"only {len(alive)} inputs reached the sum, fewer than max(threshold, "
                                     f"min-survivors) = {s.floor}; not released")
            results[s.index] = SumResult(s.index, s.members, alive, None, reason)
            continue
        total = [np.zeros(shape, np.int64) for shape in s.input_shapes(shapes)]
        for n in alive:
            total = add_mod(total, inputs[n], s.modulus)
        masked[s.index] = (total, alive)
    signatures: dict[int, dict[int, bytes]] = {i: {} for i in masked}
    if roster is not None:
        asks = [_message(n, {keys.SECAGG_STAGE: keys.STAGE_CONSISTENCY, keys.SECAGG_SUM_ID: sums[i].params.sum_id,
                             keys.SECAGG_SURVIVORS: alive}, ttl)
                for i, (_, alive) in masked.items() for n in alive]
        for node, rec in _answers(grid, asks, timeout).items():
            sig = rec.get(keys.SIGNATURE)
            i = next(i for i, (_, alive) in masked.items() if node in alive)
            if isinstance(sig, bytes):
                signatures[i][node] = sig
    unmask = []
    for i, (_, alive) in masked.items():
        signers = sorted(signatures[i])
        record = {keys.SECAGG_STAGE: keys.STAGE_UNMASK, keys.SECAGG_SUM_ID: sums[i].params.sum_id,
                  keys.SECAGG_SURVIVORS: alive, keys.SECAGG_SIGNERS: signers,
                  keys.SECAGG_SIGNATURES: [signatures[i][n] for n in signers]}
        unmask += [_message(n, record, ttl) for n in alive]
    answers = _answers(grid, unmask, timeout)
    for s in sums:
        if s.index in results:
            continue
        total, alive = masked[s.index]
        results[s.index] = _unmask(s, total, alive, answers, shapes)
    return [results[s.index] for s in sums]


def _unmask(s: SumState, total: list[np.ndarray], alive: list[int], answers: dict[int, ConfigRecord],
            shapes: Sequence[tuple[int, ...]]) -> SumResult:
    """Remove the self masks of the survivors and the pairwise masks of the dropouts, then decode the sum."""
    shares: dict[int, list[bytes]] = {n: [] for n in s.shared}
    for node in alive:
        rec = answers.get(node)
        if rec is None:
            continue
        owners = cast(list[int], rec.get(keys.SECAGG_OWNERS, []))
        values = cast(list[bytes], rec.get(keys.SECAGG_SHARES, []))
        for owner, share in zip(owners, values, strict=False):
            if owner in shares and isinstance(share, bytes):
                shares[owner].append(share)
    modulus = s.modulus
    input_shapes = s.input_shapes(shapes)
    try:
        for owner, owner_shares in shares.items():
            if len(owner_shares) < s.threshold:
                raise ValueError(f"{len(owner_shares)} shares for node {owner}, fewer than the threshold {s.threshold}")
            secret = combine_shares(owner_shares[: s.threshold])
            if owner in alive:  # its self mask
                total = add_mod(total, mask(secret, modulus, input_shapes), modulus, -1)
                continue
            for other in alive:  # a dropout: the pairwise masks the survivors added with it
                pairwise = mask(generate_shared_key(bytes_to_private_key(secret),
                                                    bytes_to_public_key(s.keyed[other].pk1)), modulus, input_shapes)
                total = add_mod(total, pairwise, modulus, 1 if owner > other else -1)
    except (ValueError, TypeError, KeyError) as exc:
        reason = f"cannot remove the masks ({exc}); not released"
        log.warning("secure sum %d: %s", s.index, reason)
        return SumResult(s.index, s.members, alive, None, reason)
    ddg = s.ddg
    if ddg is not None:  # lift to [−M/2, M/2), rotate back, divide by s; the model's shapes
        flat = decode(total[0], ddg, s.rotation_seed)
        sizes = np.cumsum([int(np.prod(shape, dtype=np.int64)) for shape in shapes])[:-1]
        return SumResult(s.index, s.members, alive,
                         [part.reshape(shape) for part, shape in zip(np.split(flat, sizes), shapes, strict=True)])
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


def check_ddg_sum(result: SumResult, params: DDGParameters) -> str | None:
    """:func:`check_sum` for a ``secagg+ddg`` sum: ‖Σ‖ ≤ (r·B + σ√r·(√d' + 10))/s.

    In integer units the lifted sum of r members is Σ x̃_i (each ‖x̃_i‖ ≤ B, enforced by honest
    members) plus r·d' independent N_Z(0, σ²), each σ²-subgaussian (Canonne, Kamath & Steinke
    2020): ‖noise‖ > σ√r·(√d' + 10) with probability below e^{−50} (Hsu, Kakade & Zhang 2012).
    The decoded sum is that vector rotated back (orthogonal), truncated to d coordinates and
    divided by s, so its norm is at most the lifted one's over s. An honest sum that wrapped
    around (probability below the stated bound) may fail the check too: it is then not used.
    """
    if result.total is None:
        return result.reason
    if not all(np.isfinite(a).all() for a in result.total):
        return "the unmasked sum is not finite"
    r = len(result.survivors)
    sigma = math.sqrt(float(params.local_sigma_sq))
    bound = (r * math.sqrt(params.norm_bound_sq) + sigma * math.sqrt(r) * (math.sqrt(params.padded_dim) + 10.0)) \
        / params.scale
    norm = math.sqrt(sum(float(np.sum(np.square(a))) for a in result.total))
    if norm > bound:
        return (f"the unmasked sum of {r} inputs has norm {norm:.4g}, above (r·B + noise bound)/s = {bound:.4g}: "
                "a member sent more than a clipped, rounded update, or the sum wrapped around mod 2^b "
                "(secure aggregation cannot stop a malicious client)")
    return None
