"""``privet --help``, every subcommand's help and a config error stay cheap (#38, item 2).

They are what a user types first and most often; each used to pay 4-20 s of imports (torch,
Flower's server stack, scipy.stats) before printing a line. The property checked is the cause,
not a time: in a fresh interpreter, none of the heavy packages is imported by the time the
command has printed its help or its one-line error (the time is measured, not asserted:
README "Tests" and `python -X importtime -m privet.cli --help`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: What the CLI's first screen must not import: each costs 0.3-10 s on this machine.
HEAVY = ("torch", "flwr", "scipy", "opacus", "ray", "grpc")

PROBE = """
import contextlib, io, json, sys
from privet.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(json.loads(HEAVY)))
print(json.dumps({"code": code, "heavy": heavy, "out": out.getvalue(), "err": err.getvalue()}))
"""


def _probe(argv: list[str]) -> dict:
    code = PROBE.replace("json.loads(HEAVY)", repr(list(HEAVY)))
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["report", "--help"], ["audit", "--help"],
                                  ["site", "--help"], ["roster", "--help"]])
def test_help_imports_no_heavy_package(argv):
    result = _probe(argv)
    assert result["code"] == 0 and "usage: privet" in result["out"], result
    assert result["heavy"] == [], f"privet {' '.join(argv)} imported {result['heavy']}"


@pytest.mark.parametrize("command", ["run", "audit"])
def test_a_config_error_is_one_line_before_any_heavy_import(command):
    result = _probe([command, "--set", "num-clients=-3"])
    assert result["code"] == 2, result
    lines = result["err"].strip().splitlines()
    assert len(lines) == 1 and "'num-clients'" in lines[0], lines
    assert result["heavy"] == [], f"privet {command} with a bad key imported {result['heavy']}"
