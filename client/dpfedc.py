"""DP-FedC's client: one round of Algorithm 1 on a client's private (X_i, H_i).

:func:`client_round` is the mathematics (shared by the Flower client below and the numpy
reproduction in ``experiments/dpfedc``): Q₁ projected-gradient steps on H_i with the
broadcast W fixed (eq. 17), Q₂ᵗ minibatch SGD steps on a local copy of W with H_i fixed
(eq. 18), then the privatised upload W̃_i (eq. 19; :mod:`privacy.centroid_noise`).

:func:`train_dpfedc` is the Flower train handler's body (called by ``client.app.train``
under the ledger lock). H_i never leaves the client: it is kept in the node's
``context.state`` and, because a deployed SuperNode may start a new process for every
message, also in a node-local file keyed by the run id (:func:`memberships_path`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

from privacy.centroid_noise import (
    Release,
    paper_noise_multiplier,
    paper_round_epsilon,
    privatize_centroids,
)
from privacy.dp_modes import dp_mode
from privacy.randomness import NoiseSource
from client.replies import error_reply, reply_meta, stale_reason, train_report
from client.round_plan import client_seed, noise_for, plan_round
from protocol import keys
from protocol.dpfedc import DPFedCRound
from protocol.train_config import TrainConfig
from protocol.errors import ERROR_BUDGET, ERROR_CONFIG, ERROR_STALE
from tasks.clustering import (
    ClusteringParams,
    check_centroids,
    check_data,
    h_phase,
    initial_memberships,
    w_phase,
)

log = logging.getLogger("privet.client")

#: ``context.state`` key of this client's H_i.
STATE_KEY = "dpfedc.memberships"


@dataclass(frozen=True)
class RoundPrivacy:
    """How the round's upload is privatised (:mod:`privacy.centroid_noise`).

    mode : ``"rigorous"`` (clip the update to ``clip`` = C, noise z·C), ``"paper"`` (eq. 29
        with per-round ε ``paper_epsilon``; C = Q₂G/η), or ``"none"``.
    grad_clip : G, the per-minibatch gradient bound (inf: none; the paper mode needs it).
    """

    mode: str = "none"
    clip: float = math.inf
    grad_clip: float = math.inf
    noise_multiplier: float = 0.0
    paper_epsilon: float = 0.0
    delta: float = 1e-4


@dataclass(frozen=True)
class RoundResult:
    upload: np.ndarray  # W̃_i (sampled clients send this, nothing else that depends on data)
    memberships: np.ndarray  # H_i^t, kept by the client
    release: Release | None
    eta: float
    q2: int
    sample_ratio: float  # q_{i,t} = Q₂ᵗ b / n_i (the paper's data-sampling ratio)


def client_round(x: np.ndarray, h: np.ndarray, w: np.ndarray, t: int, params: ClusteringParams,
                 privacy: RoundPrivacy, uniform: Callable[[int], np.ndarray],
                 noise: NoiseSource | None, upload: bool = True) -> RoundResult:
    """Lines 8-22 of Algorithm 1 for one client (docs/notes/dpfedc.md §3.2).

    x : X_i (m × n_i); h : H_i^{t−1} (k × n_i); w : the broadcast W^t (m × k); t >= 1.
    ``uniform`` draws the minibatches (not DP randomness); ``noise`` the Gaussian ξ_i.
    ``upload=False``: an unsampled client (Algorithm 1 still updates its H_i).
    """
    h = h_phase(x, w, h, params)                                # eq. (17), Q₁ steps
    q2 = params.w_steps(t)                                      # Q₂ᵗ
    w_local, eta = w_phase(x, w, h, params, q2, uniform, privacy.grad_clip)   # eq. (18)
    ratio = q2 * min(params.batch, x.shape[1]) / x.shape[1]
    if not upload:
        return RoundResult(w_local, h, None, eta, q2, ratio)
    if privacy.mode == "rigorous":
        release = privatize_centroids(w, w_local, privacy.clip, privacy.noise_multiplier, noise)
    elif privacy.mode == "paper":
        z = paper_noise_multiplier(privacy.paper_epsilon, privacy.delta, ratio)
        release = privatize_centroids(w, w_local, q2 * privacy.grad_clip / eta, z, noise)  # eq. (19), (29)
    else:
        release = None
    return RoundResult(release.centroids if release else w_local, h, release, eta, q2, ratio)


# ----------------------------------------------------------------------------- H_i storage
def memberships_path(folder: str | None, client_id: str, run_id: int) -> Path | None:
    """Node-local file of H_i for this run (``None``: no folder, ``context.state`` only)."""
    if not folder:
        return None
    return Path(folder) / f"dpfedc-H-{client_id}-run{run_id}.npy"


def load_memberships(context: Context, path: Path | None, k: int, n: int, seed: int) -> np.ndarray:
    """H_i of the previous round (``context.state``, else the node-local file, else H_i⁰)."""
    rec = context.state.get(STATE_KEY)
    if isinstance(rec, ArrayRecord) and "h" in rec:
        h = rec["h"].numpy()
        if h.shape == (k, n):
            return h
    if path is not None and path.is_file():
        h = np.load(path)
        if h.shape == (k, n):
            return h
    return initial_memberships(n, k, seed)


def store_memberships(context: Context, path: Path | None, h: np.ndarray) -> None:
    """Keep H_i in the node's state and, where a folder is known, in its file (atomic)."""
    context.state[STATE_KEY] = ArrayRecord({"h": Array(np.ascontiguousarray(h))})
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, h)
        tmp.replace(path)


# ----------------------------------------------------------------------------- Flower
def load_client_data(run_config: dict, partition_id: int, num_partitions: int, k: int) -> np.ndarray:
    """X_i (m × n_i) of this partition: the dataset named by ``dpfedc.dataset`` split with
    ``dpfedc.split`` over ``num_partitions`` clients (seeded, like every partitioner)."""
    from protocol.dpfedc import DPFedCConfig
    from tasks.clustering import load_clustering_data, split

    d = DPFedCConfig.from_run_config(run_config)
    seed = int(run_config.get("seed", 0))
    data = load_clustering_data(d.dataset, d.data_dir or None, d.num_samples, seed)
    parts = split(data.y, num_partitions, d.split, seed)
    return check_data(data.x[parts[partition_id]].T, k, name=f"client {partition_id}'s data")


def train_dpfedc(msg: Message, context: Context, profile, cfg: ConfigRecord, train: TrainConfig) -> Message:
    """The train handler for DP-FedC (``client.app.train`` dispatches here under the lock).

    ``cfg`` is the raw train config (DP-FedC's own keys); ``train`` its common part, decoded.

    Plans the round's noise (rigorous: z calibrated once per run from the client's budget
    with :func:`client.round_plan.plan_round`; paper: from ε̄ by (32) inverted), refuses a round
    that would exceed the budget, runs :func:`client_round`, charges the ledger one
    ``(z, 1, 1)`` release (mode ``update``: it bounds the whole local data set's influence),
    keeps H_i and answers with W̃_i and covered metrics only.
    """
    from client.ledger_store import load_ledger, store_ledger
    from privacy.exceptions import PrivacyBudgetExhausted

    mode = train.dp_mode
    started = time.perf_counter()
    try:
        section = DPFedCRound.decode(cfg)
        calibration = section.calibration
        params = section.params(train.batch_size)
        ledger = load_ledger(profile, context, train.accountant)
        x = load_client_data(dict(context.run_config), profile.partition_id, profile.num_partitions, params.k)
        server_round = train.server_round
        w = check_centroids(msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays()[0], x.shape[0], params.k)
    except (ValueError, KeyError, IndexError, FileNotFoundError) as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    n = x.shape[1]
    clip = train.clip
    grad_clip = section.grad_clip or math.inf
    private = dp_mode(mode).private
    if not private:
        if math.isfinite(ledger.epsilon_budget):
            return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has a finite "
                          f"budget (eps={ledger.epsilon_budget:g}) and refuses non-private training")
        privacy, charged = RoundPrivacy("none"), 0.0
    elif calibration == "paper":
        q2 = params.w_steps(server_round)
        q = q2 * min(params.batch, n) / n
        eps_round = paper_round_epsilon(section.epsilon_bar, q, section.client_rate, train.num_rounds)
        privacy = RoundPrivacy("paper", grad_clip=grad_clip, paper_epsilon=eps_round, delta=ledger.delta)
        charged = paper_noise_multiplier(eps_round, ledger.delta, q)
        if not math.isfinite(grad_clip):
            return error_reply(msg, ERROR_CONFIG, "config-error: the paper calibration needs dpfedc.grad-clip (G) > 0")
    else:
        planned = section.planned_rounds or train.num_rounds
        try:
            plan = plan_round(replace(train, num_rounds=planned, noise_shares=1), ledger, context, n)
        except (PrivacyBudgetExhausted, ValueError) as exc:
            return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id}: {exc}")
        charged = plan.charged_multiplier
        privacy = RoundPrivacy("rigorous", clip=clip, grad_clip=grad_clip, noise_multiplier=charged,
                               delta=ledger.delta)
    if private and ledger.would_exceed(charged, 1.0, 1):
        return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has spent "
                      f"eps={ledger.spent():.4f} of {ledger.epsilon_budget:g}; round {server_round} would exceed it")

    seed = client_seed(train.seed, profile.partition_id, server_round)
    folder = profile.shard_cache or (str(Path(profile.ledger_path).parent) if profile.ledger_path else None)
    path = memberships_path(folder, profile.client_id, int(context.run_id))
    h = load_memberships(context, path, params.k, n, client_seed(train.seed, profile.partition_id, 0))
    batches = np.random.default_rng(seed)  # minibatch choice: not DP randomness
    result = client_round(x, h, w, server_round, params, privacy, batches.random, noise_for(profile, seed))
    stale = stale_reason(msg)
    if stale:
        return error_reply(msg, ERROR_STALE, stale)
    before = ledger.spent()
    try:  # a non-private round is charged (0, 1, 1): eps = inf, as in client.app
        ledger.record(charged, 1.0, 1, server_round=server_round, run_id=int(context.run_id),
                      mode=keys.DP_UPDATE if private else keys.DP_NONE)  # it bounds the whole data set
    except PrivacyBudgetExhausted as exc:
        return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id}: {exc}")
    store_ledger(ledger, profile, context)
    store_memberships(context, path, result.memberships)  # H_i stays here, never in the reply
    uncovered: dict[str, float] = {}
    if profile.report_train_metrics:  # data-dependent, outside the guarantee
        uncovered[keys.TRAIN_SECONDS] = float(time.perf_counter() - started)
        if result.release:
            uncovered[keys.UPDATE_NORM] = float(result.release.update_norm)
    report = train_report(ledger, before, num_examples=int(n), noise_multiplier=charged, sample_rate=1.0,
                          local_steps=1, extra=uncovered,
                          clip=grad_clip if calibration == "paper" and private else clip)  # never η
    meta = reply_meta(profile, **{keys.DP_MODE: mode, keys.GUARANTEE_UNIT: ledger.unit(),
                             keys.TRAIN_METRICS: "on" if profile.report_train_metrics else "off"})
    arrays = ArrayRecord({"centroids": Array(np.asarray(result.upload, np.float64))})
    return Message(RecordDict({keys.ARRAYS: arrays, keys.METRICS: MetricRecord(report.metrics()), keys.META: meta}),
                   reply_to=msg)
