"""The privet ClientApp: budget handshake, local DP training, local evaluation.

Every handler answers with an error reply (never an exception) when it cannot or must
not do the work: a malformed node config, or a request that would take the client past
its privacy budget (reason prefixed ``budget-exhausted``).

What a client releases, and under which guarantee (the threat model: an
honest-but-curious server, and other clients):

* **train replies**: the model (covered by the ledger's ε, replace-one), the example
  count n (public by the relation: replace-one keeps n fixed), the budget, δ and ε spent,
  σ, q and the number of steps (functions of public figures only), the client id, DP mode
  and noise source. The training loss, time and pre-clip update norm are data-dependent
  and *not* covered: they are sent only where the operator opts in
  (``report-train-metrics``), and the report lists them as outside the guarantee.
* **handshake replies**: budget, δ, ε spent and n (public, as above).
* **evaluate replies**: a loss and an accuracy on private data, *not* covered by the
  ledger: answered only where the operator allows it (``allow-evaluation``; in simulation
  ``client-evaluation = "on"``), never once the budget is spent, and declared in the
  report as outside the guarantee.

All DP randomness comes from a source nobody else can reproduce
(:mod:`privacy.randomness`, ``csprng`` by default); ``seeded`` noise is accepted only where
the operator allows it, and the report says the guarantee then does not hold against
whoever knows the seed.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import (
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from client import group_dp
from client.allocator import tune_malloc
from client.ledger_store import LedgerBusy, ledger_lock, load_ledger, store_ledger
from client.profile import ClientProfile, resolve_profile
from client.secure_sum import secure_sum_mod, secure_survivors
from client.shard_cache import cached_shard, shard_key
from client.uploads import encode_upload
from client.personalization import dpsgd_workload, personalize_for_evaluation, train_personalized
from client.training import (
    LocalTrainingConfig,
    dpsgd_sample_rate,
    dpsgd_steps_per_round,
    train_dpsgd,
    train_non_private,
    train_update_dp,
)
from privacy.accountants import DEFAULT_ACCOUNTANT, Step
from privacy.calibration import noise_multiplier_for
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger
from privacy.policy import MIN_USABLE_FRACTION, is_spent
from privacy.randomness import NoiseSource, noise_source
from privacy.secure_sum import charged_multiplier
from strategies import keys
from strategies.log import route_privet_logs_to_flower
from tasks.datasets import ArrayDataset, is_loaded, load_dataset, source
from tasks.models import build_model, evaluate, get_weights, resolve_grad_sample_mode, set_weights
from tasks.partition import client_data

log = logging.getLogger("privet.client")
route_privet_logs_to_flower()

ERROR_CONFIG = 4001
ERROR_BUDGET = 4002
ERROR_INTERNAL = 4003
ERROR_BUSY = 4004
ERROR_REFUSED = 4005
ERROR_STALE = 4006
CALIBRATION_KEY = "privet.calibration"

app = ClientApp(mods=[secure_sum_mod])  # secure sums: client/secure_sum.py
tune_malloc()  # keep DP-SGD's per-step buffers in the heap (client/allocator.py)


def _error(msg: Message, code: int, reason: str) -> Message:
    log.warning("refusing %s: %s", msg.metadata.message_type, reason)
    return Message(Error(code=code, reason=reason), reply_to=msg)


def _stale(msg: Message) -> str | None:
    """Why a message must not be acted on: it outlived its time-to-live.

    The server sets a train message's TTL to its round timeout, so a message past it
    belongs to a round that is over (the node was stopped, its network stalled, or the run
    ended): training it would spend budget on a reply nobody reads. Checked before
    training and again just before charging the ledger (a process stopped mid-training).
    Assumes the node's clock is within seconds of the SuperLink's.
    """
    age = time.time() - float(msg.metadata.created_at)
    if age <= float(msg.metadata.ttl):
        return None
    return (f"{keys.STALE_MESSAGE}: message created {age:.0f}s ago, past its time-to-live of "
            f"{float(msg.metadata.ttl):g}s; the round is over, nothing trained or charged")


def _load_local_data(profile: ClientProfile, run_config: dict) -> tuple[ArrayDataset, int]:
    """This client's training shard (and the dataset's class count), via the node's shard cache."""
    dataset = str(run_config["dataset"])
    data_dir = profile.data_dir or str(run_config.get("data-dir", "")) or None
    partitioning = {
        "method": str(run_config["partitioner"]),
        "alpha": float(run_config["dirichlet-alpha"]),
        "shards_per_client": int(run_config["shards-per-client"]),
        "seed": int(run_config["seed"]),
        "max_examples": int(run_config["max-examples-per-client"]),
    }

    def build() -> tuple[ArrayDataset, int]:
        splits = load_dataset(dataset, data_dir)
        shard = client_data(splits, profile.partition_id, profile.num_partitions, **partitioning)
        return shard, splits.train.num_classes

    if is_loaded(dataset, data_dir):  # a long-lived process (simulation): memory beats disk
        shard, num_classes = build()
    else:
        name, folder = source(dataset, data_dir)
        key = shard_key(name, folder, partitioning, profile.partition_id, profile.num_partitions)
        shard, num_classes = cached_shard(profile.shard_cache, key, build)
    if profile.max_examples is not None and len(shard) > profile.max_examples:  # the operator's cap
        shard = ArrayDataset(shard.x[: profile.max_examples], shard.y[: profile.max_examples], shard.num_classes,
                             shard.name)
    return shard, num_classes


def _client_seed(run_seed: int, partition_id: int, server_round: int) -> int:
    """Per-(client, round) seed derived from the run's root seed.

    Seeds only what is *not* DP randomness (weight init, shuffling and dropout of plain
    local SGD), and the noise of ``noise-source = "seeded"``, which the reports declare
    void against whoever knows the run seed.
    """
    return int(np.random.SeedSequence([run_seed, partition_id, server_round]).generate_state(1)[0])


def _noise_for(profile: ClientProfile, seed: int) -> NoiseSource:
    """This client's DP randomness for one round (:mod:`privacy.randomness`)."""
    return noise_source(profile.noise_source, seed if profile.noise_source == "seeded" else None)


def _model_from(msg: Message, data: ArrayDataset, num_classes: int, run_config: dict) -> torch.nn.Module:
    model = build_model(
        str(run_config["model"]), input_shape=tuple(data.x.shape[1:]), num_classes=num_classes
    )
    set_weights(model, msg.content[keys.ARRAYS].to_numpy_ndarrays())
    return model


def _privacy_metrics(ledger: PrivacyLedger, before: float) -> dict[str, float]:
    spent = ledger.spent()
    return {
        keys.EPSILON_BUDGET: float(ledger.epsilon_budget),
        keys.EPSILON_SPENT: float(spent),
        keys.EPSILON_ROUND: float(spent - before) if math.isfinite(spent) else math.inf,
        keys.DELTA: float(ledger.delta),
    }


@dataclass(frozen=True)
class _Plan:
    """The mechanism one round will run, known before training so it can be checked."""

    noise_multiplier: float  # σ sent to the mechanism
    charged_multiplier: float  # σ the ledger charges (update mode: σ/√m, or σ·√(r_min/m) in a secure sum)
    sample_rate: float
    steps: int


def _plan_round(
    cfg: ConfigRecord,
    ledger: PrivacyLedger,
    context: Context,
    num_examples: int,
    min_survivors: int | None = None,
) -> _Plan:
    """Decide σ for this round: fixed from the server, or calibrated once per run.

    In ``update`` mode the ledger charges σ/√m for an upload the server sees on its own,
    and σ·√(r_min/m) for one that leaves only inside a secure sum of at least
    ``min_survivors`` = r_min inputs (:mod:`privacy.secure_sum`); a calibrated σ is the
    charged one scaled back to what the mechanism adds.

    Calibration (when the server sends ``noise-multiplier = 0``) finds the smallest σ for
    which the ledger's history *before this run* composed with ``num-rounds`` rounds of
    this client's mechanism stays within ``min(budget, spent_before + target-epsilon)``.
    Planning for every round of the run is conservative when the client is not sampled in
    all of them. The result is cached in ``context.state`` for the rest of the run.
    """
    mode = str(cfg[keys.DP_MODE])
    epochs = int(cfg[keys.LOCAL_EPOCHS])
    batch = int(cfg[keys.BATCH_SIZE])
    shares = int(cfg.get(keys.NOISE_SHARES, 1))
    if mode == keys.DP_NONE:
        return _Plan(0.0, 0.0, 1.0, 1)
    if mode == keys.DP_SGD:
        num_examples, epochs = dpsgd_workload(cfg, num_examples)
        rate = dpsgd_sample_rate(num_examples, batch)
        steps = dpsgd_steps_per_round(num_examples, batch, epochs)
    else:
        rate, steps = 1.0, 1
    # charged = scale · sent: 1 outside update mode, 1/√m per upload, √(r_min/m) in a secure sum
    scale = 1.0
    if mode == keys.DP_UPDATE:
        scale = charged_multiplier(1.0, shares, min_survivors) if min_survivors else 1.0 / math.sqrt(shares)
    fixed = float(cfg.get(keys.NOISE_MULTIPLIER, 0.0))
    if fixed > 0:
        return _Plan(fixed, fixed * scale, rate, steps)

    run_key = f"{context.run_id}"
    cached = context.state.get(CALIBRATION_KEY)
    if isinstance(cached, ConfigRecord) and cached.get("run-id") == run_key:
        charged = float(cached["sigma"])
    else:
        target = float(cfg.get(keys.TARGET_EPSILON, 0.0))
        before = ledger.spent()
        if is_spent(before, ledger.epsilon_budget):
            raise PrivacyBudgetExhausted(
                f"spent eps={before:.4f} of {ledger.epsilon_budget:g}: less than "
                f"{MIN_USABLE_FRACTION:.0%} remains, too little for a useful round"
            )
        cap = ledger.epsilon_budget if target <= 0 else min(ledger.epsilon_budget, before + target)
        charged = noise_multiplier_for(
            cap,
            ledger.delta,
            rate,
            steps * int(cfg[keys.NUM_ROUNDS]),
            accountant=ledger.accountant,
            prior_history=list(ledger.history),
        )
        context.state[CALIBRATION_KEY] = ConfigRecord({"run-id": run_key, "sigma": charged})
        log.info("calibrated sigma=%.4f for cap eps=%.3f (q=%.4f, %d steps/round)", charged, cap, rate, steps)
    return _Plan(charged / scale, charged, rate, steps)


def _train_locally(
    model: torch.nn.Module,
    data: ArrayDataset,
    local: LocalTrainingConfig,
    cfg: ConfigRecord,
    context: Context,
    partition_id: int,
    *,
    clip: float,
    noise_multiplier: float,
    noise: NoiseSource,
    min_survivors: int | None = None,
) -> tuple[dict[str, float], list[Step]]:
    """The round's local work under its DP mode: ``(metrics, steps to charge)``.

    PPSGD / CENTAUR (``personalization`` set) keep their personal part in ``context.state``
    and privatise the shared part under the same mode; otherwise ``dpsgd`` (Opacus
    DP-SGD), ``update`` (clip and noise the whole update) or ``none``. Every DP draw comes
    from ``noise``.

    Raises
    ------
    ValueError
        On a personalization request the model or data cannot serve.
    """
    grad_sample_mode = resolve_grad_sample_mode(str(cfg.get(keys.GRAD_SAMPLE_MODE, "auto")),
                                                str(context.run_config.get("model", "")))
    mode = str(cfg[keys.DP_MODE])
    if cfg.get(keys.PERSONALIZATION, ""):
        return train_personalized(model, data, local, cfg, context, clip=clip, noise_multiplier=noise_multiplier,
                                  partition_id=partition_id, noise=noise, grad_sample_mode=grad_sample_mode)
    if mode == keys.DP_SGD:
        return train_dpsgd(model, data, local, clip=clip, noise_multiplier=noise_multiplier, noise=noise,
                           grad_sample_mode=grad_sample_mode)
    if mode == keys.DP_UPDATE:
        return train_update_dp(model, data, local, clip=clip, noise_multiplier=noise_multiplier,
                               noise_shares=int(cfg.get(keys.NOISE_SHARES, 1)), noise=noise,
                               min_survivors=min_survivors)
    return train_non_private(model, data, local)


def _meta(profile: ClientProfile, **extra: str) -> ConfigRecord:
    return ConfigRecord({keys.CLIENT_ID: profile.client_id, keys.BUDGET_SOURCE: profile.budget_source,
                         keys.NOISE_SOURCE: profile.noise_source, **extra})


@app.query(keys.QUERY_BUDGET)
def query_budget(msg: Message, context: Context) -> Message:
    """Handshake: declare (ε, δ), the example count and the ε already spent."""
    try:
        profile = resolve_profile(context.node_config, context.run_config)
        cfg = msg.content[keys.CONFIG]
        ledger = load_ledger(profile, context, str(cfg.get(keys.ACCOUNTANT, DEFAULT_ACCOUNTANT)))
        if context.run_config.get("strategy") == "dpfedc":  # DP-FedC (issue 14): its own data
            from client.dpfedc import load_client_data

            data = load_client_data(dict(context.run_config), profile.partition_id, profile.num_partitions, 1).T
        else:
            data, _ = _load_local_data(profile, context.run_config)
    except (ValueError, FileNotFoundError) as exc:
        log.error("budget handshake refused (node %s): %s", context.node_config.get("client-id", context.node_id), exc)
        return _error(msg, ERROR_CONFIG, f"config-error: {exc}")
    metrics = MetricRecord(
        {
            keys.EPSILON_BUDGET: float(ledger.epsilon_budget),
            keys.EPSILON_SPENT: float(ledger.spent()),
            keys.DELTA: float(ledger.delta),
            keys.NUM_EXAMPLES: int(len(data)),
        }
    )
    meta = _meta(profile, **{keys.GUARANTEE_UNIT: ledger.unit(),
                             keys.CLIENT_EVALUATION: "on" if profile.allow_evaluation else "off"})
    return Message(RecordDict({keys.METRICS: metrics, keys.META: meta}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training under the requested DP mode, within the budget.

    The node's ledger is locked from load to save (one writer per ledger file), so a
    concurrent run on the same node waits, or is refused, and never releases an
    uncharged model.
    """
    try:
        profile = resolve_profile(context.node_config, context.run_config)
        cfg = msg.content[keys.CONFIG]
        mode = str(cfg[keys.DP_MODE])
        if mode not in keys.DP_MODES:
            raise ValueError(f"'{keys.DP_MODE}' must be one of {keys.DP_MODES}; found {mode!r}")
    except (ValueError, KeyError) as exc:
        return _error(msg, ERROR_CONFIG, f"config-error: {exc}")
    stale = _stale(msg)
    if stale:
        return _error(msg, ERROR_STALE, stale)
    try:
        with ledger_lock(profile):
            if keys.DPFEDC_K in cfg:  # DP-FedC (issue 14): clustering, H_i kept on the node
                from client.dpfedc import train_dpfedc

                return train_dpfedc(msg, context, profile, cfg, mode)
            return _train_with_ledger(msg, context, profile, cfg, mode)
    except LedgerBusy as exc:
        return _error(msg, ERROR_BUSY, f"ledger-busy: {exc}")


def _train_with_ledger(
    msg: Message, context: Context, profile: ClientProfile, cfg: ConfigRecord, mode: str
) -> Message:
    """The body of :func:`train`, run while this node's ledger is locked."""
    started = time.perf_counter()
    try:
        ledger = load_ledger(profile, context, str(cfg.get(keys.ACCOUNTANT, DEFAULT_ACCOUNTANT)))
        data, num_classes = _load_local_data(profile, context.run_config)
        server_round = int(cfg[keys.SERVER_ROUND])
        group = group_dp.GroupMechanism.from_config(cfg) if group_dp.is_group_round(cfg) else None  # GDPFed
        secure = secure_survivors(msg, context)  # r_min when this upload leaves only inside a secure sum
        if secure is not None and (mode != keys.DP_UPDATE or cfg.get(keys.PERSONALIZATION, "")):
            raise ValueError(f"a secure sum needs dp-mode '{keys.DP_UPDATE}' without personalization; "
                             f"found dp-mode {mode!r}")
        if secure is not None and group is None and float(cfg.get(keys.NOISE_MULTIPLIER, 0.0)) <= 0:
            raise ValueError("a secure sum needs a common 'noise-multiplier' > 0: each member counts on the others "
                             "adding the same share of the noise, which budgets calibrated per client would not")
        if secure is not None and group is not None and secure < group.shares:  # GDPFed charges σ_m: all r_m
            raise ValueError(f"a group sum released with {secure} of its {group.shares} noise shares carries less "
                             "noise than the group's sigma_m that this client charges")
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return _error(msg, ERROR_CONFIG, f"config-error: {exc}")

    if mode == keys.DP_NONE and math.isfinite(ledger.epsilon_budget):
        return _error(
            msg,
            ERROR_BUDGET,
            f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has a finite budget "
            f"(eps={ledger.epsilon_budget:g}) and refuses non-private training",
        )
    uncapped = math.isinf(ledger.epsilon_budget) and float(cfg.get(keys.TARGET_EPSILON, 0.0)) <= 0
    if mode != keys.DP_NONE and float(cfg.get(keys.NOISE_MULTIPLIER, 0.0)) <= 0 and uncapped:
        return _error(msg, ERROR_CONFIG, f"config-error: client {profile.client_id} has no finite budget "
                      "to calibrate noise from: set 'noise-multiplier' > 0 or give it an 'epsilon'")
    group_charge: list[Step] = []
    if group is not None:  # GDPFed: the group's whole-run mechanism (σ_m, q_m, T), charged once per run
        group_charge = group_dp.charge_for_run(ledger, group, int(context.run_id))
        plan = _Plan(group.noise_multiplier, group.noise_multiplier, group.sample_rate, group.rounds)
    else:
        try:
            plan = _plan_round(cfg, ledger, context, len(data), secure)
        except (PrivacyBudgetExhausted, ValueError) as exc:  # ValueError: remainder too small for any σ
            return _error(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id}: {exc}")
    if mode != keys.DP_NONE and (group_charge or group is None) \
            and ledger.would_exceed(plan.charged_multiplier, plan.sample_rate, plan.steps):
        return _error(
            msg,
            ERROR_BUDGET,
            f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has spent "
            f"eps={ledger.spent():.4f} of {ledger.epsilon_budget:g}; round {server_round} would exceed it",
        )

    seed = _client_seed(int(cfg.get(keys.SEED, 0)), profile.partition_id, server_round)
    torch.manual_seed(seed)  # weight init and dropout only: not DP randomness
    model = _model_from(msg, data, num_classes, context.run_config)
    global_weights = [w.copy() for w in get_weights(model)]
    local = LocalTrainingConfig(
        epochs=int(cfg[keys.LOCAL_EPOCHS]),
        batch_size=int(cfg[keys.BATCH_SIZE]),
        learning_rate=float(cfg[keys.LEARNING_RATE]),
        momentum=float(cfg.get(keys.MOMENTUM, 0.0)),
        seed=seed,
    )
    clip = float(cfg.get(keys.CLIP, 1.0))
    try:
        if group is not None:
            train_metrics = group_dp.train_group_update(model, data, local, group, _noise_for(profile, seed))
            steps = group_charge
        else:
            train_metrics, steps = _train_locally(model, data, local, cfg, context, profile.partition_id,
                                                  clip=clip, noise_multiplier=plan.noise_multiplier,
                                                  noise=_noise_for(profile, seed), min_survivors=secure)
        arrays = encode_upload(msg.content, global_weights, get_weights(model))
    except ValueError as exc:
        return _error(msg, ERROR_CONFIG, f"config-error: {exc}")

    stale = _stale(msg)
    if stale:  # stopped or stalled mid-training: the model is discarded, never charged or sent
        return _error(msg, ERROR_STALE, stale)
    before = ledger.spent()
    try:
        for sigma, rate, count in steps:
            ledger.record(sigma, rate, count, server_round=server_round, run_id=int(context.run_id), mode=mode)
    except PrivacyBudgetExhausted as exc:  # actual steps exceeded the plan: discard the model
        return _error(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id}: {exc}")
    store_ledger(ledger, profile, context)

    charged_steps = sum(count for _, _, count in steps)
    metrics: dict[str, float | int] = {
        keys.NUM_EXAMPLES: int(train_metrics.get(keys.NUM_EXAMPLES, len(data))),
        **_privacy_metrics(ledger, before),
        keys.NOISE_MULTIPLIER: float(plan.noise_multiplier),
        keys.SAMPLE_RATE: float(plan.sample_rate),
        keys.CLIP: clip,
        keys.LOCAL_STEPS: float(group.rounds if group is not None else charged_steps),
    }
    if profile.report_train_metrics:  # data-dependent, outside the guarantee: the operator opted in
        metrics.update({k: float(v) for k, v in train_metrics.items() if k not in metrics})
        metrics[keys.TRAIN_SECONDS] = float(time.perf_counter() - started)
    log.info(
        "client %s round %d mode=%s sigma=%.3f eps_spent=%.4f/%g",
        profile.client_id, server_round, mode, plan.noise_multiplier,
        metrics[keys.EPSILON_SPENT], ledger.epsilon_budget,
    )
    meta = _meta(profile, **{keys.DP_MODE: mode, keys.GUARANTEE_UNIT: ledger.unit(),
                             keys.TRAIN_METRICS: "on" if profile.report_train_metrics else "off",
                             keys.SECURE_SURVIVORS: str(secure or 0)})
    return Message(
        RecordDict({keys.ARRAYS: arrays, keys.METRICS: MetricRecord(metrics), keys.META: meta}),
        reply_to=msg,
    )


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this client's local shard, where the operator allows it.

    The reply (a loss and an accuracy on private data) is not covered by the ledger: it is
    refused unless the node allows evaluation (``allow-evaluation``, or in simulation
    ``client-evaluation = "on"``), and always once the client's budget is spent.
    """
    try:
        profile = resolve_profile(context.node_config, context.run_config)
    except ValueError as exc:
        return _error(msg, ERROR_CONFIG, f"config-error: {exc}")
    if not profile.allow_evaluation:
        return _error(msg, ERROR_REFUSED, f"{keys.EVALUATION_REFUSED}: client {profile.client_id} does not "
                      "evaluate on its private data (an uncharged release); its operator can allow it with "
                      "node-config 'allow-evaluation=true' (simulation: client-evaluation = \"on\")")
    try:
        cfg = msg.content.config_records.get(keys.CONFIG, ConfigRecord())
        ledger = load_ledger(profile, context, str(cfg.get(keys.ACCOUNTANT, DEFAULT_ACCOUNTANT)))
        if is_spent(ledger.spent(), ledger.epsilon_budget):
            return _error(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has spent "
                          "its budget and answers no request that depends on its data")
        data, num_classes = _load_local_data(profile, context.run_config)
        model = _model_from(msg, data, num_classes, context.run_config)
        model, data = personalize_for_evaluation(msg.content, context, model, data, profile.partition_id)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return _error(msg, ERROR_CONFIG, f"config-error: {exc}")
    loss, accuracy = evaluate(model, data)
    metrics = MetricRecord(
        {keys.EVAL_LOSS: float(loss), keys.EVAL_ACCURACY: float(accuracy), keys.NUM_EXAMPLES: int(len(data))}
    )
    return Message(RecordDict({keys.METRICS: metrics}), reply_to=msg)
