"""The privet ServerApp: validate the config, run the strategy, evaluate, write results."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from protocol.log import route_privet_logs_to_flower
from server.config import ConfigError, RunConfig
from server.evaluation import EVALUATORS
from server.federation import check_federation
from server.prompt_grid import prompt
from server.registry import build_strategy, train_config
from server.results import ResultsWriter
from server.summary_schema import RunSummary
from strategies.catalogue import CATALOGUE

log = logging.getLogger("privet.server")
route_privet_logs_to_flower()

app = ServerApp()


def results_dir(cfg: RunConfig, run_id: int) -> Path:
    """``out-dir`` if set, else ``./results/run-<id>`` relative to the server's cwd."""
    return Path(cfg.out_dir) if cfg.out_dir else Path.cwd() / "results" / f"run-{run_id}"


def run_experiment(grid: Grid, run_config: dict, run_id: int) -> RunSummary:
    """Everything ``main`` does, callable with any Grid (the tests use an in-process one).

    The body is the same for every strategy: the catalogue entry's task supplies the evaluator
    (:mod:`server.evaluation`: the model's accuracy, or DP-FedC's clustering accuracy and NMI).
    A wrong federation size or absent data is refused before the results directory exists.
    """
    try:
        cfg = RunConfig.from_flower(run_config)
        check_federation(grid, cfg)
        evaluator = EVALUATORS[CATALOGUE[cfg.strategy].task](cfg)
    except ConfigError as exc:
        log.error("%s", exc)
        raise
    out = results_dir(cfg, run_id)
    writer = ResultsWriter(out, cfg)
    log.info("privet: strategy=%s dp-mode=%s rounds=%d results in %s",
             cfg.strategy, cfg.resolved_dp_mode, cfg.num_server_rounds, out)
    strategy = build_strategy(cfg)
    started = time.perf_counter()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        measured = evaluator.measure(arrays)
        line = {"round": server_round, **measured, "elapsed_seconds": time.perf_counter() - started}
        result = strategy.round_result(server_round) if server_round > 0 else None
        if result is not None:
            line.update(result.to_json())
        writer.write_round(line)
        if server_round == cfg.num_server_rounds or server_round in cfg.checkpoint_rounds:
            writer.save_model(server_round, {name: array.numpy() for name, array in arrays.items()},
                              final=server_round == cfg.num_server_rounds)
        log.info("round %d: %s accuracy %.4f loss %.4g", server_round, cfg.evaluation_split, measured["accuracy"],
                 measured["loss"])
        return MetricRecord({"accuracy": measured["accuracy"], "loss": measured["loss"]})

    try:
        strategy.start(grid=grid, initial_arrays=evaluator.initial_arrays(), num_rounds=cfg.num_server_rounds,
                       timeout=cfg.round_timeout, train_config=train_config(cfg), evaluate_fn=evaluate_fn)
    except BaseException as exc:  # whatever happened (also SystemExit when Flower stops the run),
        # the summary and privacy report say what the server knows
        from server.results import ended_by

        status = ended_by(exc, strategy)  # "interrupted ..." (a signal, Flower's stop) or "failed: ..."
        if status.startswith("interrupted"):
            log.warning("privet: the run was %s; writing what the server knows to %s", status.split(";")[0], out)
        else:
            log.exception("privet: the run failed; writing what the server knows to %s", out)
        writer.finish(strategy, time.perf_counter() - started, status=status)
        raise
    summary = writer.finish(strategy, time.perf_counter() - started)
    evaluator.annotate(summary, out)
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
    from server.simulation_state import index_simulation_state  # Flower's link state: 0.5 s of imports

    index_simulation_state(grid)
    run_experiment(prompt(grid), dict(context.run_config), int(context.run_id))
