"""Write the documents' generated blocks from the code and the records they describe.

Two kinds of block. The first,

    <!-- generated: NAME -->
    ...
    <!-- end generated -->

is refilled by the generator NAME: ``threat-model`` (the cases of ``server/threat_model.py``),
``reproductions`` (``experiments/summary.py``, from the run records) or ``benchmarks``
(``benchmarks/summary.py``, cells of the benchmarks' results tables). The second,

    <!-- results: PATH -->              or    <!-- results: PATH#SECTION -->
    ...
    <!-- end results -->

is refilled from a results file that a driver or benchmark wrote from its records (PATH relative
to the repository): the whole file without its title, or the section whose ``##`` heading starts
with SECTION, without that heading; headings inside are demoted to ``####``. So the README's
threat-model table is the one every run's summary states, and no number in the README, the
experiments' READMEs or docs/ is a hand copy of a table; ``tests/system/test_docs_current.py``
fails when a block is out of date.

    python scripts/write_docs.py            # rewrite the blocks
    python scripts/write_docs.py --check    # exit 1 naming the stale blocks
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the documents that may hold generated blocks
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "experiments").glob("*/README.md")),
             *sorted((ROOT / "docs").glob("*.md")))

_BLOCK = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)
_RESULTS = re.compile(r"(<!-- results: (?P<path>[^ #]+)(?:#(?P<section>[^>]+?))? -->\n)(?P<body>.*?)"
                      r"(<!-- end results -->)", re.DOTALL)
_HEADING = re.compile(r"^(#{1,6}) ")


def results_body(path: Path, section: str | None = None) -> str:
    """A results file without its title (or one ``##`` section without its heading), headings demoted.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    KeyError
        If no ``##`` heading of ``path`` starts with ``section``.
    """
    lines = path.read_text().rstrip("\n").splitlines()
    if section is None:
        if lines and lines[0].startswith("# "):
            lines = lines[1:]
    else:
        start = next((i for i, line in enumerate(lines) if line.startswith(f"## {section}")), None)
        if start is None:
            raise KeyError(f"{path}: no section starting '## {section}'")
        end = next((j for j in range(start + 1, len(lines))
                    if (m := _HEADING.match(lines[j])) and len(m.group(1)) <= 2), len(lines))
        lines = lines[start + 1:end]
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return "\n".join(re.sub(r"^#{1,3} ", "#### ", line) for line in lines) + "\n"


def threat_model_table() -> str:
    """The threat-model table: each kind of run, the strongest adversary its guarantee holds against."""
    from server.threat_model import CASES, ROWS

    lines = ["| run | the guarantee holds against | because | shown by |", "|---|---|---|---|"]
    for case in CASES:
        against = f"**{case.row}**: {ROWS[case.row]}" if case.row else "no one"
        lines.append(f"| {case.setting} | {against} | {case.why} | {case.tests or '-'} |")
    return "\n".join(lines) + "\n"


def reproductions_table() -> str:
    """The reproductions' headline rows (experiments/summary.py)."""
    from experiments.summary import markdown

    return markdown()


def benchmarks_table() -> str:
    """The benchmark summary: one ratio per row, read from benchmarks/results/ (benchmarks/summary.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmarks_summary", ROOT / "benchmarks" / "summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return str(module.markdown())


GENERATORS: dict[str, Callable[[], str]] = {"threat-model": threat_model_table, "reproductions": reproductions_table,
                                            "benchmarks": benchmarks_table}


def render(text: str) -> str:
    """``text`` with every generated block refilled.

    Raises
    ------
    KeyError
        For a block whose generator or results section does not exist.
    FileNotFoundError
        For a results block whose file does not exist.
    """
    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in GENERATORS:
            raise KeyError(f"no generator {name!r}; one of {', '.join(GENERATORS)}")
        return match.group(1) + GENERATORS[name]() + match.group(4)

    def copy(match: re.Match[str]) -> str:
        return match.group(1) + results_body(ROOT / match.group("path"), match.group("section")) + match.group(5)

    return _RESULTS.sub(copy, _BLOCK.sub(fill, text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block is out of date; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        new = render(text)
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                doc.write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}; run python scripts/write_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
