"""What the global "model" of a run is, and how the server measures it: one evaluator per task.

A catalogue entry names its task (:data:`strategies.catalogue.CATALOGUE`): ``model`` (the run's
neural network, its accuracy and loss on the evaluation split) or ``clustering`` (DP-FedC's
centroids, their clustering accuracy, NMI and objective on held-out labelled data whose
memberships come from the same H phase as the clients'). The server body (:mod:`server.app`) is
the same for both; the evaluator supplies the initial arrays, each round's measurement and what
the report adds about the task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from protocol import keys
from server.config import ConfigError, RunConfig
from server.privacy_report import format_privacy_report
from server.summary_schema import RunSummary
from tasks.datasets import check_available, load_dataset
from tasks.models import build_model, evaluate, get_weights, set_weights, weight_names
from tasks.validation_split import evaluation_set


class Evaluator(Protocol):
    """The task's side of the server body."""

    def initial_arrays(self) -> ArrayRecord:
        """The global model before round 1."""

    def measure(self, arrays: ArrayRecord) -> dict[str, float]:
        """This round's figures (``accuracy`` and ``loss`` at least)."""

    def annotate(self, summary: RunSummary, out: Path) -> None:
        """Add what the task says about the run to ``summary.json`` and the privacy report."""


class ModelEvaluator:
    """The run's model: accuracy and loss on the evaluation split (``test`` or ``validation``)."""

    def __init__(self, cfg: RunConfig) -> None:
        try:
            check_available(cfg.dataset, cfg.data_dir or None)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
        splits = load_dataset(cfg.dataset, cfg.data_dir or None)
        self.evaluation = evaluation_set(splits, cfg.evaluation_split)
        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.model, input_shape=tuple(splits.train.x.shape[1:]),
                                 num_classes=splits.train.num_classes, seed=cfg.seed)

    def initial_arrays(self) -> ArrayRecord:
        """The model's seeded initial weights."""
        return ArrayRecord({n: Array(np.asarray(w)) for n, w in zip(weight_names(self.model),
                                                                    get_weights(self.model), strict=True)})

    def measure(self, arrays: ArrayRecord) -> dict[str, float]:
        """Accuracy and loss of the global model."""
        set_weights(self.model, arrays.to_numpy_ndarrays())
        loss, accuracy = evaluate(self.model, self.evaluation)
        return {"accuracy": float(accuracy), "loss": float(loss)}

    def annotate(self, summary: RunSummary, out: Path) -> None:
        """Nothing to add."""


class ClusteringEvaluator:
    """DP-FedC's centroids on ``dpfedc.eval-samples`` labelled samples (memberships by the H phase)."""

    def __init__(self, cfg: RunConfig) -> None:
        from strategies.dpfedc import strategy_params
        from tasks.clustering import load_clustering_data

        d = cfg.dpfedc
        try:
            data = load_clustering_data(d.dataset, d.data_dir or None, d.num_samples, cfg.seed)
        except (FileNotFoundError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        pick = np.random.default_rng(cfg.seed + 1).choice(len(data.y), min(d.eval_samples, len(data.y)),
                                                          replace=False)
        self.x, self.y = data.x[pick].T, data.y[pick]
        self.params = strategy_params(cfg)["params"]
        self.cfg = cfg

    def initial_arrays(self) -> ArrayRecord:
        """W⁰, data-independent and seeded."""
        from tasks.clustering import initial_point

        return ArrayRecord({"centroids": Array(initial_point(self.x.shape[0], self.params.k, self.cfg.seed))})

    def measure(self, arrays: ArrayRecord) -> dict[str, float]:
        """Clustering accuracy (both matchings), NMI and the objective (reported as the loss too)."""
        from strategies.dpfedc import evaluate_centroids

        m = evaluate_centroids(self.x, self.y, arrays.to_numpy_ndarrays()[0], self.params)
        return {**{k: float(v) for k, v in m.items()}, "loss": float(m["objective"])}

    def annotate(self, summary: RunSummary, out: Path) -> None:
        """What the run's ε means under its calibration: ``summary.json`` and a report section."""
        summary["dpfedc"] = calibration_note(self.cfg, summary)
        summary["report_sections"] = ["dpfedc"]
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        (out / "privacy_report.md").write_text(format_privacy_report(summary))  # renders the note's section


#: ``task`` -> its evaluator (a catalogue entry names the task)
EVALUATORS: dict[str, type[ModelEvaluator] | type[ClusteringEvaluator]] = {
    keys.TASK_MODEL: ModelEvaluator, keys.TASK_CLUSTERING: ClusteringEvaluator}


def calibration_note(cfg: RunConfig, summary: RunSummary) -> dict[str, Any]:
    """What a DP-FedC run's ε means under its calibration (the report's DP-FedC section)."""
    d = cfg.dpfedc
    rig = [c["epsilon_server_recomputed_this_run"] for c in summary["clients"]]
    worst = max((e for e in rig if e is not None), default=None)
    if d.calibration == "none":  # validated: only with dp-mode none
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
    return {"title": "DP-FedC calibration", "calibration": d.calibration,
            "nominal_epsilon_bar": d.epsilon_bar if d.calibration == "paper" else None,
            "rigorous_epsilon_max": worst, "statement": text}
