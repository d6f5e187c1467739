"""Masked secure-sum inputs on the wire: packed in log₂ M bits per coordinate (issue 39).

Runs the real ClientApp (its secure-sum mod) and the real strategy on the in-process grid, in both
sum modes, and checks against what each side held apart from the wire:

- the integers the server unpacks are the ones each member masked, bit for bit, and the integer
  sum it decodes is Σ of the members' unmasked inputs mod M, to the last integer;
- a member whose payload has the wrong length, or a padding bit set, is rejected with a logged
  reason naming it, and the sum of the others is released (r_min still holds);
- the bytes of the collect replies (Flower's protobuf sizes) grow by d'/8 per bit of b.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message
from flwr.common.serde import recorddict_to_proto

import client.secure_sum as client_sum
import strategies.secure_rounds as rounds_module
import strategies.secure_sum as sum_module
from client.app import app as client_app
from privet.inprocess import FIRST_NODE_ID, InProcessGrid, simulation_node_configs
from protocol import keys
from server.app import run_experiment

SIGMA, CLIENTS, DIM, PADDED = 4.0, 5, 7850, 8192  # logreg on Fashion-MNIST; d' = 2^13 for secagg+ddg
Tamper = Callable[[bytes], bytes]


def _config(run_config_factory: Any, mode: str, bits: int, **overrides: Any) -> dict[str, Any]:
    cfg = run_config_factory(strategy="udp-fedavg", num_clients=CLIENTS, noise_multiplier=SIGMA,
                             noise_shares=CLIENTS, epsilon_min=20, epsilon_max=30, secure_aggregation=mode,
                             min_train_clients=CLIENTS, num_server_rounds=1, **{"secagg.bits": bits},
                             **({"accountant": "rdp"} if mode == "secagg+ddg" else {}))
    cfg.update(overrides)
    return dict(cfg)


class Wire:
    """Both sides of the wire: what each member masked and sent, what the server read and decoded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tamper: dict[int, Tamper] | None = None) -> None:
        self.tamper = tamper or {}
        self.node = 0
        self.inputs: dict[int, np.ndarray] = {}  # before masking (client side)
        self.masked: dict[int, np.ndarray] = {}  # masked, before packing (client side)
        self.read: dict[int, np.ndarray] = {}  # as the server unpacked it
        self.payloads: dict[int, bytes] = {}  # as it travelled
        self.reply_bytes: dict[int, int] = {}  # protobuf size of each collect reply
        self.totals: list[np.ndarray] = []  # the unmasked integer sums the server decoded
        self.modulus = 0
        real_quantize, real_ddg_input, real_pack = client_sum.quantize, client_sum._ddg_input, client_sum.pack_masked
        real_read, real_dequantize, real_decode = rounds_module.masked_input, sum_module.dequantize, sum_module.decode

        def quantize(params: Any, clipping_range: float, target_range: int) -> Any:
            out = real_quantize(params, clipping_range, target_range)
            self.inputs[self.node] = np.concatenate([np.asarray(a, np.int64).ravel() for a in out])
            return out

        def ddg_input(params: Any, content: Any) -> list[np.ndarray]:
            out = real_ddg_input(params, content)
            self.inputs[self.node] = out[0].copy()
            return out

        def pack(arrays: Any, modulus: int) -> bytes:
            self.masked[self.node] = np.concatenate([np.asarray(a, np.int64).ravel() for a in arrays])
            self.modulus = modulus
            return real_pack(arrays, modulus)

        def read(reply: Message, shapes: Any, modulus: int) -> Any:
            got = real_read(reply, shapes, modulus)
            if not isinstance(got, str):
                self.read[reply.metadata.src_node_id] = np.concatenate([a.ravel() for a in got])
            return got

        def dequantize(total: Any, *args: Any) -> Any:
            self.totals.append(np.concatenate([np.asarray(a, np.int64).ravel() for a in total]))
            return real_dequantize(total, *args)

        def decode(total: Any, *args: Any) -> Any:
            self.totals.append(np.asarray(total, np.int64).copy())
            return real_decode(total, *args)

        monkeypatch.setattr(client_sum, "quantize", quantize)
        monkeypatch.setattr(client_sum, "_ddg_input", ddg_input)
        monkeypatch.setattr(client_sum, "pack_masked", pack)
        monkeypatch.setattr(rounds_module, "masked_input", read)
        monkeypatch.setattr(sum_module, "dequantize", dequantize)
        monkeypatch.setattr(sum_module, "decode", decode)

    def hook(self, node: int, request: Message, reply: Message) -> Message:
        record = request.content.config_records.get(keys.SECAGG_RECORD)
        if record is None or record.get(keys.SECAGG_STAGE) != keys.STAGE_COLLECT or reply.has_error():
            return reply
        answer = dict(reply.content.config_records[keys.SECAGG_RECORD])
        payload = answer[keys.SECAGG_MASKED]
        assert isinstance(payload, bytes)
        if node in self.tamper:
            payload = self.tamper[node](payload)
            answer[keys.SECAGG_MASKED] = payload
            reply.content.config_records[keys.SECAGG_RECORD] = ConfigRecord(answer)
        self.payloads[node] = payload
        self.reply_bytes[node] = recorddict_to_proto(reply.content).ByteSize()
        return reply

    def run(self, cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The run's summary and its round's ``rounds.jsonl`` line."""
        grid = InProcessGrid(client_app, simulation_node_configs(CLIENTS), cfg, reply_hook=self.hook)
        real_call = grid._call

        def call(msg: Message) -> Message:
            self.node = msg.metadata.dst_node_id  # the client-side spies run inside this call
            return real_call(msg)

        grid._call = call  # type: ignore[method-assign]
        summary = run_experiment(grid, cfg, run_id=1)
        line = json.loads((Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()[1])
        return summary, line


@pytest.mark.parametrize(("mode", "bits", "width", "count"), [("secagg+", 24, 27, DIM), ("secagg+", 12, 15, DIM),
                                                              ("secagg+ddg", 16, 16, PADDED),
                                                              ("secagg+ddg", 13, 13, PADDED)])
def test_the_server_reads_what_each_member_masked_and_decodes_the_inputs_sum_exactly(run_config_factory, monkeypatch,
                                                                                     mode, bits, width, count):
    wire = Wire(monkeypatch)
    summary, line = wire.run(_config(run_config_factory, mode, bits))
    assert summary["rounds_completed"] == 1 and not summary["failed_rounds"] and line["secure_sums"][0]["released"]
    # M = 2^w: for secagg+ the smallest power of two above K·(2^b − 1), for secagg+ddg 2^b
    assert wire.modulus == 2**width and (mode == "secagg+ddg" or 2**width > CLIENTS * (2**bits - 1) >= 2**(width - 1))
    assert sorted(wire.payloads) == sorted(wire.masked) == sorted(wire.read) == sorted(wire.inputs)
    for node, payload in wire.payloads.items():
        assert len(payload) == math.ceil(count * width / 8)  # w bits a coordinate
        assert wire.read[node].dtype == np.int64 and np.array_equal(wire.read[node], wire.masked[node])
    # the unmasked integer sum is the members' inputs summed mod M, to the last integer
    (total,) = wire.totals
    assert np.array_equal(total, np.mod(sum(wire.inputs.values()), wire.modulus))
    assert line["bytes_up"] == sum(len(p) for p in wire.payloads.values()) == CLIENTS * math.ceil(count * width / 8)


def _set_padding_bit(payload: bytes) -> bytes:
    return payload[:-1] + bytes([payload[-1] | 0x80])


@pytest.mark.parametrize(("mode", "bits", "tamper", "why"), [
    ("secagg+", 24, _set_padding_bit, "padding bits"),  # 7,850 · 27 bits leave 2 padding bits
    ("secagg+", 24, lambda p: p[:-1], "not the 26494"),
    ("secagg+ddg", 16, lambda p: p + b"\0", "not the 16384"),  # d'·b is whole bytes: no padding to set
    ("secagg+ddg", 16, lambda p: [p], "byte string"),
])
def test_a_malformed_payload_is_rejected_naming_the_member_and_the_others_are_summed(run_config_factory, monkeypatch,
                                                                                    caplog, mode, bits, tamper, why):
    wire = Wire(monkeypatch, tamper={FIRST_NODE_ID: tamper})  # any one member will do
    cfg = _config(run_config_factory, mode, bits, **{"secagg.min-survivors": CLIENTS - 1})
    with caplog.at_level(logging.WARNING):
        summary, line = wire.run(cfg)
    (rejected,) = line["rejected"]
    assert why in rejected["reason"] and keys.SECAGG_MASKED in rejected["reason"]
    assert any(f"client {rejected['client']}" in r.getMessage() and why in r.getMessage() for r in caplog.records)
    assert rejected["client"] not in line["accepted"] and len(line["accepted"]) == CLIENTS - 1
    # the round went on: the sum of the four others, released and exact
    assert summary["rounds_completed"] == 1 and not summary["failed_rounds"]
    (row,) = line["secure_sums"]
    assert row["released"] and row["survivors"] == CLIENTS - 1
    (total,) = wire.totals
    others = [v for n, v in wire.inputs.items() if n != FIRST_NODE_ID]
    assert np.array_equal(total, np.mod(sum(others), wire.modulus))


@pytest.mark.slow
def test_bytes_on_the_wire_grow_with_b(run_config_factory, monkeypatch, tmp_path):
    sizes, payloads, bytes_up = {}, {}, {}
    for bits in (12, 16, 20, 24):
        wire = Wire(monkeypatch)
        cfg = _config(run_config_factory, "secagg+ddg", bits, **{"out-dir": str(tmp_path / f"b{bits}")})
        _, line = wire.run(cfg)
        assert len(wire.reply_bytes) == CLIENTS
        sizes[bits] = float(np.mean(list(wire.reply_bytes.values())))
        payloads[bits] = {len(p) for p in wire.payloads.values()}
        bytes_up[bits] = line["bytes_up"]
    for bits in sizes:
        assert payloads[bits] == {PADDED * bits // 8} and bytes_up[bits] == CLIENTS * PADDED * bits // 8
    # the whole collect reply (Flower's protobuf, with the train report beside the payload): a line in b
    # of slope d'/8 bytes per bit, plus what does not depend on b
    b = np.array(sorted(sizes), float)
    slope, overhead = np.polyfit(b, [sizes[int(x)] for x in b], 1)
    assert slope == pytest.approx(PADDED / 8, rel=0.01)
    assert 0 < overhead < 0.05 * sizes[12]
    assert sizes[24] / sizes[12] == pytest.approx(2.0, rel=0.05)
