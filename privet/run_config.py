"""A run's configuration as the user gives it: the app's defaults, an experiment file, ``--set``.

:func:`load_experiment` merges them (defaults < experiment file < ``--set`` < ``--out``, unknown
keys rejected) and :func:`validate` checks the result with the server's own
:class:`server.config.RunConfig` and the dataset's availability, before anything starts or any
results directory exists. Every failure is a :class:`CliError`: one line, no traceback. ``privet
run`` and ``privet audit`` read their configuration here.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

APP_DIR = Path(__file__).resolve().parents[1]


class CliError(RuntimeError):
    """A user-facing failure: printed without a traceback."""


def check_out_dir(out: Path) -> None:
    """Refuse, before any work, a results directory that cannot be created and written.

    The nearest existing folder on the way to ``out`` must take a new entry: one is made and
    removed at once (so a read-only or virtual file system, or a file in the way, is found now,
    whoever runs it), and nothing is left behind.
    """
    if out.exists() and not out.is_dir():
        raise CliError(f"'out-dir' (--out) {out} exists and is not a folder")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise CliError(f"'out-dir' (--out) {out}: {parent} is a file, so no folder can be made below it")
    try:
        probe = tempfile.mkdtemp(prefix=".privet-write-check-", dir=parent)
    except OSError as exc:
        raise CliError(f"'out-dir' (--out) {out} cannot be written: {parent}: {exc.strerror or exc}") from None
    os.rmdir(probe)


# ------------------------------------------------------------------ config merging
def app_defaults(app_dir: Path = APP_DIR) -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the app's ``pyproject.toml``, flattened with dots."""
    pyproject = app_dir / "pyproject.toml"
    if not pyproject.exists():
        raise CliError(f"no pyproject.toml in {app_dir}: run privet from a checkout of the project")
    return flatten(read_toml(pyproject)["tool"]["flwr"]["app"]["config"])


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file; a syntax error becomes ``FILE:LINE:COLUMN: TOML syntax error: ...``."""
    text = path.read_text(encoding="utf-8")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CliError(toml_error_message(path, text, exc)) from None


def toml_error_message(path: Path, text: str, exc: tomllib.TOMLDecodeError) -> str:
    """Where a TOML syntax error is, as editors and compilers write it, with the line itself."""
    msg = str(exc)
    m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
    if m is None:  # "(at end of document)"
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
    else:
        line, col = int(m.group(1)), int(m.group(2))
    reason = re.sub(r"\s*\(at [^)]*\)$", "", msg)
    source = (text.splitlines() or [""])[min(line, max(len(text.splitlines()), 1)) - 1]
    return (f"{path}:{line}:{col}: TOML syntax error: {reason}\n"
            f"    {source}\n    {' ' * (col - 1)}^")


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested TOML tables to Flower's dotted run-config keys."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` with a TOML value (bare words are strings)."""
    if "=" not in text:
        raise CliError(f"--set expects key=value; found {text!r}")
    key, raw = (s.strip() for s in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def load_experiment(config_path: str | None, sets: list[str], out: str | None) -> dict[str, Any]:
    """Defaults < experiment file < ``--set`` overrides < ``--out``; unknown keys rejected."""
    defaults = app_defaults()
    merged = dict(defaults)
    overrides: dict[str, Any] = {}
    if config_path:
        path = Path(config_path)
        if not path.exists():
            raise CliError(f"experiment config {config_path} does not exist")
        overrides.update(flatten(read_toml(path)))
    overrides.update(dict(parse_assignment(s) for s in sets))
    if out:
        overrides["out-dir"] = str(Path(out).resolve())
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise CliError(
            f"unknown config key(s) {', '.join(unknown)}; allowed keys: {', '.join(sorted(defaults))}"
        )
    for key, value in overrides.items():
        expected = type(defaults[key])
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
                expected, f"a {expected.__name__}")
            raise CliError(f"config key '{key}' must be {kind}; found {value!r}")
        merged[key] = value
    if not merged.get("out-dir"):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        merged["out-dir"] = str((Path.cwd() / "results" / f"{merged['strategy']}-{stamp}").resolve())
    return merged


def simulated_roster(run_config: dict[str, Any], out: Path) -> str:
    """A roster for the simulated sites (privet operates them all): their signing keys beside it, under ``out``.

    With it, a simulation's secure sums authenticate every member and agree on the survivors, as a
    deployment with an operator's roster does (protocol/roster.py).
    """
    from protocol.roster import generate

    return str(generate([str(i) for i in range(int(run_config["num-clients"]))], out / "roster"))


def validate(run_config: dict[str, Any]) -> None:
    """Check a merged run config as the server will read it, and that its dataset is here.

    Raises
    ------
    CliError
        One line naming the key and what it allows, or the missing dataset.
    """
    from server.config import ConfigError, RunConfig
    from tasks.datasets import check_available

    try:
        cfg = RunConfig.from_flower(run_config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    try:  # before anything starts or any results directory exists
        check_available(cfg.dataset, cfg.data_dir or None)
    except FileNotFoundError as exc:
        raise CliError(f"'dataset' = '{cfg.dataset}' is not available here: {exc}") from None
