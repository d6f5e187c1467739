"""One client round, the same for every mechanism and task.

    decode → lock the ledger → plan → refuse if it would exceed → run → refuse if stale → charge → store → reply

The request is decoded once (:class:`protocol.train_config.TrainConfig`); the task (a model, or
DP-FedC's clustering) supplies the data and the local work; the mechanism
(:mod:`privacy.mechanisms`, chosen by :meth:`TrainConfig.mechanism`) plans the release against
the ledger, runs it with noise from the client's own source and says what it charges; the
privacy steps from the plan to the charge (the site's floors and the staleness check among
them) are :func:`client.release.release_once`, the one function ``privet audit`` runs too; the
ledger records exactly that (:meth:`privacy.ledger.PrivacyLedger.record_release`), under an
exclusive lock from load to save, so a concurrent run on the same node waits or is refused and
never releases an uncharged model. Nothing is charged for a release that does not happen: a
refusal before training touches no data, and a model trained past its message's time-to-live
is discarded uncharged.

What a train reply carries, and under which guarantee: the model (covered by the ledger's ε,
replace-one), the example count n (public by the relation), the budget, δ and ε spent, σ, q and
the steps (functions of public figures), the client id, DP mode and noise source. The training
loss, time and update norm are data-dependent and not covered: sent only where the operator opts
in (``report-train-metrics``), and the report lists them as outside the guarantee.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from client.dpfedc import ClusteringTask
from client.ledger_store import LedgerBusy, ledger_lock, load_ledger, store_ledger
from client.model_task import ModelTask
from client.profile import ClientProfile, resolve_profile
from client.release import Refused, release_once
from client.replies import error_reply, reply_meta, stale_reason, train_report
from client.secure_sum import secure_ddg, secure_survivors
from client.seeds import client_seed, noise_for
from privacy.ledger import PrivacyLedger
from privacy.mechanisms import LocalWork, Mechanism, Release, Upload
from protocol import keys
from protocol.dpfedc import DPFedCRound
from protocol.errors import ERROR_BUSY, ERROR_CONFIG, ERROR_STALE
from protocol.train_config import TrainConfig

log = logging.getLogger("privet.client")


class LocalTask(Protocol):
    """What a round works on (:class:`client.model_task.ModelTask`, :class:`client.dpfedc.ClusteringTask`)."""

    num_examples: int
    clustering: DPFedCRound | None

    def work(self, seed: int) -> LocalWork:
        """The round's local work (``seed``: its non-DP randomness)."""

    def encode(self, upload: Upload) -> ArrayRecord:
        """The reply's arrays."""

    def commit(self) -> None:
        """Keep what the round keeps on the client, once it is charged."""


#: ``task`` -> how a round of it is read (:data:`protocol.train_config.TASKS`)
TASKS: dict[str, type[ModelTask] | type[ClusteringTask]] = {
    keys.TASK_MODEL: ModelTask, keys.TASK_CLUSTERING: ClusteringTask}


def train_round(msg: Message, context: Context) -> Message:
    """The train handler: one round under the ledger's lock (module docstring)."""
    try:
        cfg = TrainConfig.decode(msg.content.config_records[keys.CONFIG])
        profile = resolve_profile(context.node_config, context.run_config, cfg.budget_reference)
    except (ValueError, KeyError) as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    stale = stale_reason(msg)
    if stale:
        return error_reply(msg, ERROR_STALE, stale)
    try:
        with ledger_lock(profile):
            return _round(msg, context, profile, cfg)
    except LedgerBusy as exc:
        return error_reply(msg, ERROR_BUSY, f"ledger-busy: {exc}")


def _round(msg: Message, context: Context, profile: ClientProfile, cfg: TrainConfig) -> Message:
    started = time.perf_counter()
    run_id = int(context.run_id)
    try:
        if cfg.server_round < 1:
            raise ValueError(f"the train config has no '{keys.SERVER_ROUND}' >= 1")
        ledger = load_ledger(profile, context, cfg.accountant)
        task = TASKS[cfg.task](msg, context, profile, cfg)
        secure = secure_survivors(msg, context)  # r_min when the upload leaves only inside a secure sum
        mechanism = cfg.mechanism(num_examples=task.num_examples, delta=ledger.delta, secure_floor=secure,
                                  clustering=task.clustering, ddg=secure_ddg(msg, context))
    except (ValueError, KeyError, IndexError, FileNotFoundError) as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    seed = client_seed(cfg.seed, profile.partition_id, cfg.server_round)
    try:
        done = release_once(mechanism, ledger, client_id=profile.client_id, run_id=run_id,
                            server_round=cfg.server_round, work=lambda: task.work(seed),
                            noise=lambda: noise_for(profile, seed), prepare=task.encode,
                            target_epsilon=cfg.target_epsilon, floors=profile.floors, stale=lambda: stale_reason(msg))
    except ValueError as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    if isinstance(done, Refused):
        return error_reply(msg, done.code, done.reason)
    upload, release, arrays = done.upload, done.release, done.prepared
    store_ledger(ledger, profile, context)
    task.commit()
    reply = _Reply(msg, profile, cfg, mechanism, release, secure or 0)
    return reply.message(ledger, done.spent_before, upload, arrays, task.num_examples, time.perf_counter() - started)


class _Reply:
    """The train reply of a charged round: covered figures, and uncovered ones only where opted in."""

    def __init__(self, msg: Message, profile: ClientProfile, cfg: TrainConfig, mechanism: Mechanism,
                 release: Release, secure_floor: int) -> None:
        self.msg, self.profile, self.cfg, self.mechanism, self.release = msg, profile, cfg, mechanism, release
        self.secure_floor = secure_floor

    def message(self, ledger: PrivacyLedger, ledger_before: float, upload: Upload, arrays: ArrayRecord,
                num_examples: int, seconds: float) -> Message:
        """The reply (the round's figures, the upload's arrays, the metadata)."""
        profile, cfg, release = self.profile, self.cfg, self.release
        uncovered: dict[str, float] = {}
        if profile.report_train_metrics:  # data-dependent, outside the guarantee: the operator opted in
            uncovered = {k: float(v) for k, v in upload.metrics.items() if k != keys.NUM_EXAMPLES}
            uncovered[keys.TRAIN_SECONDS] = float(seconds)
        report = train_report(ledger, ledger_before,
                              num_examples=int(upload.metrics.get(keys.NUM_EXAMPLES, num_examples)),
                              noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate,
                              local_steps=release.steps, clip=self.mechanism.clip, extra=uncovered)
        log.info("client %s round %d mode=%s sigma=%.3f eps_spent=%.4f/%g", profile.client_id, cfg.server_round,
                 cfg.dp_mode, release.noise_multiplier, report.epsilon_spent, ledger.epsilon_budget)
        meta = reply_meta(profile, **{keys.DP_MODE: cfg.dp_mode, keys.GUARANTEE_UNIT: ledger.unit(),
                                      keys.TRAIN_METRICS: "on" if profile.report_train_metrics else "off",
                                      keys.SECURE_SURVIVORS: str(self.secure_floor)})
        content = RecordDict({keys.ARRAYS: arrays, keys.METRICS: MetricRecord(report.metrics()), keys.META: meta})
        return Message(content, reply_to=self.msg)
