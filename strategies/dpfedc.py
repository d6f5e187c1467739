"""DP-FedC (Li, Wang, Chi, Quek 2023): differentially private federated clustering, server side.

Algorithm 1 (``docs/notes/dpfedc.md`` §3.2), one round t:

1. the server samples S^t, |S^t| = K, uniformly, and sends W^t;
2. every sampled client runs Q₁ projected-gradient steps on its private H_i (kept on the
   client across rounds) and Q₂ᵗ minibatch SGD steps on a local copy of W
   (:func:`client.dpfedc.client_round`);
3. it uploads W̃_i = W_i + ξ_i (clipped and noised, :mod:`privacy.centroid_noise`);
4. the server takes the **plain mean** W^{t+1} = (1/K) Σ_{i∈S^t} W̃_i (eq. 20).

:class:`DPFedC` is that rule on the shared :class:`~strategies.base.PrivacyAwareFedAvg`
(handshake, budget-aware sampling, reply validation: a W of the wrong shape or a lying
σ is dropped with a logged reason). :func:`privet.dpfedc_simulation.simulate` runs the same
client code path in one process for the reproduction (``experiments/dpfedc``), where every
client updates its H_i each round as the paper's Algorithm 1 does (line 7).
:class:`server.evaluation.ClusteringEvaluator` measures the centroids each round for the server body.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Unpack

import numpy as np
from flwr.app import ConfigRecord
from typing_extensions import override

from protocol import keys
from protocol.budget_query import BudgetQuery
from protocol.dpfedc import DPFedCRound
from strategies.base import AcceptedReply, ClientAccount, PrivacyAwareFedAvg, StrategyOptions
from tasks.clustering import (
    ClusteringParams,
    accuracies,
    cluster_labels,
    h_phase,
    initial_memberships,
    local_objective,
    nmi,
)

log = logging.getLogger("privet.strategy")


def plain_mean(uploads: Sequence[np.ndarray]) -> np.ndarray:
    """W^{t+1} = (1/K) Σ_i W̃_i (eq. 20): unweighted, not FedAvg's n_i weighting."""
    if not uploads:
        raise ValueError("no uploads to average")
    return np.mean(np.stack([np.asarray(u, np.float64) for u in uploads]), axis=0)


class DPFedC(PrivacyAwareFedAvg):
    """The DP-FedC server: W out, the plain mean of the K noisy W̃_i back.

    Parameters
    ----------
    params : ClusteringParams
        k, Q₁, Q₂, b, ρ, μ_h, ... sent to every client in its train config.
    calibration : {"rigorous", "paper", "none"}
        How clients noise their uploads (:mod:`privacy.centroid_noise`).
    epsilon_bar : float
        The paper's nominal ε̄ (``calibration = "paper"`` only).
    grad_clip : float
        G, the per-minibatch gradient bound (0: none; required by ``"paper"``).
    num_clients : int
        N, for the paper's p = K/N in (32).

    Other parameters: :class:`~strategies.base.PrivacyAwareFedAvg`.
    """

    def __init__(self, *, params: ClusteringParams, calibration: str = "rigorous", epsilon_bar: float = 20.0,
                 grad_clip: float = 0.0, num_clients: int = 100, planned_rounds: int = 0,
                 **options: Unpack[StrategyOptions]) -> None:
        super().__init__(**options)
        if calibration == "paper" and not grad_clip > 0:
            raise ValueError("dpfedc.calibration = 'paper' needs dpfedc.grad-clip (G) > 0")
        self.params = params
        self.calibration = calibration
        self.epsilon_bar = float(epsilon_bar)
        self.grad_clip = float(grad_clip)
        self.num_clients = int(num_clients)
        self.planned_rounds = int(planned_rounds)

    @override
    def refuse_declaration(self, account: ClientAccount) -> str | None:
        if account.num_examples < self.params.k:
            return f"holds {account.num_examples} samples, fewer than k={self.params.k} clusters"
        return None

    def budget_query(self) -> BudgetQuery:
        """The handshake tells a client it is a clustering run (its data is the clustering set)."""
        return replace(super().budget_query(), task=keys.TASK_CLUSTERING)

    @override
    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        cfg = ConfigRecord(dict(config))
        cfg.update(dpfedc_train_config(self.params, self.calibration, self.epsilon_bar, self.grad_clip,
                                       self.fraction_train, self.planned_rounds))
        return cfg

    def client_rate(self) -> float:
        """P = K/N, the paper's client sampling probability in (32)."""
        return float(self.fraction_train)

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """Eq. (20): the plain mean of the accepted W̃_i (each already shape-checked)."""
        return [plain_mean([r.arrays[0] for r in replies])]


def dpfedc_train_config(params: ClusteringParams, calibration: str, epsilon_bar: float, grad_clip: float,
                        client_rate: float, planned_rounds: int = 0) -> dict:
    """The DP-FedC entries of a client's train config (:class:`protocol.dpfedc.DPFedCRound`)."""
    section = DPFedCRound(k=params.k, rho=params.rho, mu_h=params.mu_h, q1=params.q1, q2=params.q2,
                          q_hat=params.q_hat, h_step=params.h_step, alpha2=params.alpha2, calibration=calibration,
                          epsilon_bar=float(epsilon_bar), grad_clip=float(grad_clip),
                          client_rate=float(client_rate), planned_rounds=planned_rounds)
    return {**section.encode(), keys.BATCH_SIZE: params.batch, keys.LOCAL_EPOCHS: 1, keys.TASK: keys.TASK_CLUSTERING}


# ----------------------------------------------------------------------------- evaluation
def evaluate_centroids(x_cols: np.ndarray, labels: np.ndarray, w: np.ndarray, params: ClusteringParams,
                       h_steps: int = 50) -> dict[str, float]:
    """Both accuracies, NMI and objective of W on labelled data whose memberships are computed by
    the same H phase (``h_steps`` projected-gradient steps from a fixed H⁰).

    ``accuracy``: the optimal one-to-one cluster↔label matching (Hungarian);
    ``accuracy_majority``: every cluster mapped to its most frequent label (>= ``accuracy``);
    the paper does not say which it reports (:mod:`tasks.clustering`). The dict is the
    round's evaluation line in ``rounds.jsonl``.
    """
    h = h_phase(x_cols, w, initial_memberships(x_cols.shape[1], params.k, 0), params, steps=h_steps)
    pred = cluster_labels(h)
    return {**accuracies(pred, labels), "nmi": nmi(pred, labels),
            "objective": local_objective(x_cols, w, h, params)}


def schedule(num_clients: int, clients_per_round: int, rounds: int, seed: int) -> list[list[int]]:
    """S^1..S^R: K of N clients uniformly without replacement per round (seeded: public)."""
    rng = np.random.default_rng(seed)
    return [sorted(int(i) for i in rng.choice(num_clients, clients_per_round, replace=False)) for _ in range(rounds)]

def strategy_params(cfg) -> dict:
    """``DPFedC``'s own keyword arguments from a validated ``RunConfig`` (registry)."""
    d = cfg.dpfedc
    rho, mu_h = d.rho, d.mu_h
    if rho == 0 or mu_h == 0:  # the paper's 1e-7 / 1e-10 × ‖X‖²/N (the experimenter's data)
        from tasks.clustering import load_clustering_data

        data = load_clustering_data(d.dataset, d.data_dir or None, d.num_samples, cfg.seed)
        scale = float(np.sum(data.x ** 2)) / cfg.num_clients
        rho, mu_h = rho or 1e-7 * scale, mu_h or 1e-10 * scale
    params = ClusteringParams(k=d.k, rho=rho, mu_h=mu_h, q1=d.q1, q2=d.q2, q_hat=d.q_hat, batch=cfg.batch_size,
                              h_step=d.h_step, alpha2=d.alpha2)
    return {"params": params, "calibration": d.calibration, "epsilon_bar": d.epsilon_bar,
            "grad_clip": d.grad_clip, "num_clients": cfg.num_clients, "planned_rounds": d.planned_rounds}
