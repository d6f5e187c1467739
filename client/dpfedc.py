"""DP-FedC's client: one round of Algorithm 1 on a client's private (X_i, H_i).

:class:`ClusteringWork` is the mathematics of the local work as a privacy mechanism runs it
(:class:`privacy.mechanisms.LocalWork`): Q₁ projected-gradient steps on H_i with the broadcast
W fixed (eq. 17), then Q₂ᵗ minibatch SGD steps on a local copy of W with H_i fixed (eq. 18);
the mechanism (:class:`privacy.mechanisms.CentroidRelease`) makes the upload W̃_i (eq. 19).
:class:`ClusteringTask` gives the shared client round (:mod:`client.round`) what it needs for a
clustering round: X_i, the work, the upload's encoding, and H_i's storage after the charge.
:func:`client_round` runs the same work and mechanism for the numpy reproduction
(``experiments/dpfedc``).

H_i never leaves the client: it is kept in the node's ``context.state`` and, because a deployed
SuperNode may start a new process for every message, also in a node-local file keyed by the
run id (:func:`memberships_path`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message

from client.profile import ClientProfile
from client.seeds import client_seed
from privacy.centroid_noise import Release, paper_noise_multiplier
from privacy.mechanisms import CentroidRelease, Mechanism, NoPrivacy, Privatizer, Upload
from privacy.randomness import NoiseSource
from protocol import keys
from protocol.dpfedc import DPFedCRound
from protocol.run_settings import RunSettings
from protocol.train_config import TrainConfig
from tasks.clustering import (
    ClusteringParams,
    check_centroids,
    check_data,
    h_phase,
    initial_memberships,
    load_clustering_data,
    split,
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

    def mechanism(self, sample_ratio: float) -> Mechanism:
        """This round's mechanism (``sample_ratio`` = Q₂ᵗb/n_i, the paper's q)."""
        if self.mode == "rigorous":
            return CentroidRelease(self.clip, self.noise_multiplier)
        if self.mode == "paper":
            sigma = paper_noise_multiplier(self.paper_epsilon, self.delta, sample_ratio)
            return CentroidRelease(self.grad_clip, sigma, paper=True)
        return NoPrivacy(self.clip)


@dataclass(frozen=True)
class RoundResult:
    """One DP-FedC client round: what it uploads, what it keeps, and the release it charged."""

    upload: np.ndarray  # W̃_i (sampled clients send this, nothing else that depends on data)
    memberships: np.ndarray  # H_i^t, kept by the client
    release: Release | None
    eta: float
    q2: int
    sample_ratio: float  # q_{i,t} = Q₂ᵗ b / n_i (the paper's data-sampling ratio)


@dataclass
class ClusteringWork:
    """One round's local work on (X_i, H_i) from the broadcast W (:class:`privacy.mechanisms.LocalWork`).

    ``uniform`` draws the minibatches (not DP randomness). After :meth:`train`, ``memberships``
    holds H_i^t, ``w_local`` the local W, ``eta`` the W phase's step 1/η and ``q2`` its steps.
    """

    x: np.ndarray
    h: np.ndarray
    w: np.ndarray
    t: int
    params: ClusteringParams
    grad_clip: float
    uniform: Callable[[int], np.ndarray]
    memberships: np.ndarray = field(init=False)
    w_local: np.ndarray = field(init=False)
    eta: float = field(init=False, default=math.nan)
    q2: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.q2 = self.params.w_steps(self.t)  # Q₂ᵗ

    @property
    def sample_ratio(self) -> float:
        """q_{i,t} = Q₂ᵗ b / n_i, the paper's data-sampling ratio."""
        n = self.x.shape[1]
        return self.q2 * min(self.params.batch, n) / n

    def train(self, privatize: Privatizer | None) -> Upload:
        """Eq. (17) on H_i, eq. (18) on a copy of W; then ``privatize`` (W, W_i) (None: W_i as trained)."""
        self.memberships = h_phase(self.x, self.w, self.h, self.params)
        self.w_local, self.eta = w_phase(self.x, self.w, self.memberships, self.params, self.q2, self.uniform,
                                         self.grad_clip)
        if privatize is None:
            return Upload([self.w_local])
        upload, diagnostics = privatize([self.w], [self.w_local])
        return Upload(upload, diagnostics)

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """DP-FedC has no DP-SGD: its mechanism releases the noisy centroids."""
        raise ValueError(f"DP-FedC runs '{keys.DP_MODE}' = '{keys.DP_UPDATE}' or 'none', not DP-SGD")

    def update_bound(self) -> float:
        """C = Q₂ᵗG/η: the W phase's bound on ‖W_i − W‖_F when every minibatch gradient is clipped to G."""
        return self.q2 * self.grad_clip / self.eta


def client_round(x: np.ndarray, h: np.ndarray, w: np.ndarray, t: int, params: ClusteringParams,
                 privacy: RoundPrivacy, uniform: Callable[[int], np.ndarray],
                 noise: NoiseSource | None, upload: bool = True) -> RoundResult:
    """Lines 8-22 of Algorithm 1 for one client (docs/notes/dpfedc.md §3.2): the shared client code.

    x : X_i (m × n_i); h : H_i^{t−1} (k × n_i); w : the broadcast W^t (m × k); t >= 1.
    ``uniform`` draws the minibatches (not DP randomness); ``noise`` the Gaussian ξ_i.
    ``upload=False``: an unsampled client (Algorithm 1 still updates its H_i).
    """
    work = ClusteringWork(x, h, w, t, params, privacy.grad_clip, uniform)
    if not upload:
        out = work.train(None)
        return RoundResult(out.arrays[0], work.memberships, None, work.eta, work.q2, work.sample_ratio)
    mechanism = privacy.mechanism(work.sample_ratio)
    release = mechanism.release(mechanism.noise_multiplier)
    out = mechanism.run(work, release, noise)  # type: ignore[arg-type]  # None only without noise
    record = None
    if mechanism.private:
        clip = work.update_bound() if privacy.mode == "paper" else mechanism.clip
        record = Release(out.arrays[0], release.noise_multiplier, clip, float(out.metrics["update-norm"]))
    return RoundResult(out.arrays[0], work.memberships, record, work.eta, work.q2, work.sample_ratio)


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
def load_client_data(settings: RunSettings, partition_id: int, num_partitions: int, k: int) -> np.ndarray:
    """X_i (m × n_i) of this partition: the dataset named by ``dpfedc.dataset`` split with
    ``dpfedc.split`` over ``num_partitions`` clients (seeded, like every partitioner).
    """
    d, seed = settings.dpfedc, settings.seed
    data = load_clustering_data(d.dataset, d.data_dir or None, d.num_samples, seed)
    parts = split(data.y, num_partitions, d.split, seed)
    return check_data(data.x[parts[partition_id]].T, k, name=f"client {partition_id}'s data")


class ClusteringTask:
    """A DP-FedC round for the shared client round (:mod:`client.round`).

    Reads DP-FedC's section of the train config, X_i, the broadcast W and H_i^{t−1}; after the
    charge, keeps H_i^t on the client (:meth:`commit`).

    Raises
    ------
    ValueError, KeyError, FileNotFoundError
        On a malformed section, W of the wrong shape, or absent data.
    """

    def __init__(self, msg: Message, context: Context, profile: ClientProfile, cfg: TrainConfig) -> None:
        record = msg.content.config_records[keys.CONFIG]
        self.clustering: DPFedCRound | None = DPFedCRound.decode(record)
        self.params = self.clustering.params(cfg.batch_size)
        self.x = load_client_data(RunSettings.of(context.run_config), profile.partition_id, profile.num_partitions,
                                  self.params.k)
        self.w = check_centroids(msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays()[0], self.x.shape[0],
                                 self.params.k)
        self.num_examples = int(self.x.shape[1])
        self.context, self.cfg = context, cfg
        folder = profile.shard_cache or (str(Path(profile.ledger_path).parent) if profile.ledger_path else None)
        self.path = memberships_path(folder, profile.client_id, int(context.run_id))
        self.h = load_memberships(context, self.path, self.params.k, self.num_examples,
                                  client_seed(cfg.seed, profile.partition_id, 0))
        self._work: ClusteringWork | None = None

    def work(self, seed: int) -> ClusteringWork:
        """The round's :class:`ClusteringWork`; minibatches from ``seed`` (not DP randomness)."""
        grad_clip = self.clustering.grad_clip if self.clustering and self.clustering.grad_clip else math.inf
        self._work = ClusteringWork(self.x, self.h, self.w, self.cfg.server_round, self.params, grad_clip,
                                    np.random.default_rng(seed).random)
        return self._work

    def encode(self, upload: Upload) -> ArrayRecord:
        """W̃_i, in float64."""
        return ArrayRecord({"centroids": Array(np.asarray(upload.arrays[0], np.float64))})

    def commit(self) -> None:
        """Keep H_i^t (never in the reply)."""
        assert self._work is not None
        store_memberships(self.context, self.path, self._work.memberships)

    @staticmethod
    def count(settings: RunSettings, profile: ClientProfile) -> int:
        """n_i for the handshake."""
        return int(load_client_data(settings, profile.partition_id, profile.num_partitions, 1).shape[1])
