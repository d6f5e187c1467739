"""The client side of a secure sum: privet's own SecAgg stages, hardened against a server that deviates.

``secure_sum_mod`` is a ClientApp mod. A train message without privet's secure-sum record
(``keys.SECAGG_RECORD``) passes straight through to the train handler. One with it runs the stage
it names, each a check-then-act step of Bonawitz et al.'s protocol (CCS 2017) in its
malicious-server variant, built from Flower's public primitives (X25519-style key agreement and
Fernet authenticated encryption of :mod:`flwr.common.secure_aggregation.crypto`, Shamir sharing)
and Ed25519 signatures against the operator's roster (:mod:`protocol.roster`):

``setup``
    The sum's parameters (members, Shamir threshold t, r_min, the mode, its quantisation or its
    distributed discrete Gaussian, and the mechanism each member runs: C, σ, m). A ``secagg+ddg``
    member recomputes the discrete Gaussian's scale, σ² and B² from C, σ, m, b, d, n, β and the
    wrap target, and refuses numbers that differ. The member takes r_min = max(the server's, its
    site's ``min-sum-size``), answers two fresh public keys and, with a roster, its signature over
    them *and the parameters' digest*: a member shown other parameters computes another digest and
    its signature check fails, so all members run one mechanism.
``share-keys``
    Every member's keys. The member checks them: its own entry unchanged, no node, name or key
    twice, at least max(t, r_min) of them, and with a roster each one signed by its client id's
    roster key over this sum's digest (a server that substitutes keys is caught here). Then it
    Shamir-shares its self-mask seed and its pairwise secret key (threshold t) and encrypts one
    share pair to each member. A ``secagg+ddg`` member derives the rotation's seed from the list it
    verified (:func:`protocol.secure_sum.rotation_seed`).
``collect``
    The train message, with the shares addressed to it: each decrypted and checked (source,
    destination, a member). With fewer than max(t, r_min) sources it refuses before training;
    otherwise the train handler runs knowing its upload leaves only inside a sum of at least r_min
    inputs (it charges σ·√(r_min/m)); the privatised update is quantised and masked. In a
    ``secagg+ddg`` sum the handler also gets the sum's discrete Gaussian and rotation seed
    (:func:`secure_ddg`): its mechanism returns the integer vector (x̃ + z) mod 2^b, which is masked.
    The masked vector travels packed in log₂ M bits per coordinate (b for ``secagg+ddg``):
    :func:`protocol.secure_sum.pack_masked`.
``consistency``
    The survivors U3 (members whose masked input reached the server): a list without duplicates,
    of members that shared keys with it, itself among them, at least max(t, r_min) of them. With a
    roster the member signs U3 with the sum's digest.
``unmask``
    The other members' consistency signatures. With a roster it requires valid signatures over the
    *same* U3 from more than half of the keyed members (and at least t): two different survivor
    sets can then never both be vouched for, so the server cannot show one member a target as
    surviving and another as dropped. It then sends, for each member of U3, its share of that
    member's self-mask seed, and for each member that shared keys but is not in U3, its share of
    that member's pairwise key: never both for one member, whatever lists the server sends.

Any failure is an error reply naming the stage and the member where one is at fault (the server
goes on without that member where r_min still holds); nothing is charged before the train
handler's own ledger step. Without a roster the checks that need no signature still hold; the
guarantee then holds against a server that follows the protocol (the report says so).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np
from cryptography.fernet import InvalidToken
from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.quantization import quantize
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat, share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from client.profile import ClientProfile, load_roster, load_signing_key, resolve_profile
from privacy.mechanisms import DDGSum
from privacy.secure_sum import add_mod, mask
from protocol import keys
from protocol.errors import ERROR_SECURE_SUM
from protocol.secure_sum import (
    DDG,
    SumParameters,
    consistency_threshold,
    keys_transcript,
    pack_masked,
    rotation_seed,
    survivors_transcript,
)
from protocol.train_config import TrainConfig

log = logging.getLogger("privet.client")

#: ``context.state`` record the mod sets while the train handler runs inside a secure sum.
MARKER = "privet.secure-sum"
#: ``context.state`` record of the sum in progress.
STATE = "privet.secure-sum-state"

ClientAppCallable = Callable[[Message, Context], Message]


class Refused(ValueError):
    """A stage this member will not complete; the reason names the member at fault where there is one."""


@dataclass
class MemberState:
    """What a member keeps between the stages of one sum (in ``context.state``: the server cannot write it)."""

    sum_id: str = ""
    stage: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    min_survivors: int = 0
    sk1: bytes = b""
    pk1: bytes = b""
    sk2: bytes = b""
    pk2: bytes = b""
    seed: bytes = b""
    members: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    pk1s: list[bytes] = field(default_factory=list)
    pk2s: list[bytes] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)  # U2: members whose shares reached this one
    seed_shares: list[bytes] = field(default_factory=list)  # parallel to ``members``
    key_shares: list[bytes] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)  # U3, as this member signed it
    rotation_seed: bytes = b""  # ``secagg+ddg``: derived from the verified key list

    @property
    def parameters(self) -> SumParameters:
        """The sum's parameters as set up."""
        return SumParameters(**self.params)

    def to_record(self) -> ConfigRecord:
        """The state as a ConfigRecord (parameters flattened)."""
        state = asdict(self)
        params = state.pop("params")
        return ConfigRecord({**state, **{f"param/{k}": v for k, v in params.items()}})

    @classmethod
    def from_record(cls, record: ConfigRecord | None) -> MemberState:
        """Back from :meth:`to_record` (a fresh state where there is none)."""
        if record is None:
            return cls()
        state = dict(record)
        params = {k.removeprefix("param/"): state.pop(k) for k in list(state) if k.startswith("param/")}
        return cls(**cast(dict[str, Any], {**state, "params": params}))


def secure_survivors(msg: Message, context: Context) -> int | None:
    """r_min if this train message runs inside a secure sum (set by the mod), else None."""
    marker = context.state.config_records.get(MARKER)
    if marker is None or marker.get("message-id") != msg.metadata.message_id:
        return None
    return int(cast(int, marker["min-survivors"]))


def secure_ddg(msg: Message, context: Context) -> DDGSum | None:
    """The discrete Gaussian sum this train message runs inside (set by the mod), else None."""
    marker = context.state.config_records.get(MARKER)
    if marker is None or marker.get("message-id") != msg.metadata.message_id or "rotation-seed" not in marker:
        return None
    params = SumParameters.from_record(marker)
    return DDGSum(params.ddg(), cast(bytes, marker["rotation-seed"]))


def secure_sum_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Run one stage of a secure sum, or pass a plain message through."""
    if msg.metadata.message_type != MessageType.TRAIN or keys.SECAGG_RECORD not in msg.content.config_records:
        return call_next(msg, ctxt)
    request = msg.content.config_records[keys.SECAGG_RECORD]
    stage = str(request.get(keys.SECAGG_STAGE, "?"))
    try:
        profile = resolve_profile(ctxt.node_config, ctxt.run_config)
        state = MemberState.from_record(ctxt.state.config_records.get(STATE))
        out = RecordDict()
        if stage == keys.STAGE_SETUP:
            state, answer = _setup(request, profile, int(ctxt.node_id))
        else:
            _expect(state, request, stage)
            if stage == keys.STAGE_SHARE_KEYS:
                answer = _share_keys(state, request, profile, int(ctxt.node_id))
            elif stage == keys.STAGE_COLLECT:
                reply, answer = _collect(state, request, msg, ctxt, call_next, int(ctxt.node_id))
                if reply.has_error():
                    return reply
                out = reply.content
            elif stage == keys.STAGE_CONSISTENCY:
                answer = _consistency(state, request, profile, int(ctxt.node_id))
            elif stage == keys.STAGE_UNMASK:
                answer = _unmask(state, request, profile, int(ctxt.node_id))
            else:
                raise Refused(f"unknown stage {stage!r}")
        state.stage = stage
    except (Refused, KeyError, TypeError, ValueError) as exc:
        log.warning("secure sum, stage %s: %s", stage, exc)
        return Message(Error(code=ERROR_SECURE_SUM, reason=f"{keys.SECURE_SUM_REFUSED} ({stage}): {exc}"),
                       reply_to=msg)
    finally:
        ctxt.state.config_records.pop(MARKER, None)
    ctxt.state.config_records[STATE] = state.to_record()
    out.config_records[keys.SECAGG_RECORD] = ConfigRecord(answer)
    return Message(out, reply_to=msg)


#: stage -> the stages it may follow (without a roster there is no consistency round to sign)
_ORDER = {keys.STAGE_SHARE_KEYS: (keys.STAGE_SETUP,), keys.STAGE_COLLECT: (keys.STAGE_SHARE_KEYS,),
          keys.STAGE_CONSISTENCY: (keys.STAGE_COLLECT,),
          keys.STAGE_UNMASK: (keys.STAGE_CONSISTENCY, keys.STAGE_COLLECT)}


def _expect(state: MemberState, request: ConfigRecord, stage: str) -> None:
    """The stage follows the one before it, in the same sum."""
    if request.get(keys.SECAGG_SUM_ID) != state.sum_id or not state.sum_id:
        raise Refused(f"stage {stage!r} of a sum this member did not set up")
    if state.stage not in _ORDER.get(stage, ()):
        raise Refused(f"stage {stage!r} after {state.stage!r}: out of order")


def _setup(request: ConfigRecord, profile: ClientProfile, node: int) -> tuple[MemberState, dict[str, Any]]:
    params = SumParameters.from_record(request)
    if params.mode == DDG:
        why = params.ddg_mismatch()
        if why:
            raise Refused(f"the sum's discrete Gaussian: {why}")
    floor = max(params.min_survivors, profile.floors.min_sum_size)
    if floor > params.members:
        raise Refused(f"the sum has {params.members} members, fewer than this site's min-sum-size "
                      f"{profile.floors.min_sum_size}")
    sk1, pk1 = generate_key_pairs()
    sk2, pk2 = generate_key_pairs()
    state = MemberState(sum_id=params.sum_id, params=asdict(params), min_survivors=floor,
                        sk1=private_key_to_bytes(sk1), pk1=public_key_to_bytes(pk1),
                        sk2=private_key_to_bytes(sk2), pk2=public_key_to_bytes(pk2))
    signature = b""
    if profile.signing_key:
        signature = load_signing_key(profile.signing_key).sign(
            keys_transcript(params.digest(), profile.client_id, node, state.pk1, state.pk2))
    return state, {keys.SECAGG_PK1: state.pk1, keys.SECAGG_PK2: state.pk2, keys.CLIENT_ID: profile.client_id,
                   keys.SIGNATURE: signature}


def _share_keys(state: MemberState, request: ConfigRecord, profile: ClientProfile, node: int) -> dict[str, Any]:
    nodes = [int(n) for n in cast(list[int], request[keys.SECAGG_NODES])]
    names = [str(n) for n in cast(list[str], request[keys.SECAGG_NAMES])]
    pk1s, pk2s = cast(list[bytes], request[keys.SECAGG_PK1S]), cast(list[bytes], request[keys.SECAGG_PK2S])
    signatures = cast(list[bytes], request[keys.SECAGG_SIGNATURES])
    if not len(nodes) == len(names) == len(pk1s) == len(pk2s) == len(signatures):
        raise Refused("the key lists differ in length")
    if len(set(nodes)) != len(nodes) or len(set(names)) != len(names) or len(set(pk1s + pk2s)) != 2 * len(nodes):
        raise Refused("a node, a client id or a public key appears twice")
    if node not in nodes or (pk1s[nodes.index(node)], pk2s[nodes.index(node)]) != (state.pk1, state.pk2) \
            or names[nodes.index(node)] != profile.client_id:
        raise Refused("this member's own keys are missing or changed")
    params = state.parameters
    if len(nodes) < max(params.threshold, state.min_survivors):
        raise Refused(f"{len(nodes)} members shared keys, fewer than max(threshold {params.threshold}, "
                      f"min-survivors {state.min_survivors})")
    if len(nodes) > params.members:
        raise Refused(f"{len(nodes)} members, more than the {params.members} set up")
    if profile.roster:
        roster, digest = load_roster(profile.roster), params.digest()
        for n, name, pk1, pk2, sig in zip(nodes, names, pk1s, pk2s, signatures, strict=True):
            why = roster.verify(name, sig, keys_transcript(digest, name, n, pk1, pk2))
            if why:
                raise Refused(f"member {name} (node {n}): its keys are not signed for this sum: {why}")
    state.members, state.names, state.pk1s, state.pk2s = nodes, names, list(pk1s), list(pk2s)
    if params.mode == DDG:
        state.rotation_seed = rotation_seed(params.digest(), nodes, names, pk1s, pk2s)
    state.seed = os.urandom(32)
    seed_shares = create_shares(state.seed, params.threshold, len(nodes))
    key_shares = create_shares(state.sk1, params.threshold, len(nodes))
    state.seed_shares, state.key_shares = [b""] * len(nodes), [b""] * len(nodes)
    dsts, texts = [], []
    for i, (n, pk2) in enumerate(zip(nodes, pk2s, strict=True)):
        if n == node:
            state.seed_shares[i], state.key_shares[i] = seed_shares[i], key_shares[i]
            continue
        secret = generate_shared_key(bytes_to_private_key(state.sk2), bytes_to_public_key(pk2))
        dsts.append(n)
        texts.append(encrypt(secret, share_keys_plaintext_concat(node, n, seed_shares[i], key_shares[i])))
    return {keys.SECAGG_DESTINATIONS: dsts, keys.SECAGG_CIPHERTEXTS: texts}


def _collect(state: MemberState, request: ConfigRecord, msg: Message, ctxt: Context, call_next: ClientAppCallable,
             node: int) -> tuple[Message, dict[str, Any]]:
    """Store the shares addressed to this member, train with the marker set, mask the update."""
    params = state.parameters
    train = TrainConfig.decode(msg.content.config_records[keys.CONFIG])
    if (train.clip, train.noise_multiplier, train.noise_shares) != (params.clip, params.noise_multiplier,
                                                                    params.noise_shares):
        raise Refused(f"the train config's mechanism (C={train.clip:g}, sigma={train.noise_multiplier:g}, "
                      f"m={train.noise_shares}) differs from the one the sum's members signed for "
                      f"(C={params.clip:g}, sigma={params.noise_multiplier:g}, m={params.noise_shares})")
    sources = [int(s) for s in cast(list[int], request[keys.SECAGG_SOURCES])]
    texts = cast(list[bytes], request[keys.SECAGG_CIPHERTEXTS])
    if len(sources) != len(texts) or len(set(sources)) != len(sources):
        raise Refused("the forwarded shares are malformed (lengths differ, or a source appears twice)")
    if len(sources) + 1 < max(state.parameters.threshold, state.min_survivors):
        raise Refused(f"{len(sources) + 1} members shared keys with this one, fewer than max(threshold, "
                      f"min-survivors={state.min_survivors}): nothing trained or charged")
    for src, text in zip(sources, texts, strict=True):
        if src == node or src not in state.members:
            raise Refused(f"a share from node {src}, not another member of this sum")
        i = state.members.index(src)
        secret = generate_shared_key(bytes_to_private_key(state.sk2), bytes_to_public_key(state.pk2s[i]))
        try:
            actual, dst, seed_share, key_share = share_keys_plaintext_separate(decrypt(secret, text))
        except InvalidToken:
            raise Refused(f"member {state.names[i]}: its share does not decrypt under the key agreed with it "
                          "(forged, or keys substituted)") from None
        if actual != src or dst != node:
            raise Refused(f"member {state.names[i]}: a share from {actual} to {dst} forwarded as from {src} to {node}")
        state.seed_shares[i], state.key_shares[i] = seed_share, key_share
    state.sources = sorted([*sources, node])
    marker: dict[str, Any] = {"message-id": msg.metadata.message_id, "min-survivors": state.min_survivors}
    if params.mode == DDG:  # the train handler's mechanism encodes with the sum's numbers and rotation
        marker.update({**params.encode(), "rotation-seed": state.rotation_seed})
    ctxt.state.config_records[MARKER] = ConfigRecord(marker)
    reply = call_next(msg, ctxt)
    if reply.has_error():
        return reply, {}
    return reply, {keys.SECAGG_MASKED: _masked_update(state, msg, reply.content, node)}


def _masked_update(state: MemberState, msg: Message, content: RecordDict, node: int) -> bytes:
    """The member's input (quantised ỹ = trained − global, or the DDG integer vector) plus its masks, mod M, packed.

    Packed in log₂ M bits per coordinate: :func:`protocol.secure_sum.pack_masked`.
    """
    params = state.parameters
    if params.mode == DDG:
        quantised = _ddg_input(params, content)
    else:
        trained = content.array_records[keys.ARRAYS].to_numpy_ndarrays()
        sent = msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays()
        update = [np.asarray(t, np.float64) - np.asarray(g, np.float64) for t, g in zip(trained, sent, strict=True)]
        if not all(np.isfinite(u).all() for u in update):
            raise Refused("the privatised update is not finite")
        quantised = [np.asarray(q, np.int64) for q in quantize(update, params.clipping_range, params.levels)]
    shapes = [q.shape for q in quantised]
    masked = add_mod(quantised, mask(state.seed, params.modulus, shapes), params.modulus)
    sk1 = bytes_to_private_key(state.sk1)
    for other, pk1 in zip(state.members, state.pk1s, strict=True):
        if other == node or other not in state.sources:
            continue
        pairwise = mask(generate_shared_key(sk1, bytes_to_public_key(pk1)), params.modulus, shapes)
        masked = add_mod(masked, pairwise, params.modulus, 1 if node > other else -1)
    for record in content.array_records.values():
        record.clear()
    return pack_masked(masked, params.modulus)


def _ddg_input(params: SumParameters, content: RecordDict) -> list[np.ndarray]:
    """The train handler's (x̃ + z) mod 2^b, checked: one integer vector of d' coordinates in [0, 2^b)."""
    arrays = content.array_records[keys.ARRAYS].to_numpy_ndarrays()
    padded = params.ddg().padded_dim
    if len(arrays) != 1 or arrays[0].shape != (padded,) or not np.issubdtype(arrays[0].dtype, np.integer) \
            or int(arrays[0].min()) < 0 or int(arrays[0].max()) >= params.modulus:
        raise Refused(f"the train handler's input is not one integer vector of {padded} coordinates in "
                      f"[0, 2^{params.bits})")
    return [np.asarray(arrays[0], np.int64)]


def _survivor_list(state: MemberState, request: ConfigRecord, node: int) -> list[int]:
    """U3 as the server sends it, checked: no duplicates, members that shared keys, enough of them."""
    survivors = [int(s) for s in cast(list[int], request[keys.SECAGG_SURVIVORS])]
    if len(set(survivors)) != len(survivors):
        raise Refused("the survivor list holds a member twice")
    strangers = [s for s in survivors if s not in state.sources]
    if strangers:
        raise Refused(f"the survivor list names nodes {strangers} that did not share keys with this member")
    if node not in survivors:
        raise Refused("this member's own input is missing from the survivors")
    floor = max(state.parameters.threshold, state.min_survivors)
    if len(survivors) < floor:
        raise Refused(f"only {len(survivors)} inputs reached the sum, fewer than max(threshold, min-survivors) = "
                      f"{floor}: this member sends nothing that would release it")
    return sorted(survivors)


def _consistency(state: MemberState, request: ConfigRecord, profile: ClientProfile, node: int) -> dict[str, Any]:
    state.survivors = _survivor_list(state, request, node)
    signature = b""
    if profile.signing_key:
        signature = load_signing_key(profile.signing_key).sign(
            survivors_transcript(state.parameters.digest(), state.survivors))
    return {keys.SIGNATURE: signature}


def _unmask(state: MemberState, request: ConfigRecord, profile: ClientProfile, node: int) -> dict[str, Any]:
    """Shares that remove the masks of the agreed survivors' sum, never both of one member."""
    if state.stage == keys.STAGE_COLLECT:  # no consistency round: only a server that follows the protocol
        if profile.roster:
            raise Refused("this site has a roster and unmasks only survivors its members vouched for in a "
                          "consistency round; the server skipped it")
        state.survivors = _survivor_list(state, request, node)
    elif profile.roster:  # the survivors this member signed must be the ones a majority signed
        signers = [int(s) for s in cast(list[int], request[keys.SECAGG_SIGNERS])]
        signatures = cast(list[bytes], request[keys.SECAGG_SIGNATURES])
        if len(signers) != len(signatures):
            raise Refused("the consistency signatures are malformed")
        roster, message = load_roster(profile.roster), survivors_transcript(state.parameters.digest(), state.survivors)
        vouched = {s for s, sig in zip(signers, signatures, strict=True)
                   if s in state.members and roster.verify(state.names[state.members.index(s)], sig, message) is None}
        needed = consistency_threshold(state.parameters.threshold, len(state.members))
        if len(vouched) < needed:
            raise Refused(f"only {len(vouched)} members vouch for the survivors this member signed, fewer than the "
                          f"{needed} (a majority of the {len(state.members)} members, and the threshold) it needs")
    owners, shares = [], []
    for i, member in enumerate(state.members):
        if member not in state.sources:
            continue
        owners.append(member)
        shares.append(state.seed_shares[i] if member in state.survivors else state.key_shares[i])
    kinds = ["seed" if o in state.survivors else "key" for o in owners]
    return {keys.SECAGG_OWNERS: owners, keys.SECAGG_SHARES: shares, keys.SECAGG_KINDS: kinds}
