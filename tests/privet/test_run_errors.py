"""Small errors of ``privet run`` (issue 40, item 4): an unwritable ``--out`` before any work, a
missing training loss shown as missing, a GDPFed sampling ratio too small for the federation named
with the smallest one that works, and a failed round not counted as completed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from privet.cli import CliError, check_out_dir, load_experiment, main, validate
from server.console import RunConsole
from strategies.gdpfed_plan import smallest_q

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ --out
@pytest.mark.parametrize("make_out", [
    lambda tmp: tmp / "a-file" / "results",        # a file in the way
    lambda tmp: tmp / "a-file",                    # the out-dir itself is a file
    lambda tmp: Path("/proc/privet-results"),      # a file system that takes no new folder, even for root
])
def test_an_out_dir_that_cannot_be_written_is_refused_with_one_line(tmp_path, make_out):
    (tmp_path / "a-file").write_text("x")
    out = make_out(tmp_path)
    with pytest.raises(CliError, match=r"'out-dir' \(--out\)"):
        check_out_dir(out)
    assert not out.exists() or out.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing left behind


def test_a_writable_out_dir_is_accepted_and_nothing_is_created(tmp_path):
    check_out_dir(tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []


def test_privet_run_refuses_an_unwritable_out_before_any_work(tmp_path):
    (tmp_path / "a-file").write_text("x")
    done = subprocess.run([sys.executable, "-m", "privet.cli", "run", "--out", str(tmp_path / "a-file" / "r"),
                           "--set", "num-server-rounds=1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'out-dir' (--out)" in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == ""  # refused before the run was even announced
    assert not (tmp_path / "results").exists()


# ------------------------------------------------------------------------ train loss
def _round(console: RunConsole, r: int, metrics: str) -> None:
    console.feed(f"INFO :      round {r}: sampled clients ['0', '1'] of 2 connected\n")
    console.feed(f"INFO :      │	└──> Aggregated MetricRecord: {{'num-accepted': 2, {metrics}}}\n")
    console.feed(f"INFO :      round {r}: test accuracy 0.5000 loss 1.2\n")


def test_a_round_without_a_reported_loss_shows_none_and_a_reported_zero_shows_zero():
    console = RunConsole(3, out=io.StringIO())
    _round(console, 1, "'max-epsilon-spent': 1.5")
    _round(console, 2, "'max-epsilon-spent': 2.0, 'train-loss': 0.0")
    _round(console, 3, "'max-epsilon-spent': 2.5, 'train-loss': nan")
    lines = [s for s in console.shown if s.startswith("round ")]
    assert len(lines) == 3
    assert "loss" not in lines[0].split("test accuracy")[1]  # missing, not 0
    assert lines[1].endswith("train loss 0")
    assert "train loss" not in lines[2]


def test_a_muted_console_prints_nothing_but_still_logs():
    log = io.StringIO()
    console = RunConsole(2, log=log, out=io.StringIO())
    console.mute()
    console.feed("WARNING :   privet: the run was interrupted during round 1\n")
    console.feed("Traceback (most recent call last):\n")
    assert console.shown == [] and "interrupted" in log.getvalue()


# ------------------------------------------------------------------------- gdpfed.q
@pytest.mark.parametrize("strategy", ["gdpfed-op", "gdpfed-plus"])
def test_gdpfed_q_too_small_for_the_federation_names_the_key_and_the_smallest_that_works(strategy, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--set", f"strategy={strategy}", "--set", "num-clients=30", "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'gdpfed.q' = 0.02" in line and "gdpfed.q >= 0.1" in line and "upper bound" not in line
    assert not out.exists()
    # the value it names works, and one just below it does not
    validate(load_experiment(None, [f"strategy={strategy}", "num-clients=30", "gdpfed.q=0.1"], str(out)))
    with pytest.raises(CliError, match="gdpfed.q"):
        validate(load_experiment(None, [f"strategy={strategy}", "num-clients=30", "gdpfed.q=0.0999"], str(out)))


@pytest.mark.parametrize("sizes", [[2, 2, 26], [1, 5, 4], [7, 3, 40, 1]])
def test_smallest_q_is_the_smallest_ratio_that_samples_every_group(sizes):
    from strategies.gdpfed_math import optimal_sampling, round_counts

    q = smallest_q("optimal", sizes)
    assert q * sum(sizes) >= len(sizes) and (q - 1e-4) * sum(sizes) < len(sizes)
    eps = [0.5 + m for m in range(len(sizes))]
    rates = optimal_sampling(sizes, eps, q, 1e-5, 10)  # Problem 1 is solvable there
    assert all(c >= 1 for c in round_counts(rates, sizes, key="gdpfed.q"))
    u = smallest_q("uniform", sizes)
    assert all(c >= 1 for c in round_counts([u] * len(sizes), sizes, key="gdpfed.q"))


# ------------------------------------------------------------------- rounds_completed
def test_a_failed_round_is_not_completed(run_config_factory):
    from client.app import app as client_app
    from privet.inprocess import InProcessGrid, simulation_node_configs
    from server.app import run_experiment

    # fixed, weak noise: round 1 spends nearly all of eps = 3, so nobody can train in rounds 2-3
    cfg = run_config_factory(num_server_rounds=3, budget_distribution="constant", epsilon=3.0, noise_multiplier=1.2)
    with pytest.raises(RuntimeError, match="incomplete"):
        run_experiment(InProcessGrid(client_app, simulation_node_configs(3), cfg), cfg, run_id=1)
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    assert [f["round"] for f in summary["failed_rounds"]] == [2, 3]
    assert summary["rounds_completed"] == summary["rounds"] - len(summary["failed_rounds"]) == 1
    assert "1/3 rounds" in (Path(cfg["out-dir"]) / "privacy_report.md").read_text()

