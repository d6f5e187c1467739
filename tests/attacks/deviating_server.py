"""A server that deviates from the protocol, as an attacker in control of the ServerApp would.

:class:`DeviatingGrid` is the in-process grid whose outgoing messages pass through the attacker
(``tamper``: rewrite or drop each one), with the real ClientApp on every node. :class:`Loot`
keeps everything the attacker received in the secure-sum stages, and what each client really
quantised (read on the client, for the test's judgement only); :meth:`Loot.recover` is the
attacker's last step: from the shares it holds, rebuild one member's masks and subtract them from
that member's masked input. If that gives the member's quantised input bit for bit, the secure
sum exposed one client's update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from flwr.app import Message
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

from client.app import app as client_app
from privacy.secure_sum import add_mod, mask
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys
from protocol.bitpack import unpack
from protocol.roster import generate

Tamper = Callable[[int, Message], Message | None]


def stage_of(msg: Message) -> str:
    """The secure-sum stage a message carries ("" if none)."""
    record = msg.content.config_records.get(keys.SECAGG_RECORD)
    return str(record.get(keys.SECAGG_STAGE, "")) if record is not None else ""


class DeviatingGrid(InProcessGrid):
    """The in-process grid with an attacker between the ServerApp and the nodes."""

    def __init__(self, *args: Any, tamper: Tamper, loot: Loot, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tamper, self.loot = tamper, loot

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        sent = []
        for msg in messages:
            changed = self.tamper(msg.metadata.dst_node_id, msg)
            if changed is not None:
                sent.append(changed)
        replies = super().send_and_receive(sent, timeout=timeout)
        asked = {m.metadata.dst_node_id: m for m in sent}
        for reply in replies:
            if reply.metadata.src_node_id in asked:
                self.loot.keep(asked[reply.metadata.src_node_id], reply)
        return replies


@dataclass
class Loot:
    """What the attacker holds after the run, and (for the judgement) what each client quantised."""

    pk1: dict[int, bytes] = field(default_factory=dict)
    masked: dict[int, list[np.ndarray]] = field(default_factory=dict)
    seed_shares: dict[int, list[bytes]] = field(default_factory=dict)
    key_shares: dict[int, list[bytes]] = field(default_factory=dict)
    refusals: list[tuple[int, str, str]] = field(default_factory=list)
    truth: dict[int, list[np.ndarray]] = field(default_factory=dict)
    consistency: dict[int, tuple[list[int], bytes]] = field(default_factory=dict)  # node -> (set sent, signature)
    share_keys: dict[int, tuple[list[int], list[bytes]]] = field(default_factory=dict)  # node -> (dsts, ciphertexts)
    pk2: dict[int, bytes] = field(default_factory=dict)
    modulus: int = 0
    threshold: int = 2

    def keep(self, request: Message, reply: Message) -> None:
        stage, node = stage_of(request), request.metadata.dst_node_id
        if not stage:
            return
        if reply.has_error():
            self.refusals.append((node, stage, str(reply.error.reason)))
            return
        answer = reply.content.config_records[keys.SECAGG_RECORD]
        if stage == keys.STAGE_SETUP:
            record = request.content.config_records[keys.SECAGG_RECORD]
            self.modulus, self.threshold = int(record["param/modulus"]), int(record["param/threshold"])
            self.pk1[node] = cast(bytes, answer[keys.SECAGG_PK1])
            self.pk2[node] = cast(bytes, answer[keys.SECAGG_PK2])
        elif stage == keys.STAGE_SHARE_KEYS:
            self.share_keys[node] = (cast(list[int], answer[keys.SECAGG_DESTINATIONS]),
                                     cast(list[bytes], answer[keys.SECAGG_CIPHERTEXTS]))
        elif stage == keys.STAGE_CONSISTENCY:
            sent = cast(list[int], request.content.config_records[keys.SECAGG_RECORD][keys.SECAGG_SURVIVORS])
            self.consistency[node] = (list(sent), cast(bytes, answer[keys.SIGNATURE]))
        elif stage == keys.STAGE_COLLECT:
            # one vector of log₂ M-bit words (protocol.secure_sum): ⌊8·len/w⌋ is its length for w ≥ 8
            raw, width = cast(bytes, answer[keys.SECAGG_MASKED]), self.modulus.bit_length() - 1
            self.masked[node] = [unpack(raw, 8 * len(raw) // width, width).astype(np.int64)]
        elif stage == keys.STAGE_UNMASK:
            kinds = cast(list[str], answer.get(keys.SECAGG_KINDS, []))
            for owner, share, kind in zip(cast(list[int], answer[keys.SECAGG_OWNERS]),
                                          cast(list[bytes], answer[keys.SECAGG_SHARES]), kinds, strict=True):
                (self.seed_shares if kind == "seed" else self.key_shares).setdefault(owner, []).append(share)

    def recover(self, target: int) -> list[np.ndarray] | None:
        """The target's quantised input, rebuilt from the loot (None: the shares do not allow it)."""
        seeds, keys_ = self.seed_shares.get(target, []), self.key_shares.get(target, [])
        if target not in self.masked or len(seeds) < self.threshold or len(keys_) < self.threshold:
            return None
        shapes = [a.shape for a in self.masked[target]]
        out = add_mod(self.masked[target], mask(combine_shares(seeds[: self.threshold]), self.modulus, shapes),
                      self.modulus, -1)
        sk1 = bytes_to_private_key(combine_shares(keys_[: self.threshold]))
        for other, pk1 in self.pk1.items():  # the target masked pairwise with every member that shared keys
            if other == target:
                continue
            pairwise = mask(generate_shared_key(sk1, bytes_to_public_key(pk1)), self.modulus, shapes)
            out = add_mod(out, pairwise, self.modulus, -1 if target > other else 1)
        return out

    def exposed(self, target: int) -> bool:
        """Whether the attacker rebuilt the target's quantised input exactly."""
        got = self.recover(target)
        if got is None:
            return False
        # the input travels as one vector: the arrays' coordinates in order (so are their masks)
        return np.array_equal(np.concatenate([a.ravel() for a in got]),
                              np.concatenate([a.ravel() for a in self.truth[target]]))


def spy_on_quantisation(monkeypatch: Any, loot: Loot, grid_holder: list[InProcessGrid]) -> None:
    """Record each client's quantised input, or its discrete Gaussian integer vector in a ``secagg+ddg`` sum
    (the ground truth the attacker tries to reach)."""
    import client.secure_sum as client_sum

    real, real_ddg = client_sum.quantize, client_sum._ddg_input

    def quantize(params: Any, clipping_range: float, target_range: int) -> Any:
        out = real(params, clipping_range, target_range)
        loot.truth[grid_holder[0].current] = [np.asarray(a, np.int64) for a in out]
        return out

    def ddg_input(params: Any, content: Any) -> list[np.ndarray]:
        out = real_ddg(params, content)
        loot.truth[grid_holder[0].current] = [np.asarray(a, np.int64) for a in out]
        return out

    monkeypatch.setattr(client_sum, "quantize", quantize)
    monkeypatch.setattr(client_sum, "_ddg_input", ddg_input)


class TrackingGrid(DeviatingGrid):
    """A :class:`DeviatingGrid` that knows which node it is calling (for the quantisation spy)."""

    current = 0

    def _call(self, msg: Message) -> Message:
        self.current = msg.metadata.dst_node_id
        return super()._call(msg)


def secure_run(cfg: dict[str, Any], tamper: Tamper, monkeypatch: Any, roster_dir: Path | None,
               loot: Loot | None = None) -> tuple[Loot, Any]:
    """One run of ``cfg`` through the attacker; with ``roster_dir``, every simulated site has a roster key.

    ``loot``: the attacker's store, where its ``tamper`` needs to read what it gathered so far.
    """
    from server.app import run_experiment

    if roster_dir is not None:
        cfg = {**cfg, "roster": str(generate([str(i) for i in range(int(cfg["num-clients"]))], roster_dir))}
    loot = loot if loot is not None else Loot()
    holder: list[InProcessGrid] = []
    spy_on_quantisation(monkeypatch, loot, holder)
    grid = TrackingGrid(client_app, simulation_node_configs(int(cfg["num-clients"])), cfg, tamper=tamper, loot=loot)
    holder.append(grid)
    try:
        summary = run_experiment(grid, cfg, run_id=1)
    except RuntimeError:  # a run whose rounds all failed: the attack was refused
        import json

        summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    return loot, summary
