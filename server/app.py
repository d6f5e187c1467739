"""The privet ServerApp: validate the config, run the strategy, evaluate, write results."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from server.config import ConfigError, RunConfig
from server.federation import check_federation
from server.registry import build_strategy, train_config
from server.results import ResultsWriter, RunSummary
from protocol.log import route_privet_logs_to_flower
from server.prompt_grid import prompt
from server.simulation_state import index_simulation_state
from tasks.datasets import check_available, evaluation_set, load_dataset
from tasks.models import build_model, evaluate, get_weights, set_weights, weight_names

log = logging.getLogger("privet.server")
route_privet_logs_to_flower()

app = ServerApp()


def results_dir(cfg: RunConfig, run_id: int) -> Path:
    """``out-dir`` if set, else ``./results/run-<id>`` relative to the server's cwd."""
    return Path(cfg.out_dir) if cfg.out_dir else Path.cwd() / "results" / f"run-{run_id}"


def run_experiment(grid: Grid, run_config: dict, run_id: int) -> RunSummary:
    """Everything ``main`` does, callable with any Grid (the tests use an in-process one)."""
    try:
        cfg = RunConfig.from_flower(run_config)
    except ConfigError as exc:
        log.error("%s", exc)
        raise
    if cfg.strategy == "dpfedc":  # DP-FedC (issue 14): a clustering task, not a model
        from server.dpfedc_run import run_dpfedc
        from tasks.clustering import load_clustering_data

        try:
            check_federation(grid, cfg)
            load_clustering_data(cfg.dpfedc.dataset, cfg.dpfedc.data_dir or None, cfg.dpfedc.num_samples, cfg.seed)
        except (ConfigError, FileNotFoundError, ValueError) as exc:
            log.error("%s", exc)
            raise ConfigError(str(exc)) from None
        return run_dpfedc(grid, cfg, run_id, results_dir(cfg, run_id))
    # refused before the results directory exists: a wrong federation size, absent data
    try:
        check_federation(grid, cfg)
        check_available(cfg.dataset, cfg.data_dir or None)
    except (ConfigError, FileNotFoundError) as exc:
        log.error("%s", exc)
        raise ConfigError(str(exc)) from None
    out = results_dir(cfg, run_id)
    writer = ResultsWriter(out, cfg)
    log.info("privet: strategy=%s dp-mode=%s rounds=%d results in %s",
             cfg.strategy, cfg.resolved_dp_mode, cfg.num_server_rounds, out)

    splits = load_dataset(cfg.dataset, cfg.data_dir or None)
    evaluation = evaluation_set(splits, cfg.evaluation_split)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, input_shape=tuple(splits.train.x.shape[1:]),
                        num_classes=splits.train.num_classes, seed=cfg.seed)
    initial = ArrayRecord({n: Array(np.asarray(w)) for n, w in zip(weight_names(model), get_weights(model))})
    strategy = build_strategy(cfg)
    started = time.perf_counter()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        set_weights(model, arrays.to_numpy_ndarrays())
        loss, accuracy = evaluate(model, evaluation)
        line = {"round": server_round, "accuracy": float(accuracy), "loss": float(loss),
                "elapsed_seconds": time.perf_counter() - started}
        result = strategy.round_result(server_round) if server_round > 0 else None
        if result is not None:
            line.update(result.to_json())
        writer.write_round(line)
        if server_round == cfg.num_server_rounds or server_round in cfg.checkpoint_rounds:
            writer.save_model(server_round, {name: array.numpy() for name, array in arrays.items()},
                              final=server_round == cfg.num_server_rounds)
        log.info("round %d: %s accuracy %.4f loss %.4f", server_round, cfg.evaluation_split, accuracy, loss)
        return MetricRecord({"accuracy": float(accuracy), "loss": float(loss)})

    try:
        strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=cfg.num_server_rounds,
            timeout=cfg.round_timeout,
            train_config=train_config(cfg),
            evaluate_fn=evaluate_fn,
        )
    except BaseException as exc:  # whatever happened (also SystemExit when Flower stops the run),
        # the summary and privacy report say what the server knows
        log.exception("privet: the run failed; writing what the server knows to %s", out)
        writer.finish(strategy, time.perf_counter() - started, status=f"failed: {type(exc).__name__}: {exc}")
        raise
    summary = writer.finish(strategy, time.perf_counter() - started)
    if summary["failed_rounds"]:  # never passes as completed (summary.json says why)
        raise RuntimeError(f"privet: the run is {summary['status']}; see {out / 'privacy_report.md'}")
    log.info("privet: final accuracy %s; results in %s", summary["final_accuracy"], out)
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point (``server.app:app``).

    A deployed grid answers promptly (:mod:`server.prompt_grid`); Flower's simulation looks its
    message store up by node (:mod:`server.simulation_state`).
    """
    index_simulation_state(grid)
    run_experiment(prompt(grid), dict(context.run_config), int(context.run_id))
