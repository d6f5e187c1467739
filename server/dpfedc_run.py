"""The ServerApp's body for ``strategy = "dpfedc"`` (paper 004): a clustering run.

The strategy (:class:`strategies.dpfedc.DPFedC`) runs the rounds; this module adds what a
clustering run reports instead of a model's accuracy: every round, the centroids' accuracy
(optimal cluster↔label matching), NMI and objective on held-out data whose memberships come
from the same H phase as the clients', and a privacy-report section that states what the
calibration means.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord

from server.registry import build_strategy, train_config
from server.results import ResultsWriter, RunSummary
from strategies.dpfedc import DPFedC, evaluate_centroids
from tasks.clustering import initial_point, load_clustering_data

log = logging.getLogger("privet.strategy")


def run_dpfedc(grid, cfg, run_id: int, out) -> RunSummary:
    """The ServerApp body for ``strategy = "dpfedc"``: W⁰ out, rounds, per-round evaluation
    (accuracy / NMI / objective on ``eval-samples`` labelled samples, memberships by the H
    phase), results and a privacy report that states what the calibration means."""
    d = cfg.dpfedc
    data = load_clustering_data(d.dataset, d.data_dir or None, d.num_samples, cfg.seed)
    pick = np.random.default_rng(cfg.seed + 1).choice(len(data.y), min(d.eval_samples, len(data.y)), replace=False)
    x_eval, y_eval = data.x[pick].T, data.y[pick]
    writer = ResultsWriter(out, cfg)
    strategy = build_strategy(cfg)
    assert isinstance(strategy, DPFedC)
    w0 = initial_point(x_eval.shape[0], d.k, cfg.seed)
    started = time.perf_counter()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        w = arrays.to_numpy_ndarrays()[0]
        m = evaluate_centroids(x_eval, y_eval, w, strategy.params)
        line = {"round": server_round, "accuracy": m["accuracy"], "nmi": m["nmi"], "objective": m["objective"],
                "loss": m["objective"], "elapsed_seconds": time.perf_counter() - started}
        result = strategy.round_result(server_round) if server_round > 0 else None
        if result is not None:
            line.update(result.to_json())
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
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(out / "privacy_report.md", "a") as fh:
        fh.write("\n## DP-FedC calibration\n\n" + note["statement"] + "\n")
    return summary


def calibration_note(cfg, summary: RunSummary) -> dict:
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
