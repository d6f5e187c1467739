"""What a user meets before and while a run goes: validation, help, console, federation size."""

from __future__ import annotations

import io
import logging
import tomllib
from pathlib import Path

import pytest

from privet import cli, flower_sim
from server.config import ConfigError, RunConfig
from server.console import RunConsole, logs_to, parse_line
from server.federation import check_federation, mismatch_message, settled_node_count
from tasks.dataset_files import EMNIST_SPLITS
from tasks.datasets import check_available
from tasks.idx import idx_write


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# ------------------------------------------------------------------ validation
def test_toml_syntax_error_names_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "exp.toml"
    text = 'strategy = "fedavg-hdp"\nnum-clients = 4\nseed = = 3\n'
    bad.write_text(text)
    code, out = run_cli(["run", str(bad), "--out", str(tmp_path / "res")], capsys)
    with pytest.raises(tomllib.TOMLDecodeError) as exc:  # the parser's own position, independently
        tomllib.loads(text)
    assert "line 3, column 8" in str(exc.value)
    assert code == 2
    assert f"{bad}:3:8: TOML syntax error" in out
    assert "seed = = 3" in out and "Traceback" not in out
    assert not (tmp_path / "res").exists()


def test_missing_dataset_is_refused_before_a_results_directory_exists(tmp_path, capsys):
    out_dir = tmp_path / "res"
    code, out = run_cli(["run", "--set", "dataset=mnist", "--set", f"data-dir={tmp_path}", "--out", str(out_dir)],
                        capsys)
    assert code == 2
    assert "'dataset' = 'mnist' is not available here" in out
    assert "train-images-idx3-ubyte" in out and "--set data-dir=PATH" in out  # what is missing, how to get it
    assert not out_dir.exists()


def test_check_available_accepts_files_the_loader_reads(tmp_path):
    import numpy as np

    for split in ("train", "test"):
        idx_write(tmp_path / f"emnist-digits-{split}-images-idx3-ubyte.gz", np.zeros((3, 28, 28), np.uint8))
        idx_write(tmp_path / f"emnist-digits-{split}-labels-idx1-ubyte", np.zeros(3, np.uint8))
    check_available("emnist-digits", str(tmp_path))
    from tasks.datasets import load_dataset

    assert len(load_dataset("emnist-digits", str(tmp_path)).train) == 3
    with pytest.raises(FileNotFoundError, match="emnist-letters-train-images"):
        check_available("emnist-letters", str(tmp_path))


@pytest.mark.parametrize("split", sorted(EMNIST_SPLITS))
def test_every_emnist_split_the_loader_supports_is_a_valid_config(split):
    assert RunConfig.from_flower({"dataset": f"emnist-{split}"}).dataset == f"emnist-{split}"


def test_unknown_dataset_lists_what_is_accepted():
    with pytest.raises(ConfigError, match=r"emnist-<.*letters.*> or hf:<name>"):
        RunConfig.from_flower({"dataset": "emnist-nope"})


def test_fedavg_alone_says_to_set_budget_distribution_none(capsys):
    code, out = run_cli(["run", "--set", "strategy=fedavg"], capsys)
    assert code == 2
    assert "budget-distribution=none" in out and "'fedavg'" in out
    RunConfig.from_flower({"strategy": "fedavg", "budget-distribution": "none"})  # and that is enough


def test_type_errors_read_as_english(capsys):
    code, out = run_cli(["run", "--set", "num-clients=2.5"], capsys)
    assert code == 2 and "'num-clients' must be an integer; found 2.5" in out


# ------------------------------------------------------------------------ help
@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["report", "--help"]])
def test_help_says_what_and_shows_examples(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "privet " in text.split("examples:")[1]
    assert "The ``privet`` command" not in text


# ------------------------------------------------------------------ federation
class Nodes:
    """A grid whose node count is whatever the test says, on a fake clock."""

    def __init__(self, counts: list[int]) -> None:
        self.counts, self.t = counts, 0.0

    def get_node_ids(self) -> list[int]:
        return list(range(self.counts[min(int(self.t / 0.25), len(self.counts) - 1)]))

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_node_count_settles_after_registration():
    grid = Nodes([0, 0, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3])  # nodes registering one after another
    assert settled_node_count(grid, clock=grid.clock, sleep=grid.sleep) == 3


def test_simulation_of_another_size_is_refused(monkeypatch):
    import server.federation as fed

    monkeypatch.setattr(fed, "is_simulation", lambda grid: True)
    monkeypatch.setattr(fed, "settled_node_count", lambda grid: 2)
    with pytest.raises(ConfigError) as exc:
        check_federation(object(), RunConfig(num_clients=10))
    assert str(exc.value) == mismatch_message(2, 10)
    assert 'flwr run . --federation-config "num-supernodes=10 client-resources-num-cpus=1"' in str(exc.value)
    monkeypatch.setattr(fed, "settled_node_count", lambda grid: 10)
    check_federation(object(), RunConfig(num_clients=10))


def test_deployment_grids_are_not_checked():
    from client.app import app
    from privet.inprocess import InProcessGrid, simulation_node_configs

    grid = InProcessGrid(app, simulation_node_configs(2), {})
    check_federation(grid, RunConfig(num_clients=10))  # nodes of a deployment come when they come


# --------------------------------------------------------------------- console
STREAM = """\
\x1b[92mINFO \x1b[0m:      round 1: sampled clients ['0', '1', '2'] of 3 connected
\x1b[36m(ClientAppActor pid=7535)\x1b[0m /x/opacus/utils/fast_gradient_clipping_utils.py:192: UserWarning: Full backward hook is firing when gradients are computed
\x1b[36m(ClientAppActor pid=7535)\x1b[0m   reduced_loss.backward(retain_graph=True)
\x1b[36m(ClientAppActor pid=7535)\x1b[0m \x1b[92mINFO \x1b[0m:      client 0 round 1 mode=dpsgd sigma=1.229 eps_spent=3.8725/5.42338
\x1b[36m(ClientAppActor pid=7533)\x1b[0m \x1b[92mINFO \x1b[0m:      client 1 round 1 mode=dpsgd sigma=1.244 eps_spent=3.8103/5.34108
\x1b[93mWARNING \x1b[0m:   round 1: client 2 dropped out (no reply)
\x1b[92mINFO \x1b[0m:      \t└──> Aggregated MetricRecord: {'num-accepted': 2, 'max-epsilon-spent': 3.8725}
11/24/2026 21:27:25:INFO:\t└──> Aggregated MetricRecord: {'num-accepted': 2, 'max-epsilon-spent': 3.8725}
\x1b[92mINFO \x1b[0m:      round 1: test accuracy 0.1555 loss 2.2741
"""


def feed_stream(verbose: bool) -> tuple[RunConsole, str]:
    log = io.StringIO()
    console = RunConsole(3, log=log, verbose=verbose, out=io.StringIO())
    with console:
        for line in STREAM.splitlines(keepends=True):
            console.feed(line)
    return console, log.getvalue()


def test_console_is_quiet_by_default_and_tracks_progress():
    console, _ = feed_stream(verbose=False)
    assert not console.interactive  # a StringIO is not a terminal: plain text, no live display
    assert console.shown == [
        "WARNING: round 1: client 2 dropped out (no reply)",
        "round 1/3: test accuracy 0.1555, max eps spent 3.873",
    ]
    assert (console.rounds_done, console.clients_total, console.clients_done) == (1, 3, 3)


def test_run_log_has_every_line_once_without_colour_codes():
    console, log = feed_stream(verbose=True)
    assert "\x1b[" not in log and "\x1b[" not in "".join(console.shown)
    assert log.count("Aggregated MetricRecord") == 1  # the log stream's copy of the line is dropped
    assert "reduced_loss.backward" not in log  # the warning's source line went with it
    assert "Full backward hook" in log  # the log keeps what the console drops
    assert not any("Full backward hook" in s for s in console.shown)
    expected = "client 0 round 1 mode=dpsgd sigma=1.229 eps_spent=3.8725/5.42338"
    assert parse_line(STREAM.splitlines()[3]) == ("INFO", expected)


def test_inprocess_logs_reach_the_console_once():
    log = io.StringIO()
    console = RunConsole(1, log=log, out=io.StringIO())
    with console, logs_to(console):
        logging.getLogger("flwr").info("[ROUND 1/1]")
        logging.getLogger("privet.server").warning("round 1: client 3 dropped out (no reply)")
    assert log.getvalue().splitlines() == ["INFO: [ROUND 1/1]", "WARNING: round 1: client 3 dropped out (no reply)"]
    assert console.shown == ["WARNING: round 1: client 3 dropped out (no reply)"]


# ------------------------------------------------------------------ heartbeat
def test_a_lost_heartbeat_after_a_completed_run_is_not_a_failure(tmp_path):
    status = {"status": "finished:failed", "details": "No heartbeat received from the task"}
    assert not cli.lost_heartbeat_but_completed(status, tmp_path)  # no summary: nothing finished
    (tmp_path / "summary.json").write_text('{"status": "failed: RuntimeError: boom"}')
    assert not cli.lost_heartbeat_but_completed(status, tmp_path)
    (tmp_path / "summary.json").write_text('{"status": "completed"}')
    assert cli.lost_heartbeat_but_completed(status, tmp_path)
    other = {"status": "finished:failed", "details": "Simulation failed with exception: x"}
    assert not cli.lost_heartbeat_but_completed(other, tmp_path)


def test_flower_lines_are_not_printed_twice_through_opacus_root_handler():
    import sys

    from protocol.log import OPACUS_ROOT_FORMAT, route_privet_logs_to_flower

    root = logging.getLogger()
    planted = logging.StreamHandler(sys.stderr)  # what opacus' logging.basicConfig adds at import
    planted.setFormatter(logging.Formatter(OPACUS_ROOT_FORMAT))
    root.addHandler(planted)
    try:
        route_privet_logs_to_flower()
        assert planted not in root.handlers
    finally:
        if planted in root.handlers:
            root.removeHandler(planted)


def test_only_this_runs_simulation_processes_are_found_and_stopped(tmp_path):
    import os
    import subprocess
    import sys

    def fake_simulation(home: Path) -> subprocess.Popen:
        """A process that looks like Flower's (``flwr-simulation`` in its command line)."""
        env = {**os.environ, "FLWR_HOME": str(home)}
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "flwr-simulation"], env=env)

    ours, theirs = fake_simulation(tmp_path / "ours"), fake_simulation(tmp_path / "theirs")
    try:
        assert flower_sim.simulation_pids(tmp_path / "ours") == [ours.pid]
        assert not flower_sim.wait_for_simulation(tmp_path / "ours", timeout=0.5)
        flower_sim.stop_simulation(tmp_path / "ours")
        assert ours.wait(timeout=10) != 0
        assert flower_sim.wait_for_simulation(tmp_path / "ours", timeout=5)
        assert theirs.poll() is None  # another run's process is left alone
    finally:
        for proc in (ours, theirs):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)


# ------------------------------------------------------------------ Ray cluster (RAY_ADDRESS)
def test_an_unreachable_ray_address_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{flower_sim.free_port()}")
    code, text = run_cli(["run", "--out", str(tmp_path / "r"), "--set", "num-clients=2"], capsys)
    assert code == 2
    assert text.startswith("privet: error: RAY_ADDRESS=127.0.0.1:") and "no Ray cluster answers" in text
    assert len(text.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    monkeypatch.setenv("RAY_ADDRESS", "head-without-port")
    code, text = run_cli(["run", "--set", "num-clients=2"], capsys)
    assert code == 2 and "RAY_ADDRESS='head-without-port' is not HOST:PORT" in text


def test_ray_address_auto_or_local_is_left_to_ray():
    assert flower_sim.ray_cluster_address({"RAY_ADDRESS": "auto"}) is None
    assert flower_sim.ray_cluster_address({"RAY_ADDRESS": "local"}) is None
    assert flower_sim.ray_cluster_address({}) is None
    assert flower_sim.ray_cluster_address({"RAY_ADDRESS": " 10.0.0.1:6379 "}) == "10.0.0.1:6379"
