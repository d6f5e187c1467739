"""``secure-aggregation = "secagg+ddg"``: the distributed discrete Gaussian inside privet's secure sums.

Runs the real ClientApp (its secure-sum mod, the DDG mechanism with the exact sampler) and the
real strategy on the in-process grid. What is checked, each against something computed apart:

- the released sum decodes to the sum of the clients' clipped updates plus noise whose variance is
  the one the parameters predict (r·σ²/s² per coordinate), and the server held only uniform vectors;
- every client's ε (and the server's recomputation) equals Kairouz, Liu & Steinke's bound written
  out here from the paper's formulas and converted by dp_accounting, with r_min shares;
- a server that lowers r_min in the sum's setup does not lower what a client charges (r_min =
  max(server's, the site's min-sum-size)), and one that changes the discrete Gaussian's numbers is
  refused by every member.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message
from scipy import stats

import client.secure_sum as client_sum
import privacy.mechanisms.ddg as ddg_mechanism
import strategies.secure_rounds as rounds_module
from client.app import app as client_app
from client.ledger_store import STATE_KEY
from privacy.accountants import RDP_ORDERS
from privacy.distributed_discrete_gaussian import ddg_parameters
from privacy.ledger import PrivacyLedger
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys
from server.app import run_experiment
from server.config import ConfigError, RunConfig
from strategies.secagg_config import DEFAULT_BETA

SIGMA, CLIENTS, BITS, DIM = 4.0, 5, 16, 7850  # logreg on Fashion-MNIST: 784·10 + 10 parameters


def _config(run_config_factory: Any, **overrides: Any) -> dict[str, Any]:
    cfg = run_config_factory(strategy="udp-fedavg", num_clients=CLIENTS, noise_multiplier=SIGMA,
                             noise_shares=CLIENTS, epsilon_min=20, epsilon_max=30, secure_aggregation="secagg+ddg",
                             accountant="rdp", min_train_clients=CLIENTS, num_server_rounds=1,
                             **{"secagg.bits": BITS})
    cfg.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return cfg


def _kls_epsilon(sigma_sq: float, norm_bound_sq: int, padded: int, n_min: int, n_max: int, rounds: int,
                 delta: float) -> float:
    """KLS 2021 eq. (17) for replace-one (Δ₂ = 2B, Δ₁ = 2·min(√d'·B, B²)), T-fold, dp_accounting's conversion.

    Written out here from the paper, apart from privet's implementation.
    """
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    b = math.sqrt(norm_bound_sq)
    l2, l1 = 2 * b, 2 * min(math.sqrt(padded) * b, norm_bound_sq)
    tau = 10 * sum(math.exp(-2 * math.pi**2 * sigma_sq * k / (k + 1)) for k in range(1, n_max))
    rdp = []
    for alpha in RDP_ORDERS:
        first = alpha * l2**2 / (2 * n_min * sigma_sq) + tau * padded
        second = alpha / 2 * (l2**2 / (n_min * sigma_sq) + 2 * l1 * tau / math.sqrt(n_min * sigma_sq)
                              + tau**2 * padded)
        third = alpha / 2 * (l2 / math.sqrt(n_min * sigma_sq) + tau * math.sqrt(padded)) ** 2
        rdp.append(rounds * min(first, second, third))
    return float(compute_epsilon(list(RDP_ORDERS), rdp, delta)[0])


class Probe:
    """Each client's update as the mechanism got it, the masked vectors the server got, the sums it released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.updates: list[np.ndarray] = []
        self.inputs: list[np.ndarray] = []
        self.sums: list[Any] = []
        real_encode, real_release, real_input = ddg_mechanism.encode, rounds_module.release_sums, client_sum._ddg_input

        def encode(update, params, seed, source):
            self.updates.append(np.asarray(update, np.float64).copy())
            return real_encode(update, params, seed, source)

        def ddg_input(params, content):
            out = real_input(params, content)
            self.inputs.append(out[0].copy())
            return out

        def release(*args, **kwargs):
            results = real_release(*args, **kwargs)
            self.sums.extend(results)
            return results

        monkeypatch.setattr(ddg_mechanism, "encode", encode)
        monkeypatch.setattr(client_sum, "_ddg_input", ddg_input)
        monkeypatch.setattr(rounds_module, "release_sums", release)

    def run(self, cfg: dict[str, Any], grid: InProcessGrid | None = None) -> tuple[dict[str, Any], InProcessGrid]:
        grid = grid or InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg)
        try:
            return run_experiment(grid, cfg, run_id=1), grid
        except RuntimeError:  # every round failed: what the summary says is the result
            return json.loads((Path(cfg["out-dir"]) / "summary.json").read_text()), grid


def _clipped(update: np.ndarray, clip: float = 1.0) -> np.ndarray:
    norm = float(np.linalg.norm(update))
    return update * min(1.0, clip / norm)


def test_the_released_sum_is_the_clipped_updates_plus_noise_of_the_predicted_variance(run_config_factory,
                                                                                       monkeypatch):
    probe = Probe(monkeypatch)
    cfg = _config(run_config_factory)
    summary, _ = probe.run(cfg)
    assert summary["rounds_completed"] == 1 and not summary["failed_rounds"]
    (result,) = probe.sums
    assert len(result.survivors) == CLIENTS and len(probe.updates) == CLIENTS
    released = np.concatenate([a.ravel() for a in result.total])
    signal = sum(_clipped(u) for u in probe.updates)
    residual = released - signal
    params = ddg_parameters(clip=1.0, dim=DIM, bits=BITS, noise_multiplier=SIGMA, noise_shares=CLIENTS,
                            max_members=CLIENTS, beta=DEFAULT_BETA)
    # r shares of N_Z(0, σ²) per rotated coordinate (variance σ² to within e^{-2π²σ²}), rotated back
    # (orthogonal) and divided by s; rounding adds at most r/4 per coordinate, 2e-7 of it here
    predicted = CLIENTS * float(params.local_sigma_sq) / params.scale**2
    assert predicted == pytest.approx(SIGMA**2, rel=1e-3)  # the continuous secure sum's σ²C², as built
    ratio = float(np.mean(residual**2)) / predicted
    assert abs(ratio - 1.0) < 6 * math.sqrt(2.0 / DIM)  # χ²_d/d: six standard deviations
    assert abs(float(np.mean(residual))) < 6 * math.sqrt(predicted / DIM)
    # the noise is not the signal: their correlation is that of independent vectors
    assert abs(float(np.corrcoef(residual, signal)[0, 1])) < 6 / math.sqrt(DIM)
    row = json.loads((Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()[1])["secure_sums"][0]
    assert row["mode"] == "secagg+ddg" and row["modulus_bits"] == BITS
    assert row["wrap_probability"] == pytest.approx(params.wrap_probability) and row["wrap_probability"] <= 1e-6
    assert row["local_sigma_sq"] == float(params.local_sigma_sq)


def test_the_server_holds_uniform_vectors_whose_unmasked_sum_is_the_inputs_sum(run_config_factory, monkeypatch):
    from protocol.bitpack import unpack

    probe = Probe(monkeypatch)
    replies: list[tuple[int, str, Message]] = []

    def hook(node: int, request: Message, reply: Message) -> Message:
        record = request.content.config_records.get(keys.SECAGG_RECORD)
        replies.append((node, str(record.get(keys.SECAGG_STAGE, "")) if record is not None else "", reply))
        return reply

    cfg = _config(run_config_factory)
    grid = InProcessGrid(client_app, simulation_node_configs(CLIENTS), cfg, reply_hook=hook)
    probe.run(cfg, grid)
    payloads = [r.content.config_records[keys.SECAGG_RECORD][keys.SECAGG_MASKED]
                for _, stage, r in replies if stage == keys.STAGE_COLLECT and not r.has_error()]
    assert all(isinstance(p, bytes) and len(p) == 8192 * BITS // 8 for p in payloads)  # b bits a coordinate
    masked = [unpack(p, 8192, BITS).astype(np.int64) for p in payloads]
    modulus = 1 << BITS
    assert len(masked) == CLIENTS
    for vector, own in zip(masked, probe.inputs, strict=True):
        assert stats.kstest(vector / modulus, "uniform").pvalue > 1e-4
        assert stats.kstest(own / modulus, "uniform").pvalue < 1e-10  # the test has power
    # the masks cancel: the server's lifted sum is Σ inputs mod 2^b, exactly
    (result,) = probe.sums
    total = np.mod(sum(probe.inputs), modulus)
    from privacy.distributed_discrete_gaussian import decode

    params = ddg_parameters(clip=1.0, dim=DIM, bits=BITS, noise_multiplier=SIGMA, noise_shares=CLIENTS,
                            max_members=CLIENTS, beta=DEFAULT_BETA)
    released = np.concatenate([a.ravel() for a in result.total])
    # the rotation seed is the members' own; recover it as the one that decodes Σ inputs to the release
    seeds = {bytes(m.rotation_seed) for m in _member_states(grid)}
    assert len(seeds) == 1
    np.testing.assert_allclose(decode(total, params, seeds.pop()), released, rtol=0, atol=1e-9)


def _member_states(grid: InProcessGrid) -> list[Any]:
    return [client_sum.MemberState.from_record(context.state.config_records[client_sum.STATE])
            for context in grid.contexts.values()]


def test_each_clients_epsilon_is_kls_bound_with_r_min_shares(run_config_factory, monkeypatch):
    probe = Probe(monkeypatch)
    cfg = _config(run_config_factory, num_server_rounds=2, **{"secagg.min-survivors": 3})
    summary, _ = probe.run(cfg)
    params = ddg_parameters(clip=1.0, dim=DIM, bits=BITS, noise_multiplier=SIGMA, noise_shares=CLIENTS,
                            max_members=CLIENTS, beta=DEFAULT_BETA)
    reference = _kls_epsilon(float(params.local_sigma_sq), params.norm_bound_sq, params.padded_dim, 3, CLIENTS,
                             2, 1e-5)
    assert 0.5 < reference < 20
    for c in summary["clients"]:
        assert c["epsilon_spent"] == pytest.approx(reference, rel=1e-9)
        assert c["epsilon_server_recomputed_this_run"] == pytest.approx(reference, rel=1e-9)
        assert "discrete Gaussian" in c["guarantee"] and "at least 3 clients" in c["guarantee"]
    report = (Path(cfg["out-dir"]) / "privacy_report.md").read_text()
    assert "floating-point attacks on the sampler do not apply" in report
    assert "the quantisation before the sum is outside the accounting" not in report
    assert "wraps around mod 2^16 with probability <= 1e-06" in report


def _tamper_setup(**entries: Any):
    from tests.attacks.deviating_server import stage_of

    def tamper(node: int, msg: Message) -> Message:
        if stage_of(msg) == keys.STAGE_SETUP:
            record = dict(msg.content.config_records[keys.SECAGG_RECORD])
            record.update({f"param/{k}": v for k, v in entries.items()})
            msg.content.config_records[keys.SECAGG_RECORD] = ConfigRecord(record)
        return msg

    return tamper


def test_a_server_that_lowers_r_min_does_not_lower_the_charge(run_config_factory, monkeypatch):
    """The server asks for r_min = 4 in its config but sends r_min = 1 in the sum's setup; each client
    takes max(1, its site's min-sum-size = 2) and charges two shares' worth: more than the server's
    own recomputation with 4 (so its reply is accepted), never the single share the setup claimed."""
    from tests.attacks.deviating_server import DeviatingGrid, Loot

    probe = Probe(monkeypatch)
    cfg = _config(run_config_factory, num_clients=4, noise_shares=4, min_train_clients=4,
                  **{"secagg.min-survivors": 4})
    grid = DeviatingGrid(client_app, simulation_node_configs(4), cfg, tamper=_tamper_setup(min_survivors=1),
                         loot=Loot())
    summary, _ = probe.run(cfg, grid)
    params = ddg_parameters(clip=1.0, dim=DIM, bits=BITS, noise_multiplier=SIGMA, noise_shares=4, max_members=4,
                            beta=DEFAULT_BETA)
    charged = {n: _kls_epsilon(float(params.local_sigma_sq), params.norm_bound_sq, params.padded_dim, n, 4, 1, 1e-5)
               for n in (1, 2, 4)}
    assert charged[1] > charged[2] > charged[4]
    for context in grid.contexts.values():
        ledger = PrivacyLedger.from_json(str(context.state[STATE_KEY]["json"]))
        assert ledger.conversion() == "rdp" and ledger.modes == ["secure-ddg"]
        assert ledger.spent() == pytest.approx(charged[2], rel=1e-9)
    for c in summary["clients"]:
        assert c["epsilon_spent"] == pytest.approx(charged[2], rel=1e-9)
        assert c["epsilon_server_recomputed_this_run"] == pytest.approx(charged[4], rel=1e-9)


@pytest.mark.parametrize("entries, what", [({"local_sigma_sq": "1000/1"}, "sigma^2"),
                                           ({"scale": 10.0}, "scale"),
                                           ({"norm_bound_sq": 10}, "B^2")])
def test_members_refuse_a_discrete_gaussian_other_than_their_inputs_give(run_config_factory, monkeypatch, entries,
                                                                          what):
    """A server that shrinks every member's noise (or changes the scale or bound) in the setup is refused at once:
    nothing trained, nothing charged."""
    from tests.attacks.deviating_server import DeviatingGrid, Loot

    probe = Probe(monkeypatch)
    cfg = _config(run_config_factory)
    loot = Loot()
    grid = DeviatingGrid(client_app, simulation_node_configs(CLIENTS), cfg, tamper=_tamper_setup(**entries),
                         loot=loot)
    summary, _ = probe.run(cfg, grid)
    refused = [why for _, stage, why in loot.refusals if stage == keys.STAGE_SETUP]
    assert len(refused) == CLIENTS and all(what in why and "discrete Gaussian" in why for why in refused)
    assert not probe.updates and all(c["epsilon_spent"] == 0 for c in summary["clients"])


@pytest.mark.parametrize("overrides, key", [
    ({"accountant": "prv"}, "accountant"),
    ({"secagg.bits": 33}, "secagg.bits"),
    ({"secagg.beta": 1.0}, "secagg.beta"),
    ({"secagg.wrap-probability": 0.0}, "secagg.wrap-probability"),
    ({"secure-aggregation": "secagg+", "secagg.bits": 31}, "secagg.bits"),
])
def test_bad_ddg_config_names_the_key(run_config_factory, overrides, key):
    cfg = _config(run_config_factory)
    cfg.update(overrides)
    with pytest.raises(ConfigError, match=key):
        RunConfig.from_flower(cfg)


def test_too_few_bits_leave_a_sum_unopened_naming_the_key():
    """8 bits cannot hold a sum of 300 members at the wrap-around target: the sum is abandoned with the knob named."""
    from strategies.secagg_config import SecureAggregation
    from strategies.secure_rounds import SecureRounds, SumMechanism

    rounds = SecureRounds(SecureAggregation(bits=8).for_mode("secagg+ddg"), timeout=1.0, ttl=None)
    mechanism = SumMechanism(clip=1.0, noise_multiplier=1.0, shares=300, min_survivors=300)
    params, why = rounds.parameters("sum", 300, mechanism, DIM)
    assert "secagg.bits = 8" in why and "raise bits" in why
    _, fine = rounds.parameters("sum", 5, SumMechanism(1.0, 1.0, 5, 5), DIM)
    assert fine == ""


def test_eight_bits_leave_too_little_noise_and_every_client_refuses_uncharged(run_config_factory, monkeypatch):
    """At 8 bits the rounding's norm inflation (B ≈ 10·s·C) makes the charge exceed every budget: refused first."""
    probe = Probe(monkeypatch)
    summary, _ = probe.run(_config(run_config_factory, **{"secagg.bits": 8}))
    assert summary["failed_rounds"] and not probe.updates
    assert all(c["epsilon_spent"] == 0 and c["rejections"][0]["reason"].startswith(keys.BUDGET_EXHAUSTED)
               for c in summary["clients"])


def test_sigma_equivalence_is_exact_for_large_noise():
    """For σ² >= 4 the charge is the Gaussian's √n·σ/B at sensitivity 2B (τ vanishes)."""
    from privacy.ddg_accounting import gaussian_equivalent_multiplier

    sigma_sq, bound_sq = Fraction(4_563_048), 1_429_238
    got = gaussian_equivalent_multiplier(local_sigma_sq=sigma_sq, norm_bound_sq=bound_sq, padded_dim=8192,
                                         min_shares=3, max_shares=5)
    assert got == pytest.approx(math.sqrt(3 * float(sigma_sq) / bound_sq), rel=1e-12)
