"""``privet audit --out DIR``: the audit's figures in DIR's summary.json, privacy_report.md and report.html.

Into the folder of a ``privet run`` of the same config the audit is merged: the run's summary keys,
its text report and every line of its page are kept, the audit added; the charge the audit reports
is the ε the run's own client 0 spent (a real in-process Flower run's ledger against the audit's
canary ledger: two computations). Into an empty folder it writes those files with the audit alone;
into a run of another config it refuses, before any game runs.
"""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser

import pytest

from privacy.accountants import epsilon_of
from privet.cli import main
from server.audit_text import AUDIT_STATEMENT, audit_figure
from server.report_html import read_results, render

#: A small private run: update mode, 3 clients all sampled in both rounds, a few hundred examples each.
RUN = ["dp-mode=update", "num-server-rounds=2", "num-clients=3", "max-examples-per-client=256", "model=logreg",
       "min-train-clients=3", "fraction-train=1.0"]


def _sets(values: list[str]) -> list[str]:
    return [arg for v in values for arg in ("--set", v)]


class _Tables(HTMLParser):
    """The cells of each ``<table data-table=...>`` body, row by row (text content)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._in_body = self._in_cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = dict(attrs).get("data-table")
            self.tables.setdefault(self._table or "", [])
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.tables[self._table or ""].append([])
        elif tag == "td" and self._in_body:
            self._in_cell = True
            self.tables[self._table or ""][-1].append("")

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_cell = False
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data):
        if self._in_cell:
            self.tables[self._table or ""][-1][-1] += data


def _tables(page: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(page)
    return parser.tables


def _is_subsequence(lines: list[str], of: list[str]) -> bool:
    it = iter(of)
    return all(line in it for line in lines)


def _check_row(row: list[str], m: dict) -> None:
    """A page's audit row shows the summary's figures."""
    assert row[:10] == [m["game"], m["level"], m["mechanism"], str(m["canaries"]), f"{m['confidence']:g}",
                        audit_figure(m["lower_bound"]), audit_figure(m["one_shot_epsilon"]),
                        audit_figure(m["charged_epsilon"]), f"{m['delta']:g}", "FLAGGED" if m["flagged"] else "no"]


@pytest.mark.slow
def test_an_audit_into_a_runs_folder_keeps_the_run_and_adds_its_figures(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--backend", "inprocess", *_sets(RUN), "--out", str(out)]) == 0
    before_summary = json.loads((out / "summary.json").read_text())
    before_text = (out / "privacy_report.md").read_text()
    before_page = (out / "report.html").read_text()

    assert main(["audit", *_sets(RUN), "--canaries", "200", "--seed", "1", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    section = summary.pop("audit")
    assert summary == before_summary  # every key of the run kept
    (record,) = json.loads((out / "audit.json").read_text())["audits"]
    (m,) = section["mechanisms"]
    assert (m["game"], m["level"], m["canaries"], m["confidence"]) == ("update", "client", 200, 0.95)
    for key in ("lower_bound", "one_shot_epsilon", "charged_epsilon", "delta", "flagged", "line"):
        assert m[key] == record[key], key
    # the charge: the run's own client 0 ledger (a real Flower run) and the audit's canary ledger agree,
    # and both are the accountant's ε of the history the audit recorded
    client0 = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert m["charged_epsilon"] == pytest.approx(client0["epsilon_spent"], rel=1e-9)
    assert m["charged_epsilon"] == pytest.approx(
        epsilon_of([tuple(s) for s in record["charged_history"]], record["delta"], "prv"), rel=1e-9)
    assert 0 < m["lower_bound"] <= m["charged_epsilon"] and not m["flagged"]

    text = (out / "privacy_report.md").read_text()
    assert text.startswith(before_text) and "## Empirical privacy audit" in text and AUDIT_STATEMENT in text
    assert (f"| update | client | update | 200 | 0.95 | {audit_figure(m['lower_bound'])} | "
            f"{audit_figure(m['one_shot_epsilon'])} | {audit_figure(m['charged_epsilon'])} | 1e-05 | no |") in text

    page = (out / "report.html").read_text()
    assert _is_subsequence(before_page.splitlines(), page.splitlines())  # the run's page, line for line
    run_summary, rounds, config = read_results(out)
    assert page == render(run_summary, rounds, config, title=out.name)
    tables = _tables(page)
    (row,) = tables["audit"]
    _check_row(row, m)
    assert tables["clients"] == _tables(before_page)["clients"]


def test_an_audit_into_an_empty_folder_writes_its_own_report_and_a_rerun_replaces_it(tmp_path, capsys):
    out = tmp_path / "audit"
    sets = _sets(["dp-mode=update", "num-server-rounds=1", "noise-source=seeded"])
    assert main(["audit", *sets, "--canaries", "200", "--seed", "3", "--out", str(out)]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["audit"] and summary["audit"]["flagged"]
    (m,) = summary["audit"]["mechanisms"]
    (record,) = json.loads((out / "audit.json").read_text())["audits"]
    assert m["flagged"] and record["flagged"] and record["violation"]  # the bound above the charged curve
    assert (m["lower_bound"], m["charged_epsilon"]) == (record["lower_bound"], record["charged_epsilon"])
    page = (out / "report.html").read_text()
    (row,) = _tables(page)["audit"]
    _check_row(row, m)
    assert html.escape(m["line"]) in page and "FLAGGED" in page
    capsys.readouterr()
    assert main(["report", str(out)]) == 0  # privet report reads the folder like a run's
    printed = capsys.readouterr().out
    assert "# Privacy report: an empirical audit" in printed and m["line"] in printed

    assert main(["audit", "--set", "dp-mode=update", "--set", "num-server-rounds=1", "--canaries", "200",
                 "--seed", "3", "--out", str(out)]) == 0  # another config into an audit-only folder: replaced
    again = json.loads((out / "summary.json").read_text())["audit"]
    assert not again["flagged"] and again["settings"]["set"] == ["dp-mode=update", "num-server-rounds=1"]


def test_a_folder_holding_a_run_of_another_config_is_refused_before_any_work(tmp_path, capsys):
    """One line naming the keys that differ; nothing written."""
    from privet.run_config import load_experiment, validate
    from server.config import RunConfig

    out = tmp_path / "run"
    out.mkdir()
    other = load_experiment(None, ["dp-mode=update", "num-server-rounds=3"], None)
    validate(other)
    (out / "config.json").write_text(json.dumps(RunConfig.from_flower(other).model_dump(by_alias=True)))
    (out / "summary.json").write_text(json.dumps({"strategy": "x", "clients": []}))
    rc = main(["audit", "--set", "dp-mode=update", "--set", "num-server-rounds=2", "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("privet")]
    assert rc == 2 and len(err) == 1 and "num-server-rounds" in err[0] and "another configuration" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "summary.json"]
    assert json.loads((out / "summary.json").read_text()) == {"strategy": "x", "clients": []}
