"""DP-FedC's Algorithm 1 in one process, for the reproduction (``experiments/dpfedc``).

It composes both sides (the Flower client's own :func:`client.dpfedc.client_round` and the
server's eq. (20) :func:`strategies.dpfedc.plain_mean`), so it lives in the composition root,
not in either side. Unlike a Flower run, every client updates its H_i every round, as the
paper's Algorithm 1 does (line 7).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from client.dpfedc import client_round
from privacy.centroid_noise import rigorous_epsilon
from strategies.dpfedc import plain_mean, schedule
from tasks.clustering import (
    ClusteringParams,
    accuracies,
    cluster_labels,
    initial_memberships,
    nmi,
    objective,
)


@dataclass
class SimulationResult:
    """Per-round curves of one simulated run (round 0 = the shared initial point)."""

    accuracy: list[float] = field(default_factory=list)  # one-to-one (Hungarian) matching
    accuracy_majority: list[float] = field(default_factory=list)  # every cluster to its majority label
    nmi: list[float] = field(default_factory=list)
    objective: list[float] = field(default_factory=list)
    epsilon: dict[int, float] = field(default_factory=dict)  # client -> rigorous ε of the rounds joined
    seconds: float = 0.0


def simulate(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], w0: np.ndarray, params: ClusteringParams, *,
             rounds: int, clients_per_round: int, privacy_of, sampling_seed: int, data_seed: int,
             noise, all_update_h: bool = True) -> tuple[np.ndarray, SimulationResult]:
    """Algorithm 1 in one process, with the Flower client's own :func:`client_round`.

    ``xs[i]`` is X_i (m × n_i), ``ys[i]`` its labels (evaluation only). ``privacy_of(i, t)``
    gives the :class:`client.dpfedc.RoundPrivacy` of client i in round t. Clients are
    sampled uniformly without replacement (K of N) with ``sampling_seed``; minibatches from
    ``data_seed``; ``noise`` is the DP noise source. Accuracy/NMI use argmax H_i over all
    clients (paper §VI-A), the objective is F = (1/N)ΣF_i at (W^{t+1}, H^t).
    """
    start = time.perf_counter()
    n_clients = len(xs)
    hs = [initial_memberships(x.shape[1], params.k, data_seed * 1000 + i) for i, x in enumerate(xs)]
    plan = schedule(len(xs), clients_per_round, rounds, sampling_seed)
    batches = np.random.default_rng(data_seed)
    w = np.asarray(w0, np.float64).copy()
    labels = np.concatenate(ys)
    res = SimulationResult()
    joined: dict[int, list[float]] = {}

    def record(w_now: np.ndarray) -> None:
        pred = np.concatenate([cluster_labels(h) for h in hs])
        acc = accuracies(pred, labels)
        res.accuracy.append(acc["accuracy"])
        res.accuracy_majority.append(acc["accuracy_majority"])
        res.nmi.append(nmi(pred, labels))
        res.objective.append(objective(xs, w_now, hs, params))

    record(w)
    for t in range(1, rounds + 1):
        sampled = set(plan[t - 1])
        uploads = []
        for i in range(n_clients):
            if i not in sampled and not all_update_h:
                continue
            out = client_round(xs[i], hs[i], w, t, params, privacy_of(i, t), batches.random, noise,
                               upload=i in sampled)
            hs[i] = out.memberships
            if i in sampled:
                uploads.append(out.upload)
                if out.release is not None:
                    joined.setdefault(i, []).append(out.release.noise_multiplier)
        w = plain_mean(uploads)                                 # eq. (20)
        record(w)
    res.epsilon = {i: rigorous_epsilon(z, privacy_of(i, 1).delta) for i, z in joined.items()}
    res.seconds = time.perf_counter() - start
    return w, res
