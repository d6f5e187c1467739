"""The house's one-way imports (README, "How it is built"), checked on the source.

Every ``import`` and ``from … import`` in every module, including those inside functions,
is read with :mod:`ast`; a package may import only the packages below it, and no two
modules may import each other, directly or through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package -> the packages of ours it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "privacy": set(),
    "tasks": set(),
    "protocol": {"privacy", "tasks"},
    "strategies": {"protocol", "privacy", "tasks"},
    "client": {"protocol", "privacy", "tasks"},
    "server": {"strategies", "protocol", "privacy", "tasks"},
    "privet": {"server", "client", "strategies", "protocol", "privacy", "tasks"},
}


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for pkg in ALLOWED for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in ALLOWED}


MODULES = _modules()
GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_lies_below_it(package):
    wrong = sorted(f"{name} imports {target}" for name, targets in GRAPH.items() if name.split(".")[0] == package
                   for target in targets if target.split(".")[0] not in ALLOWED[package] | {package})
    assert not wrong, wrong


def test_no_two_modules_import_each_other():
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in GRAPH[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    cycles = sorted(name for name in GRAPH if name in reach(name) and not name.endswith("__init__"))
    # a package's __init__ re-exporting its modules is not a cycle of ideas
    cycles = [c for c in cycles if not all(m == c.rsplit(".", 1)[0] or m.startswith(c.rsplit(".", 1)[0])
                                           for m in reach(c) if c in reach(m) and m != c)]
    assert not cycles, cycles


def test_the_checker_sees_a_violation(tmp_path):
    """The checker itself: an upward import is found (so a pass above means something)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from client.app import app\n")
    assert "client.app" in _imports(bad)


def test_the_app_bundle_holds_the_packages_and_nothing_else():
    """`flwr run` ships exactly the code the ServerApp and ClientApp import (pyproject's fab-include)."""
    import io
    import zipfile

    from flwr.cli.build import build_fab_from_disk

    names = set(zipfile.ZipFile(io.BytesIO(build_fab_from_disk(ROOT))).namelist()) - {"pyproject.toml", ".info/CONTENT"}
    assert {n.split("/")[0] for n in names} == set(ALLOWED)
    assert names == {str(p.relative_to(ROOT)) for p in MODULES.values()}


def test_the_image_and_the_wheel_carry_every_package():
    """A package added to the house must reach the Docker image and the wheel too."""
    import tomllib

    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert set(wheel["packages"]) == set(ALLOWED)
    dockerfile, ignore = (ROOT / "Dockerfile").read_text(), (ROOT / ".dockerignore").read_text().split()
    for package in ALLOWED:
        assert f"COPY {package}/ {package}/" in dockerfile and f"!{package}/" in ignore, package


def test_the_client_never_reads_the_strategys_name():
    """What a client must know about the run comes in its messages (the budget query's and the
    train config's keys), never from ``run_config["strategy"]``: a string literal naming the
    ``strategy`` run-config key or a catalogue entry does not occur in ``client/``."""
    from strategies.catalogue import CATALOGUE

    names = {"strategy", *CATALOGUE}
    found = []
    for name, path in MODULES.items():
        if name.split(".")[0] != "client":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{name}:{node.lineno} {node.value!r}")
    assert not found, found


#: where a DP mode's meaning is decided: the one rule from a request to its mechanism, and the
#: configuration checks at the edge (strategies' sections beside the catalogue)
MODE_RULES = ("protocol.train_config", "server.config")


def test_no_dp_mode_ladder_outside_the_registry():
    """What a DP mode means is answered by its mechanism (:meth:`TrainConfig.mechanism`, then
    :mod:`privacy.mechanisms`): no module outside the rule and the configuration checks compares
    a mode with ``keys.DP_*``."""
    found = []
    for name, path in MODULES.items():
        if name in MODE_RULES or name.endswith("_config"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Attribute) and side.attr in ("DP_SGD", "DP_UPDATE", "DP_NONE"):
                        found.append(f"{name}:{node.lineno}")
    assert not found, found


def test_a_clientapp_process_imports_opacus_only_when_a_message_needs_it():
    """Each deployed message runs in a fresh process: importing the ClientApp must not pay for
    Opacus (≈ 1.4 s, most of it torch.distributed and scipy), and importing Opacus through
    ``import_opacus`` leaves no handler on the root logger (Opacus' ``basicConfig``, which
    printed every Flower line twice)."""
    import subprocess
    import sys

    probe = (
        "import logging, sys\n"
        "import client.app\n"
        "assert 'opacus' not in sys.modules, 'client.app imported opacus'\n"
        "before = list(logging.getLogger().handlers)\n"
        "from privacy.accountants import import_opacus\n"
        "import_opacus()\n"
        "assert 'opacus' in sys.modules\n"
        "assert logging.getLogger().handlers == before, logging.getLogger().handlers\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of every comparison with one of ``names`` as a string literal."""
    return [(node.lineno, side.value) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
            for side in (node.left, *node.comparators) if isinstance(side, ast.Constant) and side.value in names]


def _compared_names() -> set[str]:
    from strategies.catalogue import CATALOGUE

    return {*CATALOGUE, "dpsgd", "update"}


def test_no_strategy_or_mode_name_is_compared_outside_the_catalogue_and_the_mechanisms():
    """A strategy's name means something only in its catalogue entry, a mode's only in its mechanism:
    no module compares a value with a strategy-name or mode-name string literal elsewhere (a
    ``cfg.strategy == "dpfedc"`` ladder is how every mechanism once became a branch somewhere else)."""
    names = _compared_names()
    found = [f"{name}:{line} {value!r}" for name, path in MODULES.items()
             if name != "strategies.catalogue" and not name.startswith("privacy.mechanisms")
             for line, value in _name_comparisons(path.read_text(), names)]
    assert not found, found


def test_the_comparison_checker_sees_a_ladder():
    """The check itself finds a literal ladder (so a pass above means something)."""
    assert _name_comparisons('if cfg.strategy == "dpfedc" or mode != "update":\n    pass\n',
                             _compared_names()) == [(1, "dpfedc"), (1, "update")]
