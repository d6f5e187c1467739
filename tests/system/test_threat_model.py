"""Attacks an honest-but-curious server could mount, and why each fails.

Every test drives the real ClientApp (and, where a run is needed, the real ServerApp logic
on the in-process Grid). The attacks are the audit's: regenerate a client's noise from what
the server knows, use local evaluation as a free oracle, claim figures the server does not
check, read un-noised training metrics, and race two runs against one ledger.
"""

from __future__ import annotations

import math
import multiprocessing as mp

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client.app import app as client_app
from client.seeds import client_seed
from privacy.accountants import epsilon_of
from privacy.calibration import noise_multiplier_for
from privacy.ledger import PrivacyLedger
from privacy.mechanisms import l2_norm
from privacy.randomness import SeededNoise
from privet.inprocess import FIRST_NODE_ID, InProcessGrid, simulation_node_configs
from protocol import keys
from server.config import RunConfig
from server.registry import train_config
from tasks.datasets import load_dataset
from tasks.models import build_model, get_weights, weight_names

CLIP = 1.0


def _global_arrays(cfg: dict) -> ArrayRecord:
    splits = load_dataset(cfg["dataset"], cfg["data-dir"] or None)
    model = build_model(cfg["model"], input_shape=tuple(splits.train.x.shape[1:]),
                        num_classes=splits.train.num_classes, seed=0)
    return ArrayRecord({n: Array(np.asarray(w)) for n, w in zip(weight_names(model), get_weights(model), strict=True)})


def _context(cfg: dict, node_config: dict | None = None, node_id: int = FIRST_NODE_ID) -> Context:
    return Context(run_id=7, node_id=node_id, node_config=node_config or {"partition-id": 0, "num-partitions": 3},
                   state=RecordDict(), run_config=dict(cfg))


def _message(cfg: dict, arrays: ArrayRecord, message_type: str = MessageType.TRAIN, server_round: int = 1) -> Message:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0  # as a ServerApp would have
    record = train_config(RunConfig.from_flower(cfg))
    record[keys.SERVER_ROUND] = server_round
    return Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: record}), dst_node_id=FIRST_NODE_ID,
                   message_type=message_type)


def _upload(reply: Message) -> list[np.ndarray]:
    assert not reply.has_error(), reply.error.reason
    return reply.content[keys.ARRAYS].to_numpy_ndarrays()


def _update_mode(run_config_factory, **kw) -> dict:
    return run_config_factory(**{"strategy": "udp-fedavg", "budget_distribution": "constant", "epsilon": 50.0,
                                 "noise_multiplier": 2.0, "clip": CLIP, **kw})


# ------------------------------------------------------------------ 1. private noise
def test_the_server_cannot_regenerate_update_mode_noise(run_config_factory):
    """The old attack: the noise came from SeedSequence([run seed, partition id, round]),
    all known to the server. It now comes from a CSPRNG keyed with OS entropy: the same
    seed-based regeneration leaves the whole noise in place (residual norm ≫ C)."""
    cfg = _update_mode(run_config_factory)
    arrays = _global_arrays(cfg)
    upload = _upload(client_app(_message(cfg, arrays), _context(cfg)))
    delta = [u - g for u, g in zip(upload, arrays.to_numpy_ndarrays(), strict=True)]
    seed = client_seed(cfg["seed"], 0, 1)
    old_guess = np.random.default_rng(seed)
    std = 2.0 * CLIP
    for guess in (old_guess, SeededNoise(seed)):  # the audit's regeneration, and today's seeded stream
        residual = [d - (guess.standard_normal(d.shape) * std if isinstance(guess, np.random.Generator)
                         else guess.normal(d.shape, std)).astype(d.dtype) for d in delta]
        assert l2_norm(residual) > 10 * CLIP  # the clipped update (norm <= C) is not recovered


def test_seeded_noise_is_regenerable_and_says_so(run_config_factory):
    """``noise-source = seeded`` (an explicit experiment option) *is* breakable by whoever
    knows the run seed: the attack recovers the clipped update exactly. The summary says so."""
    cfg = _update_mode(run_config_factory, noise_source="seeded")
    arrays = _global_arrays(cfg)
    upload = _upload(client_app(_message(cfg, arrays), _context(cfg)))
    delta = [u - g for u, g in zip(upload, arrays.to_numpy_ndarrays(), strict=True)]
    noise = SeededNoise(client_seed(cfg["seed"], 0, 1))
    recovered = [d - noise.normal(d.shape, 2.0 * CLIP).astype(d.dtype) for d in delta]
    assert l2_norm(recovered) <= CLIP * (1 + 1e-3)
    summary = _run(dict(cfg, **{"num-server-rounds": 1}))
    assert all(c["noise_source"] == "seeded" and "no one who knows the run seed" in c["guarantee"]
               for c in summary["clients"])
    assert all(any("regenerable" in w for w in c["not_covered"]) for c in summary["clients"])


@pytest.mark.parametrize("mode", ["update", "dpsgd"])
def test_identical_requests_give_independent_noise(run_config_factory, mode):
    """Everything the server controls held fixed (message, run, node, round): two replies
    differ, so nothing the server sends determines the DP randomness (noise and sampling)."""
    cfg = _update_mode(run_config_factory, dp_mode=mode) if mode == "update" else run_config_factory(
        budget_distribution="constant", epsilon=50.0, noise_multiplier=1.0)
    arrays = _global_arrays(cfg)
    first = _upload(client_app(_message(cfg, arrays), _context(cfg)))
    second = _upload(client_app(_message(cfg, arrays), _context(cfg)))
    assert not all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


# ------------------------------------------------------------------ 3. no free oracle
def _evaluate(cfg: dict, context: Context) -> Message:
    return client_app(_message(cfg, _global_arrays(cfg), MessageType.EVALUATE), context)


def test_evaluation_is_refused_unless_the_operator_allows_it(run_config_factory):
    cfg = run_config_factory()
    reply = _evaluate(cfg, _context(cfg))
    assert reply.has_error() and keys.EVALUATION_REFUSED in reply.error.reason
    # simulation: the experimenter is every client's operator
    allowed = dict(cfg, **{"client-evaluation": "on"})
    assert not _evaluate(allowed, _context(allowed)).has_error()
    # deployment: the server's run config cannot switch it on; the node config can
    deployed = {"partition-id": 0, "num-partitions": 3, "epsilon": 5.0}
    assert _evaluate(allowed, _context(allowed, deployed)).has_error()
    assert not _evaluate(cfg, _context(cfg, {**deployed, "allow-evaluation": True})).has_error()


def test_an_exhausted_client_answers_no_evaluation(run_config_factory):
    cfg = run_config_factory(**{"client-evaluation": "on"})
    context = _context(cfg)
    ledger = PrivacyLedger(epsilon_budget=1.0, delta=1e-5)
    sigma = noise_multiplier_for(1.0, 1e-5, 1.0, 1, accountant=ledger.accountant, tolerance=1e-4)
    ledger.record(sigma, 1.0, 1, server_round=1, run_id=7, mode="update")  # all of eps = 1
    from client.ledger_store import STATE_KEY
    context.state[STATE_KEY] = ConfigRecord({"json": ledger.to_json()})
    reply = _evaluate(cfg, context)
    assert reply.has_error() and keys.BUDGET_EXHAUSTED in reply.error.reason


# ------------------------------------------------------------------ 5. what replies carry
ALWAYS_SENT = {keys.NUM_EXAMPLES, keys.EPSILON_BUDGET, keys.EPSILON_SPENT, keys.EPSILON_ROUND, keys.DELTA,
               keys.NOISE_MULTIPLIER, keys.SAMPLE_RATE, keys.CLIP, keys.LOCAL_STEPS}


@pytest.mark.parametrize("mode", ["update", "dpsgd"])
def test_replies_carry_no_uncovered_metric_unless_opted_in(run_config_factory, mode):
    cfg = _update_mode(run_config_factory, dp_mode=mode)
    arrays = _global_arrays(cfg)
    reply = client_app(_message(cfg, arrays), _context(cfg))
    assert set(reply.content[keys.METRICS]) <= ALWAYS_SENT
    opted = dict(cfg, **{"report-train-metrics": True})
    reply = client_app(_message(opted, arrays), _context(opted))
    assert keys.TRAIN_LOSS in reply.content[keys.METRICS]
    assert reply.content[keys.META][keys.TRAIN_METRICS] == "on"


# ------------------------------------------------------------------ 4. the server verifies
def _run(cfg, hook=None, node_configs=None):
    from server.app import run_experiment

    grid = InProcessGrid(client_app, node_configs or simulation_node_configs(cfg["num-clients"]), cfg,
                         run_id=1, reply_hook=hook)
    return run_experiment(grid, cfg, run_id=1)


def _lie(field, value):
    def hook(node, request, reply):
        if node != FIRST_NODE_ID or request.metadata.message_type != "train" or reply.has_error():
            return reply
        metrics = dict(reply.content[keys.METRICS])
        if value is None:
            metrics.pop(field)
        else:
            metrics[field] = value
        from flwr.app import MetricRecord

        content = RecordDict({keys.ARRAYS: reply.content[keys.ARRAYS], keys.METRICS: MetricRecord(metrics),
                              keys.META: reply.content[keys.META]})
        return Message(content, reply_to=request)

    return hook


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        (keys.NUM_EXAMPLES, 10**9, "contradicts the handshake"),  # would make FedAvg its own model
        (keys.NUM_EXAMPLES, math.inf, "positive integer"),
        (keys.LOCAL_STEPS, None, "missing metric 'local-steps'"),
        (keys.LOCAL_STEPS, -3, "not an integer"),
        (keys.NOISE_MULTIPLIER, math.nan, "is NaN"),
        (keys.NOISE_MULTIPLIER, 1000.0, "differs from the 1 the server set"),
        (keys.SAMPLE_RATE, 1e-6, "differs from the"),
        (keys.EPSILON_SPENT, 1e-6, "below the"),  # a claimed eps far below what sigma, q, steps imply
    ],
)
def test_a_lying_reply_is_rejected_and_the_run_writes_its_report(run_config_factory, tmp_path, field, value, reason):
    cfg = run_config_factory(num_server_rounds=1, budget_distribution="constant", epsilon=50.0,
                             noise_multiplier=1.0)
    summary = _run(cfg, hook=_lie(field, value))
    liar = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert liar["rounds_joined"] == [] and reason in liar["rejections"][0]["reason"], liar["rejections"]
    assert all(c["rounds_joined"] == [1] for c in summary["clients"] if c["client_id"] != "0")
    assert (tmp_path / "results" / "privacy_report.md").exists() and summary["status"] == "completed"


def test_the_report_states_each_guarantee(run_config_factory, tmp_path):
    summary = _run(_update_mode(run_config_factory, num_server_rounds=1))
    for c in summary["clients"]:
        assert c["relation"] == "replace-one" and c["guarantee_unit"] == "client"
        assert "whole dataset (client-level) under replace-one" in c["guarantee"]
    report = (tmp_path / "results" / "privacy_report.md").read_text()
    assert "Not covered by any client's epsilon" in report and "replace-one" in report


# ------------------------------------------------------------------ 6. one writer per ledger
def _train_many(args) -> list[bool]:
    cfg, ledger_path, rounds, worker = args
    node = {"partition-id": 0, "num-partitions": 3, "epsilon": 6.0, "ledger-path": ledger_path}
    arrays = _global_arrays(cfg)
    released = []
    for r in range(1, rounds + 1):
        context = Context(run_id=100 + worker, node_id=FIRST_NODE_ID, node_config=node, state=RecordDict(),
                          run_config=dict(cfg))
        reply = client_app(_message(cfg, arrays, server_round=r), context)
        released.append(not reply.has_error())
    return released


def test_concurrent_runs_on_one_ledger_never_release_an_uncharged_model(run_config_factory, tmp_path):
    """Two processes (two runs served by the same node) train against one ledger file. The
    ledger must hold exactly one charge per released model, and stay within its budget."""
    cfg = _update_mode(run_config_factory, noise_multiplier=3.0)
    path = str(tmp_path / "ledger.json")
    with mp.get_context("spawn").Pool(2) as pool:  # fork would inherit torch's thread pools
        outcomes = pool.map(_train_many, [(cfg, path, 4, w) for w in range(2)])
    released = sum(sum(o) for o in outcomes)
    ledger = PrivacyLedger.load(path)
    charge = 3.0  # update mode: one (sigma, 1, 1) per release
    assert released >= 1 and len(ledger.rounds) == released
    assert ledger.history == [(charge, 1.0, released)]
    assert ledger.spent() == epsilon_of([(charge, 1.0, released)], 1e-5, "prv") <= 6.0 * (1 + 1e-9)
    assert not all(all(o) for o in outcomes)  # the budget ran out: some requests were refused
