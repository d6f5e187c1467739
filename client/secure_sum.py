"""The client side of a secure sum: Flower's SecAgg+ client stages with privet's input and masks.

``secure_sum_mod`` is a ClientApp mod. A train message without Flower's SecAgg+ config
record passes straight through to the train handler. One with it runs the stage it names:

* ``setup``, ``share_keys``: Flower's own ``secaggplus_mod`` stages (X25519 key pairs,
  Shamir shares of the self-mask seed and of the pairwise secret key, encrypted to each
  neighbour). privet adds ``min-survivors`` (r_min) and the quantisation to the setup.
* ``collect_masked_vectors``: refuses before training when fewer than r_min clients shared
  keys; otherwise runs the train handler with a marker in ``context.state`` (which the
  server cannot write) telling it that its upload leaves only inside a sum of at least
  r_min, so it charges σ·√(r_min/m) (:func:`privacy.secure_sum.charged_multiplier`);
  then quantises the privatised update ỹ = trained − global, adds the self mask and the
  pairwise masks (:func:`privacy.secure_sum.mask`) and sends the masked integers only.
* ``unmask``: refuses to send its shares when fewer than r_min inputs made it into the
  sum, so a sum below r_min is never released by honest clients; otherwise Flower's stage.

Any failure becomes an error reply naming the stage (the server drops the client from the
sum); nothing is charged before the train handler's own ledger step.
"""

from __future__ import annotations

import logging
from typing import Callable, cast

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict
from flwr.client.mod.secure_aggregation.secaggplus_mod import (
    SecAggPlusState,
    _setup,
    _share_keys,
    _unmask,
    check_configs,
    check_stage,
)
from flwr.common import ndarray_to_bytes
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, generate_shared_key
from flwr.common.secure_aggregation.quantization import quantize
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from privacy.secure_sum import add_mod, mask, wire_dtype
from protocol import keys
from protocol.errors import ERROR_SECURE_SUM

log = logging.getLogger("privet.client")


#: ``context.state`` record the mod sets while the train handler runs inside a secure sum.
MARKER = "privet.secure-sum"

ClientAppCallable = Callable[[Message, Context], Message]


def secure_survivors(msg: Message, context: Context) -> int | None:
    """r_min if this train message runs inside a secure sum (set by the mod), else None."""
    marker = context.state.config_records.get(MARKER)
    if marker is None or marker.get("message-id") != msg.metadata.message_id:
        return None
    return int(cast(int, marker["min-survivors"]))


def secure_sum_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Run one SecAgg+ stage of a secure sum, or pass a plain message through."""
    if msg.metadata.message_type != MessageType.TRAIN or RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, ctxt)
    if RECORD_KEY_STATE not in ctxt.state.config_records:
        ctxt.state.config_records[RECORD_KEY_STATE] = ConfigRecord({})
    state = SecAggPlusState(**ctxt.state.config_records[RECORD_KEY_STATE])
    configs = ConfigRecord(dict(msg.content.config_records[RECORD_KEY_CONFIGS]))  # never edit the request
    stage = str(configs.get(Key.STAGE, "?"))
    try:
        check_stage(state.current_stage, configs)
        state.current_stage = cast(str, configs.pop(Key.STAGE))
        check_configs(state.current_stage, configs)
        out_content = RecordDict()
        if state.current_stage == Stage.SETUP:
            state.nid = msg.metadata.dst_node_id
            res = _setup_with_survivors(state, configs)
        elif state.current_stage == Stage.SHARE_KEYS:
            res = _share_keys(state, configs)
        elif state.current_stage == Stage.COLLECT_MASKED_VECTORS:
            reply = _train_inside_sum(state, configs, msg, ctxt, call_next)
            if reply.has_error():
                return reply
            out_content = reply.content
            res = _masked_update(state, msg, out_content)
        else:
            survivors = len(cast(list[int], configs[Key.ACTIVE_NODE_ID_LIST]))
            floor = int(getattr(state, "min_survivors", 1))
            if survivors < floor:
                raise ValueError(f"only {survivors} inputs reached the sum, fewer than min-survivors={floor}: "
                                 "this client sends no unmasking shares, so the sum is not released")
            res = _unmask(state, configs)
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("secure sum, stage %s: %s", stage, exc)
        return Message(Error(code=ERROR_SECURE_SUM, reason=f"{keys.SECURE_SUM_REFUSED} ({stage}): {exc}"),
                       reply_to=msg)
    finally:
        ctxt.state.config_records.pop(MARKER, None)
    ctxt.state.config_records[RECORD_KEY_STATE] = ConfigRecord(state.to_dict())
    out_content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(res, False)
    return Message(out_content, reply_to=msg)


def _setup_with_survivors(state: SecAggPlusState, configs: ConfigRecord) -> dict:
    """Flower's setup, plus r_min (kept in the state) and a modulus that int64 arithmetic holds."""
    floor = int(cast(int, configs.get(keys.SECURE_MIN_SURVIVORS, 1)))
    members = int(cast(int, configs[Key.SAMPLE_NUMBER]))
    if not 1 <= floor <= members:
        raise ValueError(f"'{keys.SECURE_MIN_SURVIVORS}' must be in [1, {members}]; found {floor}")
    modulus = int(cast(int, configs[Key.MOD_RANGE]))
    if modulus > 2**62:
        raise ValueError(f"modulus {modulus} above 2**62")
    state.min_survivors = floor  # type: ignore[attr-defined]  # kept in the state record
    return _setup(state, configs)


def _train_inside_sum(state: SecAggPlusState, configs: ConfigRecord, msg: Message, ctxt: Context,
                      call_next: ClientAppCallable) -> Message:
    """Store the neighbours' shares (Flower's checks), then train with the marker set."""
    ciphertexts = cast(list[bytes], configs[Key.CIPHERTEXT_LIST])
    sources = cast(list[int], configs[Key.SOURCE_LIST])
    floor = int(getattr(state, "min_survivors", 1))
    if len(ciphertexts) + 1 < max(state.threshold, floor):
        raise ValueError(f"{len(ciphertexts) + 1} clients shared keys, fewer than the threshold {state.threshold} "
                         f"or min-survivors={floor}: nothing trained or charged")
    for src, ciphertext in zip(sources, ciphertexts, strict=True):
        actual_src, dst, seed_share, sk1_share = share_keys_plaintext_separate(decrypt(state.ss2_dict[src],
                                                                                       ciphertext))
        if actual_src != src or dst != state.nid:
            raise ValueError(f"share from {actual_src} to {dst} forwarded as from {src} to {state.nid}")
        state.rd_seed_share_dict[src] = seed_share
        state.sk1_share_dict[src] = sk1_share
    state.public_keys_dict = {n: k for n, k in state.public_keys_dict.items() if n in set(sources) | {state.nid}}
    ctxt.state.config_records[MARKER] = ConfigRecord({"message-id": msg.metadata.message_id,
                                                       "min-survivors": floor})
    return call_next(msg, ctxt)


def _masked_update(state: SecAggPlusState, msg: Message, content: RecordDict) -> dict:
    """Quantise ỹ = trained − global, add the self mask and the pairwise masks, mod M."""
    trained = content.array_records[keys.ARRAYS].to_numpy_ndarrays()
    sent = msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays()
    update = [np.asarray(t, np.float64) - np.asarray(g, np.float64) for t, g in zip(trained, sent, strict=True)]
    if not all(np.isfinite(u).all() for u in update):
        raise ValueError("the privatised update is not finite")
    quantised = [np.asarray(q, np.int64) for q in quantize(update, state.clipping_range, state.target_range)]
    shapes = [q.shape for q in quantised]
    masked = add_mod(quantised, mask(state.rd_seed, state.mod_range, shapes), state.mod_range)
    for node, (pk1, _) in state.public_keys_dict.items():
        if node == state.nid:
            continue
        pairwise = mask(generate_shared_key(bytes_to_private_key(state.sk1), bytes_to_public_key(pk1)),
                        state.mod_range, shapes)
        masked = add_mod(masked, pairwise, state.mod_range, 1 if state.nid > node else -1)
    for record in content.array_records.values():
        record.clear()
    wire = wire_dtype(state.mod_range)
    return {Key.MASKED_PARAMETERS: [ndarray_to_bytes(m.astype(wire)) for m in masked]}
