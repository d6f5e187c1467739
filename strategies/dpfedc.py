"""DP-FedC (Li, Wang, Chi, Quek 2023): differentially private federated clustering, server side.

Algorithm 1 (notes ``dpfedc.md`` §3.2), one round t:

1. the server samples S^t, |S^t| = K, uniformly, and sends W^t;
2. every sampled client runs Q₁ projected-gradient steps on its private H_i (kept on the
   client across rounds) and Q₂ᵗ minibatch SGD steps on a local copy of W
   (:func:`client.dpfedc.client_round`);
3. it uploads W̃_i = W_i + ξ_i (clipped and noised, :mod:`privacy.centroid_noise`);
4. the server takes the **plain mean** W^{t+1} = (1/K) Σ_{i∈S^t} W̃_i (eq. 20).

:class:`DPFedC` is that rule on the shared :class:`~strategies.base.PrivacyAwareFedAvg`
(handshake, budget-aware sampling, reply validation: a W of the wrong shape or a lying
σ is dropped with a logged reason). :func:`simulate` runs the same client code path in
one process for the reproduction (``experiments/dpfedc``), where every client updates its
H_i each round as the paper's Algorithm 1 does (line 7). :func:`run_dpfedc` is the
ServerApp's body for ``strategy = "dpfedc"``: it evaluates every round (accuracy with the
optimal cluster↔label matching, NMI, objective) on held-out data, whose memberships come
from the same H phase.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from privacy.centroid_noise import (
    CALIBRATIONS,
    paper_noise_multiplier,
    paper_round_epsilon,
)
from strategies import keys
from strategies.base import AcceptedReply, ClientAccount, PrivacyAwareFedAvg
from strategies.validation import ExpectedRelease, kebab, one_of
from tasks.clustering import (
    CLUSTERING_DATASETS,
    H_STEPS,
    SPLITS,
    ClusteringParams,
    cluster_labels,
    clustering_accuracy,
    h_phase,
    initial_memberships,
    local_objective,
    nmi,
    objective,
)

log = logging.getLogger("privet.strategy")


def plain_mean(uploads: Sequence[np.ndarray]) -> np.ndarray:
    """W^{t+1} = (1/K) Σ_i W̃_i (eq. 20): unweighted, not FedAvg's n_i weighting."""
    if not uploads:
        raise ValueError("no uploads to average")
    return np.mean(np.stack([np.asarray(u, np.float64) for u in uploads]), axis=0)


class DPFedCConfig(BaseModel):
    """The run config's ``dpfedc.*`` section (``[tool.flwr.app.config.dpfedc]``).

    Defaults are Table I's MNIST setting (K comes from ``fraction-train`` = K/N, b from
    ``batch-size``). ``rho``/``mu-h`` = 0 mean the paper's 10⁻⁷/10⁻¹⁰ × ‖X‖²_F/N computed
    by the server from the evaluation data's per-sample mean (a public constant).
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    dataset: str = "mnist"
    data_dir: str = ""
    num_samples: int = Field(10_000, ge=1)
    split: str = "iid"
    k: int = Field(10, ge=1)
    q1: int = Field(10, ge=1)
    q2: int = Field(5, ge=0)
    q_hat: int = Field(10, ge=0)
    h_step: str = "safe"
    alpha2: float = Field(5.0, gt=0.0)
    rho: float = Field(0.0, ge=0.0)
    mu_h: float = Field(0.0, ge=0.0)
    calibration: str = "rigorous"
    epsilon_bar: float = Field(20.0, gt=0.0)
    grad_clip: float = Field(0.0, ge=0.0)
    eval_samples: int = Field(2000, ge=10)
    planned_rounds: int = Field(0, ge=0)

    @classmethod
    def from_run_config(cls, run_config: dict) -> DPFedCConfig:
        """The section from Flower's flat run config (``dpfedc.*`` keys; absent = defaults)."""
        return cls.model_validate({k.split(".", 1)[1]: v for k, v in run_config.items() if k.startswith("dpfedc.")})

    @field_validator("dataset", "split", "h_step", "calibration")
    @classmethod
    def _choice(cls, v: str, info: ValidationInfo) -> str:
        allowed = {"dataset": CLUSTERING_DATASETS, "split": SPLITS, "h_step": H_STEPS, "calibration": CALIBRATIONS}
        return one_of(f"dpfedc.{kebab(info.field_name)}", v, allowed[info.field_name])


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
                 grad_clip: float = 0.0, num_clients: int = 100, planned_rounds: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        if calibration == "paper" and not grad_clip > 0:
            raise ValueError("dpfedc.calibration = 'paper' needs dpfedc.grad-clip (G) > 0")
        self.params = params
        self.calibration = calibration
        self.epsilon_bar = float(epsilon_bar)
        self.grad_clip = float(grad_clip)
        self.num_clients = int(num_clients)
        self.planned_rounds = int(planned_rounds)

    def refuse_declaration(self, account: ClientAccount) -> str | None:
        if account.num_examples < self.params.k:
            return f"holds {account.num_examples} samples, fewer than k={self.params.k} clusters"
        return None

    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        cfg = ConfigRecord(dict(config))
        cfg.update(dpfedc_train_config(self.params, self.calibration, self.epsilon_bar, self.grad_clip,
                                       self.fraction_train))
        cfg[keys.DPFEDC_PLANNED_ROUNDS] = self.planned_rounds
        return cfg

    def client_rate(self) -> float:
        """p = K/N, the paper's client sampling probability in (32)."""
        return float(self.fraction_train)

    def expected_release(self, server_round: int, account: ClientAccount) -> ExpectedRelease:
        """The paper calibration's z follows from public figures (ε̄, δ, n_i, Q₂ᵗ, b, K/N):
        the server recomputes it and rejects a reply whose σ differs."""
        if self.calibration != "paper" or self.dp_mode == keys.DP_NONE:
            return super().expected_release(server_round, account)
        n = account.num_examples
        q = self.params.w_steps(server_round) * min(self.params.batch, n) / n
        eps = paper_round_epsilon(self.epsilon_bar, q, self.client_rate(), int(self._train_config[keys.NUM_ROUNDS]))
        return ExpectedRelease(n, paper_noise_multiplier(eps, account.delta, q), 1.0, 1)

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """Eq. (20): the plain mean of the accepted W̃_i (each already shape-checked)."""
        return [plain_mean([r.arrays[0] for r in replies])]


def dpfedc_train_config(params: ClusteringParams, calibration: str, epsilon_bar: float, grad_clip: float,
                        client_rate: float) -> dict:
    """The DP-FedC keys of a client's train config."""
    return {
        keys.DPFEDC_K: params.k, keys.DPFEDC_RHO: params.rho, keys.DPFEDC_MU_H: params.mu_h,
        keys.DPFEDC_Q1: params.q1, keys.DPFEDC_Q2: params.q2, keys.DPFEDC_Q_HAT: params.q_hat,
        keys.BATCH_SIZE: params.batch, keys.DPFEDC_H_STEP: params.h_step, keys.DPFEDC_ALPHA2: params.alpha2,
        keys.DPFEDC_CALIBRATION: calibration, keys.DPFEDC_EPSILON_BAR: float(epsilon_bar),
        keys.DPFEDC_GRAD_CLIP: float(grad_clip), keys.DPFEDC_CLIENT_RATE: float(client_rate),
        keys.LOCAL_EPOCHS: 1,
    }


# ----------------------------------------------------------------------------- evaluation
def evaluate_centroids(x_cols: np.ndarray, labels: np.ndarray, w: np.ndarray, params: ClusteringParams,
                       h_steps: int = 50) -> dict[str, float]:
    """Accuracy, NMI and objective of W on labelled data whose memberships are computed by
    the same H phase (``h_steps`` projected-gradient steps from a fixed H⁰)."""
    h = h_phase(x_cols, w, initial_memberships(x_cols.shape[1], params.k, 0), params, steps=h_steps)
    pred = cluster_labels(h)
    return {"accuracy": clustering_accuracy(pred, labels), "nmi": nmi(pred, labels),
            "objective": local_objective(x_cols, w, h, params)}


# ----------------------------------------------------------------------------- simulation
@dataclass
class SimulationResult:
    """Per-round curves of one simulated run (round 0 = the shared initial point)."""

    accuracy: list[float] = field(default_factory=list)
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
    from client.dpfedc import client_round
    from privacy.centroid_noise import rigorous_epsilon

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
        res.accuracy.append(clustering_accuracy(pred, labels))
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


def schedule(num_clients: int, clients_per_round: int, rounds: int, seed: int) -> list[list[int]]:
    """S^1..S^R: K of N clients uniformly without replacement per round (seeded: public)."""
    rng = np.random.default_rng(seed)
    return [sorted(int(i) for i in rng.choice(num_clients, clients_per_round, replace=False)) for _ in range(rounds)]


# ----------------------------------------------------------------------------- ServerApp
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


def run_dpfedc(grid, cfg, run_id: int, out) -> dict:
    """The ServerApp body for ``strategy = "dpfedc"``: W⁰ out, rounds, per-round evaluation
    (accuracy / NMI / objective on ``eval-samples`` labelled samples, memberships by the H
    phase), results and a privacy report that states what the calibration means."""
    from server.registry import build_strategy, train_config
    from server.results import ResultsWriter
    from tasks.clustering import initial_point, load_clustering_data

    d = cfg.dpfedc
    data = load_clustering_data(d.dataset, d.data_dir or None, d.num_samples, cfg.seed)
    pick = np.random.default_rng(cfg.seed + 1).choice(len(data.y), min(d.eval_samples, len(data.y)), replace=False)
    x_eval, y_eval = data.x[pick].T, data.y[pick]
    writer = ResultsWriter(out, cfg)
    strategy = build_strategy(cfg)
    w0 = initial_point(x_eval.shape[0], d.k, cfg.seed)
    started = time.perf_counter()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        w = arrays.to_numpy_ndarrays()[0]
        m = evaluate_centroids(x_eval, y_eval, w, strategy.params)
        line = {"round": server_round, "accuracy": m["accuracy"], "nmi": m["nmi"], "objective": m["objective"],
                "loss": m["objective"], "elapsed_seconds": time.perf_counter() - started}
        if server_round > 0 and strategy.round_log and strategy.round_log[-1]["round"] == server_round:
            line.update(strategy.round_log[-1])
        writer.write_round(line)
        log.info("round %d: clustering accuracy %.4f NMI %.4f objective %.2f", server_round, m["accuracy"],
                 m["nmi"], m["objective"])
        return MetricRecord({"accuracy": m["accuracy"], "nmi": m["nmi"], "objective": m["objective"]})

    try:
        strategy.start(grid=grid, initial_arrays=ArrayRecord({"centroids": Array(w0)}),
                       num_rounds=cfg.num_server_rounds, timeout=cfg.round_timeout,
                       train_config=train_config(cfg), evaluate_fn=evaluate_fn)
    except BaseException as exc:
        writer.finish(strategy, time.perf_counter() - started, status=f"failed: {type(exc).__name__}: {exc}")
        raise
    summary = writer.finish(strategy, time.perf_counter() - started)
    note = calibration_note(cfg, summary)
    summary["dpfedc"] = note
    (out / "summary.json").write_text(__import__("json").dumps(summary, indent=2))
    with open(out / "privacy_report.md", "a") as fh:
        fh.write("\n## DP-FedC calibration\n\n" + note["statement"] + "\n")
    return summary


def calibration_note(cfg, summary: dict) -> dict:
    """What the run's ε means under its calibration (the report's DP-FedC section)."""
    d = cfg.dpfedc
    rig = [c["epsilon_server_recomputed_this_run"] for c in summary["clients"]]
    worst = max((e for e in rig if e is not None), default=None)
    if cfg.resolved_dp_mode == "none":
        text = "Non-private run (eps-bar = infinity): no noise, no guarantee."
    elif d.calibration == "paper":
        text = (f"Paper calibration (eq. 29, c0 = 1): eps-bar = {d.epsilon_bar:g} is the paper's NOMINAL figure, "
                f"not a guarantee (Lemma 1 needs eps < 1, c0 is unknown, and Theorem 1 is applied at a "
                f"data-sampling ratio >= 1/2). The rigorous eps of this same run (replace-one, the project's "
                f"{cfg.accountant} accountant, each upload a Gaussian release of the update clipped to Q2*G/eta) "
                f"is {worst if worst is not None else 'n/a'} at most over clients; it treats the step size eta "
                f"(from lambda_max(H_i H_i^T), data-dependent) as public.")
    else:
        text = (f"Rigorous calibration: every upload is the broadcast W plus the client's update clipped to "
                f"Frobenius norm C = {cfg.clip:g} plus N(0, z^2 C^2) noise, z calibrated by the client for its "
                f"budget with the {cfg.accountant} accountant; replace-one record-level (indeed client-level) "
                f"(eps, delta)-DP, charged to each client's ledger. Largest eps this run: {worst}.")
    return {"calibration": d.calibration if cfg.resolved_dp_mode != "none" else "none",
            "nominal_epsilon_bar": d.epsilon_bar if d.calibration == "paper" else None,
            "rigorous_epsilon_max": worst, "statement": text}

