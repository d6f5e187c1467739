"""Secure aggregation: the server learns sums only, dropouts, the release floor, the charge.

Runs the real ClientApp (with its secure-sum mod) and the real strategies on the in-process
grid, and instruments both sides: the client's quantised inputs, every reply the server
receives, and every sum it unmasks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message
from scipy import stats

import client.secure_sum as client_sum
import strategies.secure_rounds as base
from client.app import app as client_app
from privacy.secure_sum import add_mod, charged_multiplier, mask, quantisation_for
from privet.inprocess import FIRST_NODE_ID, InProcessGrid, simulation_node_configs
from protocol import keys
from server.app import run_experiment
from server.config import ConfigError, RunConfig

SIGMA = 4.0


def _config(run_config_factory, clients: int = 5, **overrides):
    cfg = run_config_factory(strategy="udp-fedavg", num_clients=clients, noise_multiplier=SIGMA,
                             noise_shares=clients, epsilon_min=20, epsilon_max=30, secure_aggregation="secagg+",
                             min_train_clients=clients, num_server_rounds=1)
    cfg.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return cfg


class Probe:
    """What each side really held: client-side quantised inputs, server-side replies and sums."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, drop_stage: str = "", drop_nodes: int = 0) -> None:
        self.quantised: dict[int, list[np.ndarray]] = {}
        self.replies: list[tuple[int, str, Message]] = []
        self.sums: list = []
        self.drop_stage, self.drop_nodes, self.dropped = drop_stage, drop_nodes, set()
        self._node = 0
        real_quantize, real_release = client_sum.quantize, base.release_sums

        def quantize(params, clipping_range, target_range):
            out = real_quantize(params, clipping_range, target_range)
            self.quantised[self._node] = [np.asarray(a, np.int64) for a in out]
            return out

        def release(*args, **kwargs):
            results = real_release(*args, **kwargs)
            self.sums.extend(results)
            return results

        monkeypatch.setattr(client_sum, "quantize", quantize)
        monkeypatch.setattr(base, "release_sums", release)

    def hook(self, node: int, request: Message, reply: Message) -> Message | None:
        self._node = node
        stage = ""
        if keys.SECAGG_RECORD in request.content.config_records:
            stage = str(request.content.config_records[keys.SECAGG_RECORD].get(keys.SECAGG_STAGE, ""))
        if stage == self.drop_stage and (node in self.dropped or len(self.dropped) < self.drop_nodes):
            self.dropped.add(node)
            return None  # the node vanished: no reply
        self.replies.append((node, stage, reply))
        return reply

    def run(self, cfg, expect_failure: bool = False) -> dict:
        # the hook runs after the app call; quantize() runs inside it, so record the node first
        grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg, reply_hook=self.hook)
        real_call = grid._call

        def call(msg):
            self._node = msg.metadata.dst_node_id
            return real_call(msg)

        grid._call = call  # type: ignore[method-assign]
        if expect_failure:
            with pytest.raises(RuntimeError, match="incomplete"):
                run_experiment(grid, cfg, run_id=1)
            return json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
        return run_experiment(grid, cfg, run_id=1)


def _masked_vectors(probe: Probe, modulus: int) -> dict[int, np.ndarray]:
    """Each member's masked vector as the server received it: log₂ M bits a coordinate, ⌈D·log₂ M/8⌉ bytes."""
    from protocol.bitpack import unpack

    width, out = modulus.bit_length() - 1, {}
    for node, stage, reply in probe.replies:
        if stage == keys.STAGE_COLLECT and not reply.has_error():
            raw = reply.content.config_records[keys.SECAGG_RECORD][keys.SECAGG_MASKED]
            count = sum(a.size for a in probe.quantised[node])
            assert isinstance(raw, bytes) and len(raw) == math.ceil(count * width / 8)
            out[node] = unpack(raw, count, width).astype(np.int64)
    return out


def _dequantised_sum(probe: Probe, nodes, q) -> np.ndarray:
    total = sum(np.concatenate([a.ravel() for a in probe.quantised[n]]).astype(np.float64) for n in nodes)
    return total * q.step - len(nodes) * q.clipping_range


def test_server_sees_uniform_masked_vectors_and_unmasks_exactly_the_sum(run_config_factory, monkeypatch):
    probe = Probe(monkeypatch)
    cfg = _config(run_config_factory)
    summary = probe.run(cfg)
    modulus = 1 << (5 * (2**24 - 1)).bit_length()  # M = 2^27 here: 27 bits a coordinate on the wire
    masked = _masked_vectors(probe, modulus)
    assert len(masked) == 5 and len(probe.sums) == 1 and probe.sums[0].total is not None
    for node, vector in masked.items():
        # what the server held of each client is uniform on [0, M): KS test against U(0, M)
        assert stats.kstest(vector / modulus, "uniform").pvalue > 1e-4
        # while the client's own quantised input is not (the test has power)
        own = np.concatenate([a.ravel() for a in probe.quantised[node]])
        assert stats.kstest(own / modulus, "uniform").pvalue < 1e-10
    # the unmasked result is the plaintext sum of the quantised inputs
    result = probe.sums[0]
    q = quantisation_for(1.0, SIGMA / math.sqrt(5), sum(a.size for a in result.total), 5, 24)
    expected = _dequantised_sum(probe, result.survivors, q)
    got = np.concatenate([a.ravel() for a in result.total])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * q.clipping_range * 5)
    assert summary["rounds_completed"] == 1 and not summary["failed_rounds"]
    assert summary["secure_aggregation"]["trust_model"].startswith("the server sees only sums")


def test_a_client_dropping_after_sharing_keys_leaves_the_sum_of_the_survivors(run_config_factory, monkeypatch):
    probe = Probe(monkeypatch, drop_stage=keys.STAGE_COLLECT, drop_nodes=1)
    cfg = _config(run_config_factory, **{"secagg.min-survivors": 4})
    summary = probe.run(cfg)
    (result,) = probe.sums
    assert len(result.survivors) == 4 and probe.dropped.isdisjoint(result.survivors)
    q = quantisation_for(1.0, SIGMA / math.sqrt(5), sum(a.size for a in result.total), 5, 24)
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in result.total]),
                               _dequantised_sum(probe, result.survivors, q), rtol=0, atol=1e-8)
    assert summary["rounds_completed"] == 1 and not summary["failed_rounds"]


def test_below_the_floor_nothing_is_released_or_charged(run_config_factory, monkeypatch):
    probe = Probe(monkeypatch, drop_stage=keys.STAGE_SHARE_KEYS, drop_nodes=2)
    cfg = _config(run_config_factory, **{"secagg.min-survivors": 4})
    summary = probe.run(cfg, expect_failure=True)
    assert summary["failed_rounds"] and not probe.quantised  # no client quantised (or trained) anything
    assert all(c["epsilon_spent"] == 0 for c in summary["clients"])


def test_clients_refuse_to_unmask_a_sum_below_the_floor(run_config_factory, monkeypatch):
    """Two inputs lost after upload: the survivors were charged (they released a masked
    vector) but they send no unmasking shares, so the sum stays masked."""
    probe = Probe(monkeypatch, drop_stage=keys.STAGE_COLLECT, drop_nodes=2)
    monkeypatch.setattr(base, "release_sums", _unmask_anyway(probe))
    cfg = _config(run_config_factory, **{"secagg.min-survivors": 4})
    summary = probe.run(cfg, expect_failure=True)
    unmask_replies = [r for _, stage, r in probe.replies if stage == keys.STAGE_UNMASK]
    assert len(unmask_replies) == 3 and all(r.has_error() for r in unmask_replies)
    assert all("min-survivors) = 4" in r.error.reason for r in unmask_replies)
    assert probe.sums[0].total is None and summary["failed_rounds"]


def _unmask_anyway(probe: Probe):
    """A server that asks for unmasking shares even below r_min (the client must refuse)."""
    from strategies import secure_sum

    def release(grid, sums, inputs, shapes, roster, timeout, ttl):
        from dataclasses import replace

        for s in sums:
            s.params = replace(s.params, min_survivors=1)  # the server's own floor, lowered; the clients keep theirs
        results = secure_sum.release_sums(grid, sums, inputs, shapes, roster=roster, timeout=timeout, ttl=ttl)
        probe.sums.extend(results)
        return results

    return release


def test_epsilon_matches_dp_accounting_for_the_noise_the_server_observes(run_config_factory, monkeypatch):
    import dp_accounting
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import pld_privacy_accountant

    probe = Probe(monkeypatch)
    cfg = _config(run_config_factory, num_server_rounds=2, **{"secagg.min-survivors": 3})
    summary = probe.run(cfg)
    sigma = charged_multiplier(SIGMA, 5, 3)
    assert sigma == pytest.approx(SIGMA * math.sqrt(3 / 5))
    acct = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    acct.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), 2))
    reference = acct.get_epsilon(1e-5)
    for c in summary["clients"]:
        assert c["epsilon_spent"] == pytest.approx(reference, rel=2e-3)
        assert c["epsilon_server_recomputed_this_run"] == pytest.approx(reference, rel=2e-3)
        assert "secure sum (SecAgg+) of at least 3" in c["guarantee"]


def test_an_unclipped_update_makes_the_sum_fail_its_check(run_config_factory, monkeypatch):
    """Secure aggregation cannot stop a malicious client from sending more than a clipped
    update; the norm check on the unmasked sum catches it and the sum is not used."""
    probe = Probe(monkeypatch)
    real = client_sum.quantize

    def cheat(params, clipping_range, target_range):  # the first node: every coordinate at +c
        if probe._node == FIRST_NODE_ID:
            params = [np.full_like(p, clipping_range) for p in params]
        return real(params, clipping_range, target_range)

    monkeypatch.setattr(client_sum, "quantize", cheat)
    cfg = _config(run_config_factory)
    summary = probe.run(cfg, expect_failure=True)
    assert "no secure sum was released" in summary["failed_rounds"][0]["reason"]
    row = json.loads((Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()[1])
    assert "unclipped" in row["secure_sums"][0]["reason"] and not row["secure_sums"][0]["released"]


def test_a_masked_input_of_the_wrong_length_or_padding_is_unusable():
    from flwr.app import ConfigRecord, RecordDict
    from flwr.common import ndarray_to_bytes

    from protocol.secure_sum import pack_masked
    from strategies.secure_sum import masked_input

    def reply(payload):
        content = RecordDict({keys.SECAGG_RECORD: ConfigRecord({keys.SECAGG_MASKED: payload})})
        return Message(content, dst_node_id=1, message_type="train")

    modulus, shapes = 2**27, [(3,), (2, 2)]  # 7 coordinates of 27 bits: 189 bits, 24 bytes, 3 padding bits
    good = [np.array([0, 5, modulus - 1]), np.ones((2, 2), np.int64)]
    payload = pack_masked(good, modulus)
    parsed = masked_input(reply(payload), shapes, modulus)
    assert not isinstance(parsed, str) and parsed[0].dtype == np.int64 and parsed[0][2] == modulus - 1
    assert parsed[1].shape == (2, 2) and len(payload) == 24
    assert "not the 24" in masked_input(reply(payload[:-1]), shapes, modulus)
    assert "not the 24" in masked_input(reply(payload + b"\0"), shapes, modulus)
    assert "padding" in masked_input(reply(payload[:-1] + bytes([payload[-1] | 0x80])), shapes, modulus)
    old = [ndarray_to_bytes(a.astype(np.uint32)) for a in good]  # the unpacked list of arrays refused
    assert "byte string" in masked_input(reply(old), shapes, modulus)


def test_masks_are_uniform_distinct_and_cancel():
    shapes = [(1000,), (10, 10)]
    m = 1 << 40
    a, b = mask(b"a" * 32, m, shapes), mask(b"b" * 32, m, shapes)
    assert all(x.min() >= 0 and x.max() < m for x in a)
    assert not np.array_equal(a[0], b[0]) and np.array_equal(a[0], mask(b"a" * 32, m, shapes)[0])
    assert stats.kstest(a[0] / m, "uniform").pvalue > 1e-4
    x = [np.arange(1000) % m, np.ones((10, 10), np.int64)]
    back = add_mod(add_mod(x, a, m), a, m, -1)
    assert all(np.array_equal(u, v) for u, v in zip(back, x, strict=True))


@pytest.mark.parametrize("clients", [1, 10, 120, 10_000])
def test_quantisation_never_wraps(clients):
    q = quantisation_for(1.0, 0.5, 100_000, clients, 24)
    assert q.modulus & (q.modulus - 1) == 0 and clients * q.levels < q.modulus <= 2 * clients * q.levels + 2
    # the clipping range covers C plus z noise stds, z the two-sided quantile of p/(K·d)
    z = (q.clipping_range - 1.0) / 0.5
    assert 2 * stats.norm.sf(z) * clients * 100_000 == pytest.approx(q.clip_probability, rel=1e-3)


@pytest.mark.parametrize("overrides, key", [
    ({"strategy": "fedceo"}, "secure-aggregation"),
    ({"dp-mode": "dpsgd"}, "dp-mode"),
    ({"noise-multiplier": 0.0}, "noise-multiplier"),
    ({"secagg.min-survivors": 9}, "secagg.min-survivors"),
    ({"secure-aggregation": "secagg"}, "secure-aggregation"),
    ({"secagg.bits": 40}, "secagg.bits"),
])
def test_bad_secure_aggregation_config_names_the_key(run_config_factory, overrides, key):
    cfg = _config(run_config_factory)
    cfg.update(overrides)
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_flower(cfg)


def test_clients_refuse_a_secure_sum_with_per_client_calibrated_noise(run_config_factory, monkeypatch):
    """Each member counts on the others adding the same noise share; a server that skips the
    config check and lets every client calibrate its own σ gets refusals, nothing charged."""
    import server.config

    monkeypatch.setattr(server.config, "check_secure_aggregation", lambda *args: None)
    probe = Probe(monkeypatch)
    summary = probe.run(_config(run_config_factory, noise_multiplier=0.0), expect_failure=True)
    assert all(c["epsilon_spent"] == 0 and c["rejections"] for c in summary["clients"])
    assert all("common 'noise-multiplier'" in r["reason"] for c in summary["clients"] for r in c["rejections"])
