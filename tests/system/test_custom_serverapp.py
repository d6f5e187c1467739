"""examples/custom-serverapp: a Flower app outside privet's layout (its own pyproject.toml
and components) whose ServerApp uses ``privet.strategy("fedavg-hdp")`` and drives
privet's ClientApp. Runs in-process (``privet.inprocess.InProcessGrid``): no Ray, no gRPC.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tomllib

import pytest

from tests.flower_processes import APP_DIR, BIN, flwr_env

pytestmark = pytest.mark.slow

EXAMPLE = APP_DIR / "examples" / "custom-serverapp"


def _flat(table: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _component(ref: str):  # noqa: ANN202
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [m for m in sys.modules if m == "custom_app" or m.startswith("custom_app.")]:
        del sys.modules[name]


def test_custom_serverapp_runs_privet_strategy_with_privet_clientapp(tmp_path, example_on_path):
    from flwr.app import Context, RecordDict

    from privet.inprocess import InProcessGrid

    flwr_cfg = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    server_app = _component(flwr_cfg["components"]["serverapp"])
    client_app = _component(flwr_cfg["components"]["clientapp"])
    run_config = {**_flat(flwr_cfg["config"]), "out-dir": str(tmp_path / "out")}
    budgets = [1.5, 4.0, 8.0]
    nodes = [{"partition-id": i, "num-partitions": 3, "client-id": f"org-{i}", "epsilon": eps}
             for i, eps in enumerate(budgets)]
    grid = InProcessGrid(client_app, nodes, run_config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)

    server_app(grid=grid, context=context)

    summary = json.loads((tmp_path / "out" / "custom-summary.json").read_text())
    assert set(summary["clients"]) == {"org-0", "org-1", "org-2"}
    for i, eps in enumerate(budgets):
        c = summary["clients"][f"org-{i}"]
        assert c["epsilon_budget"] == eps and c["rounds"] == [1, 2]
        assert 0 < c["epsilon_spent"] <= eps
    assert set(summary["train_metrics"]) == {"1", "2"}


def test_custom_serverapp_is_a_valid_flower_app(tmp_path):
    """``flwr build`` accepts the example's pyproject.toml and packages its own code."""
    env = flwr_env(tmp_path / "home")
    env["PYTHONPATH"] = str(APP_DIR)  # privet importable, as where it is installed (flwr build checks)
    out = subprocess.run([str(BIN / "flwr"), "build", "--app", str(EXAMPLE)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    fabs = list(tmp_path.glob("*.fab"))
    assert len(fabs) == 1, out.stdout
    import zipfile

    names = zipfile.ZipFile(fabs[0]).namelist()
    assert "custom_app/server_app.py" in names and "pyproject.toml" in names
    assert not any(n.startswith(("strategies/", "server/")) for n in names), "privet is a dependency, not copied"
