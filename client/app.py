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
from typing import Any

import torch
from flwr.app import (
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from client import group_dp
from client.allocator import tune_malloc
from client.ledger_store import LedgerBusy, ledger_lock, load_ledger, store_ledger
from client.profile import ClientProfile, resolve_profile
from client.replies import error_reply, reply_meta, stale_reason, train_report
from client.round_plan import RoundPlan, client_seed, noise_for, plan_round
from client.secure_sum import secure_sum_mod, secure_survivors
from client.shard_cache import cached_shard, shard_key
from client.uploads import encode_upload
from client.personalization import personalize_for_evaluation, train_personalized
from client.training import (
    LocalTrainingConfig,
    train_dpsgd,
    train_non_private,
    train_update_dp,
)
from privacy.accountants import DEFAULT_ACCOUNTANT, Step
from privacy.dp_modes import dp_mode
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.policy import is_spent
from privacy.randomness import NoiseSource
from protocol import keys
from protocol.budget_query import BudgetQuery
from protocol.replies import BudgetDeclaration, EvaluationReport
from protocol.train_config import TrainConfig
from protocol.errors import ERROR_BUDGET, ERROR_BUSY, ERROR_CONFIG, ERROR_REFUSED, ERROR_STALE
from protocol.log import route_privet_logs_to_flower
from tasks.datasets import ArrayDataset, is_loaded, load_dataset, source
from tasks.models import build_model, evaluate, get_weights, resolve_grad_sample_mode, set_weights
from tasks.partition import client_data

log = logging.getLogger("privet.client")
route_privet_logs_to_flower()


app = ClientApp(mods=[secure_sum_mod])  # secure sums: client/secure_sum.py
tune_malloc()  # keep DP-SGD's per-step buffers in the heap (client/allocator.py)


def _load_local_data(profile: ClientProfile, run_config: dict) -> tuple[ArrayDataset, int]:
    """This client's training shard (and the dataset's class count), via the node's shard cache."""
    dataset = str(run_config["dataset"])
    data_dir = profile.data_dir or str(run_config.get("data-dir", "")) or None
    partitioning: dict[str, Any] = {  # client_data's keywords, and the shard cache's identity
        "method": str(run_config["partitioner"]),
        "alpha": float(run_config["dirichlet-alpha"]),
        "shards_per_client": int(run_config["shards-per-client"]),
        "seed": int(run_config["seed"]),
        "max_examples": int(run_config["max-examples-per-client"]),
        "evaluation_split": str(run_config.get("evaluation-split", "test")),
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


def _model_from(msg: Message, data: ArrayDataset, num_classes: int, run_config: dict) -> torch.nn.Module:
    model = build_model(
        str(run_config["model"]), input_shape=tuple(data.x.shape[1:]), num_classes=num_classes
    )
    set_weights(model, msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays())
    return model


def _train_locally(
    model: torch.nn.Module,
    data: ArrayDataset,
    local: LocalTrainingConfig,
    cfg: TrainConfig,
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
    grad_sample_mode = resolve_grad_sample_mode(cfg.grad_sample_mode, str(context.run_config.get("model", "")))
    mode = dp_mode(cfg.dp_mode)
    if cfg.personalization:
        return train_personalized(model, data, local, cfg, context, clip=clip, noise_multiplier=noise_multiplier,
                                  partition_id=partition_id, noise=noise, grad_sample_mode=grad_sample_mode)
    if mode.per_record:
        return train_dpsgd(model, data, local, clip=clip, noise_multiplier=noise_multiplier, noise=noise,
                           grad_sample_mode=grad_sample_mode)
    if mode.whole_update:
        return train_update_dp(model, data, local, clip=clip, noise_multiplier=noise_multiplier,
                               noise_shares=cfg.noise_shares, noise=noise,
                               min_survivors=min_survivors)
    return train_non_private(model, data, local)


@app.query(keys.QUERY_BUDGET)
def query_budget(msg: Message, context: Context) -> Message:
    """Handshake: declare (ε, δ), the example count and the ε already spent."""
    try:
        query = BudgetQuery.decode(msg.content[keys.CONFIG])
        profile = resolve_profile(context.node_config, context.run_config, query.budget_reference)
        ledger = load_ledger(profile, context, query.accountant)
        if query.clustering:  # DP-FedC: the server says it is a clustering run, with its own data
            from client.dpfedc import load_client_data

            num_examples = load_client_data(dict(context.run_config), profile.partition_id,
                                            profile.num_partitions, 1).shape[1]
        else:
            num_examples = len(_load_local_data(profile, context.run_config)[0])
    except (ValueError, FileNotFoundError) as exc:
        log.error("budget handshake refused (node %s): %s", context.node_config.get(keys.NODE_CLIENT_ID, context.node_id), exc)
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    declaration = BudgetDeclaration(
        client_id=profile.client_id, epsilon_budget=float(ledger.epsilon_budget), delta=float(ledger.delta),
        num_examples=int(num_examples), epsilon_spent=float(ledger.spent()), guarantee_unit=ledger.unit(),
        noise_source=profile.noise_source, client_evaluation=profile.allow_evaluation)
    return Message(declaration.encode({keys.BUDGET_SOURCE: profile.budget_source}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training under the requested DP mode, within the budget.

    The node's ledger is locked from load to save (one writer per ledger file), so a
    concurrent run on the same node waits, or is refused, and never releases an
    uncharged model.
    """
    try:
        record = msg.content.config_records[keys.CONFIG]
        cfg = TrainConfig.decode(record)
        profile = resolve_profile(context.node_config, context.run_config, cfg.budget_reference)
    except (ValueError, KeyError) as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    stale = stale_reason(msg)
    if stale:
        return error_reply(msg, ERROR_STALE, stale)
    try:
        with ledger_lock(profile):
            if keys.DPFEDC_K in record:  # DP-FedC (issue 14): clustering, H_i kept on the node
                from client.dpfedc import train_dpfedc

                return train_dpfedc(msg, context, profile, record, cfg)
            return _train_with_ledger(msg, context, profile, cfg)
    except LedgerBusy as exc:
        return error_reply(msg, ERROR_BUSY, f"ledger-busy: {exc}")


def _train_with_ledger(
    msg: Message, context: Context, profile: ClientProfile, cfg: TrainConfig
) -> Message:
    """The body of :func:`train`, run while this node's ledger is locked."""
    started = time.perf_counter()
    mode = cfg.dp_mode
    try:
        ledger = load_ledger(profile, context, cfg.accountant)
        data, num_classes = _load_local_data(profile, context.run_config)
        server_round = cfg.server_round
        if server_round < 1:
            raise ValueError(f"the train config has no '{keys.SERVER_ROUND}' >= 1")
        group = group_dp.GroupMechanism.from_config(cfg) if cfg.group_round else None  # GDPFed
        secure = secure_survivors(msg, context)  # r_min when this upload leaves only inside a secure sum
        if secure is not None and (not dp_mode(mode).whole_update or cfg.personalization):
            raise ValueError(f"a secure sum needs dp-mode '{keys.DP_UPDATE}' without personalization; "
                             f"found dp-mode {mode!r}")
        if secure is not None and group is None and cfg.noise_multiplier <= 0:
            raise ValueError("a secure sum needs a common 'noise-multiplier' > 0: each member counts on the others "
                             "adding the same share of the noise, which budgets calibrated per client would not")
        if secure is not None and group is not None and secure < group.shares:  # GDPFed charges σ_m: all r_m
            raise ValueError(f"a group sum released with {secure} of its {group.shares} noise shares carries less "
                             "noise than the group's sigma_m that this client charges")
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")

    private = dp_mode(mode).private
    if not private and math.isfinite(ledger.epsilon_budget):
        return error_reply(
            msg,
            ERROR_BUDGET,
            f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has a finite budget "
            f"(eps={ledger.epsilon_budget:g}) and refuses non-private training",
        )
    uncapped = math.isinf(ledger.epsilon_budget) and cfg.target_epsilon <= 0
    if private and cfg.noise_multiplier <= 0 and uncapped:
        return error_reply(msg, ERROR_CONFIG, f"config-error: client {profile.client_id} has no finite budget "
                      "to calibrate noise from: set 'noise-multiplier' > 0 or give it an 'epsilon'")
    group_charge: list[Step] = []
    if group is not None:  # GDPFed: the group's whole-run mechanism (σ_m, q_m, T), charged once per run
        group_charge = group_dp.charge_for_run(ledger, group, int(context.run_id))
        plan = RoundPlan(group.noise_multiplier, group.noise_multiplier, group.sample_rate, group.rounds)
    else:
        try:
            plan = plan_round(cfg, ledger, context, len(data), secure)
        except (PrivacyBudgetExhausted, ValueError) as exc:  # ValueError: remainder too small for any σ
            return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id}: {exc}")
    if private and (group_charge or group is None) \
            and ledger.would_exceed(plan.charged_multiplier, plan.sample_rate, plan.steps):
        return error_reply(
            msg,
            ERROR_BUDGET,
            f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has spent "
            f"eps={ledger.spent():.4f} of {ledger.epsilon_budget:g}; round {server_round} would exceed it",
        )

    seed = client_seed(cfg.seed, profile.partition_id, server_round)
    torch.manual_seed(seed)  # weight init and dropout only: not DP randomness
    model = _model_from(msg, data, num_classes, context.run_config)
    global_weights = [w.copy() for w in get_weights(model)]
    local = LocalTrainingConfig(
        epochs=cfg.local_epochs,
        steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        momentum=cfg.momentum,
        seed=seed,
    )
    clip = cfg.clip
    try:
        if group is not None:
            train_metrics = group_dp.train_group_update(model, data, local, group, noise_for(profile, seed))
            steps = group_charge
        else:
            train_metrics, steps = _train_locally(model, data, local, cfg, context, profile.partition_id,
                                                  clip=clip, noise_multiplier=plan.noise_multiplier,
                                                  noise=noise_for(profile, seed), min_survivors=secure)
        arrays = encode_upload(msg.content, global_weights, get_weights(model))
    except ValueError as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")

    stale = stale_reason(msg)
    if stale:  # stopped or stalled mid-training: the model is discarded, never charged or sent
        return error_reply(msg, ERROR_STALE, stale)
    before = ledger.spent()
    try:
        for sigma, rate, count in steps:
            ledger.record(sigma, rate, count, server_round=server_round, run_id=int(context.run_id), mode=mode)
    except PrivacyBudgetExhausted as exc:  # actual steps exceeded the plan: discard the model
        return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id}: {exc}")
    store_ledger(ledger, profile, context)

    charged_steps = sum(count for _, _, count in steps)
    uncovered: dict[str, float] = {}
    if profile.report_train_metrics:  # data-dependent, outside the guarantee: the operator opted in
        uncovered = {k: float(v) for k, v in train_metrics.items() if k != keys.NUM_EXAMPLES}
        uncovered[keys.TRAIN_SECONDS] = float(time.perf_counter() - started)
    report = train_report(ledger, before, num_examples=int(train_metrics.get(keys.NUM_EXAMPLES, len(data))),
                          noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
                          local_steps=group.rounds if group is not None else charged_steps, clip=clip,
                          extra=uncovered)
    log.info(
        "client %s round %d mode=%s sigma=%.3f eps_spent=%.4f/%g",
        profile.client_id, server_round, mode, plan.noise_multiplier, report.epsilon_spent, ledger.epsilon_budget,
    )
    meta = reply_meta(profile, **{keys.DP_MODE: mode, keys.GUARANTEE_UNIT: ledger.unit(),
                             keys.TRAIN_METRICS: "on" if profile.report_train_metrics else "off",
                             keys.SECURE_SURVIVORS: str(secure or 0)})
    return Message(
        RecordDict({keys.ARRAYS: arrays, keys.METRICS: MetricRecord(report.metrics()), keys.META: meta}),
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
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    if not profile.allow_evaluation:
        return error_reply(msg, ERROR_REFUSED, f"{keys.EVALUATION_REFUSED}: client {profile.client_id} does not "
                      "evaluate on its private data (an uncharged release); its operator can allow it with "
                      "node-config 'allow-evaluation=true' (simulation: client-evaluation = \"on\")")
    try:
        cfg = msg.content.config_records.get(keys.CONFIG, ConfigRecord())
        ledger = load_ledger(profile, context, str(cfg.get(keys.ACCOUNTANT, DEFAULT_ACCOUNTANT)))
        if is_spent(ledger.spent(), ledger.epsilon_budget):
            return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has spent "
                          "its budget and answers no request that depends on its data")
        data, num_classes = _load_local_data(profile, context.run_config)
        model = _model_from(msg, data, num_classes, context.run_config)
        model, data = personalize_for_evaluation(msg.content, context, model, data, profile.partition_id)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    loss, accuracy = evaluate(model, data)
    report = EvaluationReport(accuracy=float(accuracy), loss=float(loss), num_examples=int(len(data)))
    return Message(RecordDict({keys.METRICS: report.metrics()}), reply_to=msg)
