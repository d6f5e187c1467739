"""Ctrl-C and SIGTERM of a real ``privet run`` (Flower's Ray simulation) mid-round (issue 40, item 2).

The run reuses a ``ledger-dir``, so the clients' ledgers on disk are the truth the partial summary
is compared with: each client's ``epsilon_spent`` (what the server knew for sure) must not exceed its
ledger, and ``epsilon_spent_at_most`` must not be below it. The interrupt lands right after round 2's
clients were sampled, while their train messages are in flight. After the signal ``privet run`` prints
exactly one line and exits with 128 + the signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from privacy.ledger import PrivacyLedger

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ROUND_2 = "round 2: sampled clients"


def interrupted_run(tmp: Path, out: Path, ledgers: Path, sig: int, whole_group: bool) -> tuple[int, list[str]]:
    """``privet run --verbose`` until round 2 is sampled, then ``sig`` (to its process group, as a
    terminal's Ctrl-C does, or to its pid alone, as a supervisor's SIGTERM does); the exit status and
    every line it printed after the signal."""
    cmd = [sys.executable, "-m", "privet.cli", "run", "--verbose", "--out", str(out),
           "--set", "num-clients=3", "--set", "num-server-rounds=3", "--set", "max-examples-per-client=3000",
           "--set", "min-train-clients=1", "--set", f"ledger-dir='{ledgers}'"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    after: list[str] = []
    sent = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if sent:
                after.append(line.rstrip("\n"))
            elif ROUND_2 in line:
                if whole_group:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
                sent = True
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert sent, "the run ended before round 2 was sampled"
    return code, after


def ledger_spend(folder: Path) -> dict[str, float]:
    return {p.stem.removeprefix("client-"): PrivacyLedger.load(p).spent() for p in folder.glob("client-*.json")}


def check_partial_summary(out: Path, ledgers: Path, signame: str, code: int, after: list[str], signum: int) -> dict:
    assert code == 128 + signum
    assert len(after) == 1, after  # one line, no traceback, no Flower output
    assert after[0].startswith(f"privet: interrupted by {signame} during round 2; partial results in {out}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"].startswith("interrupted during round 2")
    assert summary["rounds_completed"] == 1
    on_disk = ledger_spend(ledgers)
    assert sorted(on_disk) == sorted(c["client_id"] for c in summary["clients"])
    for c in summary["clients"]:
        ledger = on_disk[c["client_id"]]
        assert c["epsilon_spent"] <= ledger * (1 + 1e-9)
        assert ledger <= c["epsilon_spent_at_most"], (c["client_id"], ledger, c["epsilon_spent_at_most"])
        assert 2 in c["possibly_charged_rounds"]
    report = (out / "privacy_report.md").read_text()
    assert "Run status: interrupted during round 2" in report
    return summary


def test_ctrl_c_then_sigterm_leave_summaries_that_never_understate_the_ledgers(tmp_path):
    ledgers = tmp_path / "ledgers"
    code, after = interrupted_run(tmp_path, tmp_path / "first", ledgers, signal.SIGINT, whole_group=True)
    check_partial_summary(tmp_path / "first", ledgers, "SIGINT", code, after, signal.SIGINT)
    before = ledger_spend(ledgers)
    # the same ledgers again (what a site's durable ledger is): ended by SIGTERM to privet alone
    code, after = interrupted_run(tmp_path, tmp_path / "second", ledgers, signal.SIGTERM, whole_group=False)
    second = check_partial_summary(tmp_path / "second", ledgers, "SIGTERM", code, after, signal.SIGTERM)
    for c in second["clients"]:
        assert c["epsilon_spent_before_run"] == pytest.approx(before[c["client_id"]], rel=1e-9)
    assert (tmp_path / "second" / "run.log").is_file()
