"""``flwr run .`` exactly as the README writes it for a Flower user (marked slow).

A fresh ``bash`` sources ``.venv/bin/activate`` (which ``setup.sh`` extends with
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``) and runs Flower's own CLI in the
checkout; the run's real status comes from ``flwr ls --format json``. Only ``FLWR_HOME``
and the local SuperLink's ports are private to the test (other runs may share the machine).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from privet.flower_sim import free_port, stop_local_superlink

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: The activate script a user sources (a test may point at another one with this variable).
ACTIVATE = Path(os.environ.get("PRIVET_ACTIVATE", REPO / ".venv" / "bin" / "activate"))


def user_shell(command: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``command`` in a fresh bash after ``source .venv/bin/activate``, in the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env.pop("VIRTUAL_ENV", None)
    env.update({
        "FLWR_HOME": str(home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "FLWR_TELEMETRY_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    })
    script = f"source {shlex.quote(str(ACTIVATE))} && cd {shlex.quote(str(REPO))} && {command}"
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def newest_run(home: Path) -> dict:
    out = user_shell("flwr ls --format json", home, timeout=120)
    runs = json.loads(out.stdout)["runs"]
    return max(runs, key=lambda r: int(r["run-id"]))


def small_run_config(out_dir: Path, num_clients: int) -> str:
    return (f"num-clients={num_clients} num-server-rounds=2 max-examples-per-client=150 "
            f"out-dir='{out_dir}'")


def test_activate_disables_runtime_dependency_installation(tmp_path):
    got = user_shell('echo "$FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION|$(command -v flwr)|'
                     '$(command -v flower-superlink)"', tmp_path / "home")
    flag, flwr, superlink = got.stdout.strip().split("|")
    assert flag == "1", f"{ACTIVATE} does not set it: run `bash setup.sh --no-run`"
    assert flwr and superlink, "flwr / flower-superlink not on PATH after activate"


def test_flwr_run_dot_completes_with_every_client(tmp_path):
    home, out = tmp_path / "home", tmp_path / "results"
    try:
        done = user_shell(f'flwr run . --run-config "{small_run_config(out, 3)}" '
                          f'--federation-config "num-supernodes=3" --stream', home)
        status = newest_run(home)
    finally:
        stop_local_superlink(home)
    log = done.stdout + done.stderr
    assert status["status"] == "finished:completed", f"{status}\n{log[-4000:]}"
    assert "uv sync" not in log and "Installing" not in log.replace("Successfully installed privet", "")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert sorted(c["client_id"] for c in summary["clients"]) == ["0", "1", "2"]
    assert all(c["rounds_joined"] == [1, 2] for c in summary["clients"])
    assert all(c["num_examples"] == 150 for c in summary["clients"])
    assert (out / "report.html").is_file()


def test_flwr_run_dot_refuses_a_federation_of_another_size(tmp_path):
    """Flower's default local simulation has 2 SuperNodes: 3 clients configured is refused,
    with the command that fixes it, and no results directory is made."""
    home, out = tmp_path / "home", tmp_path / "results"
    try:
        done = user_shell(f'flwr run . --run-config "{small_run_config(out, 3)}" --stream', home)
        status = newest_run(home)
    finally:
        stop_local_superlink(home)
    log = done.stdout + done.stderr
    assert status["status"] == "finished:failed"
    assert "'num-clients' = 3 but Flower's simulation started 2 SuperNodes" in log
    assert 'flwr run . --federation-config "num-supernodes=3 client-resources-num-cpus=1"' in log
    assert not out.exists()


def test_a_long_simulation_on_a_busy_machine_completes(tmp_path):
    """The heartbeat issue (README, "Heartbeats on a loaded machine"): a multi-minute ``flwr run .``
    while every core is also busy with a CPU hog (two per core) must end ``finished:completed``
    in ``flwr ls``, with every round in the summary, when each simulated client keeps one thread."""
    import sys

    home, out = tmp_path / "home", tmp_path / "results"
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(2 * (os.cpu_count() or 1))]
    try:  # 8 rounds x 3 clients x 600 examples: 1.5-3 min under this load here, several heartbeat expiries
        config = f"num-clients=3 num-server-rounds=8 max-examples-per-client=600 out-dir='{out}'"
        done = user_shell(f'flwr run . --run-config "{config}" --federation-config "num-supernodes=3 '
                          f'client-resources-num-cpus=1" --stream', home, timeout=1200)
        status = newest_run(home)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        stop_local_superlink(home)
    log = done.stdout + done.stderr
    assert status["status"] == "finished:completed", f"{status}\n{log[-4000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 8
