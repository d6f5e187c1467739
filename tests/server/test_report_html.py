"""``report.html``: what it shows for private and non-private runs, and that a real browser
renders it (headless Chromium, marked slow)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from client.app import app as client_app
from privet.cli import main as privet
from privet.inprocess import InProcessGrid, simulation_node_configs
from server.app import run_experiment
from server.report_html import _ticks, write_report

SMALL = {"num-clients": 3, "num-server-rounds": 2, "max-examples-per-client": 120, "min-train-clients": 3}


def run(tmp_path: Path, name: str, **overrides) -> Path:
    from privet.cli import app_defaults

    cfg = {**app_defaults(), **SMALL, **overrides, "out-dir": str(tmp_path / name)}
    grid = InProcessGrid(client_app, simulation_node_configs(cfg["num-clients"]), cfg)
    run_experiment(grid, cfg, run_id=1)
    return tmp_path / name


@pytest.fixture(scope="module")
def private_run(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("private"), "private")


@pytest.fixture(scope="module")
def public_run(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("public"), "public", strategy="fedavg", **{"budget-distribution": "none"})


def test_private_report_shows_every_client_budget_and_guarantee(private_run):
    page = (private_run / "report.html").read_text()
    summary = json.loads((private_run / "summary.json").read_text())
    assert 'data-figure="accuracy"' in page and 'data-figure="epsilon"' in page and 'data-figure="budgets"' in page
    for c in summary["clients"]:
        assert f"spent {min(c['epsilon_spent'], c['epsilon_budget']):.4f} of {c['epsilon_budget']:.4f}" in page
        assert c["guarantee"].replace("'", "&#x27;") in page
    config = json.loads((private_run / "config.json").read_text())
    assert f"<code>num-clients</code></td><td>{config['num-clients']}</td>" in page
    assert "src=" not in page and "href=" not in page  # self-contained: nothing fetched


def test_non_private_report_claims_no_privacy(public_run):
    page = (public_run / "report.html").read_text()
    md = (public_run / "privacy_report.md").read_text()
    assert 'data-figure="accuracy"' in page
    assert 'data-figure="epsilon"' not in page and 'data-figure="budgets"' not in page  # no empty plots
    assert "not private" in page and "calibrated per client" not in page
    assert "n/a (no budget)" in page and ">yes<" not in page
    assert "calibrated per client" not in md and "| yes |" not in md and "n/a (no budget)" in md


def test_ticks_cover_the_data():
    for lo, hi in [(0.0, 7.47), (0.1, 0.1922), (0.0, 0.0031), (2.0, 2.0)]:
        t = _ticks(lo, hi)
        assert t[0] <= lo and t[-1] >= hi and len(t) >= 2


def test_privet_report_html_writes_and_prints_the_page(private_run, capsys):
    (private_run / "report.html").unlink()
    assert privet(["report", str(private_run), "--html"]) == 0
    assert capsys.readouterr().out.strip() == str(private_run / "report.html")
    assert (private_run / "report.html").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["private_run", "public_run"])
def test_a_headless_browser_renders_figures_and_tables(which, request, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    out: Path = request.getfixturevalue(which)
    page = write_report(out)
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    ).stdout
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:2000]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body.group(1)))
    summary = json.loads((out / "summary.json").read_text())
    private = summary["dp_mode"] != "none"
    assert attrs["rendered"] == "yes"  # the page's own script ran after layout
    assert attrs["figures"] == ("3" if private else "1")
    assert attrs["figures-drawn"] == attrs["figures"]  # every figure has marks with a real size
    assert attrs["tables"] == "3"
    config_rows = len(json.loads((out / "config.json").read_text()))  # flat keys + pfa + fedceo sections
    assert int(attrs["table-rows"]) >= len(summary["clients"]) + 1 + config_rows


def test_refused_sites_and_failed_rounds_are_listed(private_run):
    from server.report_html import read_results, render

    summary, rounds, config = read_results(private_run)
    summary = {**summary, "refused": [{"node_id": 7, "client_id": "site-x", "reason": "no budget declared"}],
               "failed_rounds": [{"round": 2, "reason": "0 accepted replies, 1 required"}]}
    page = render(summary, rounds, config)
    assert "site-x (node 7): no budget declared" in page and "round 2: 0 accepted replies, 1 required" in page
