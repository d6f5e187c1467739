"""The README's benchmark summary: one ratio per row, each read from a results table, never copied.

Every row names a results file in ``benchmarks/results/`` (written by a benchmark from its records)
and the cells to read: the row of a markdown table whose first cell is ``row``, under the column
headed ``column``. ``scripts/write_docs.py`` fills the README's ``<!-- generated: benchmarks -->``
block with :func:`markdown`; a table whose format changes makes it fail with the file, row and
column it could not find, rather than print a stale figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Cell:
    """The cell of ``file``'s table in the row whose first cell is ``row``, under ``column``.

    ``section`` picks the table under the ``##`` heading that starts with it (the file's first
    table with that column otherwise).
    """

    file: str
    row: str
    column: str
    section: str | None = None


@dataclass(frozen=True)
class Row:
    """One line of the summary: what is compared, how the cells are shown, and their source."""

    what: str
    template: str  # str.format over the cells, in order
    cells: tuple[Cell, ...]


ROWS: tuple[Row, ...] = (
    Row("a DP-SGD step of the default `cnn`, book-keeping clipping vs a plain step (tuned malloc, what a "
        "client runs)", "{}", (Cell("dpsgd_step.md", "cnn", "bk / plain", "glibc malloc tuned"),)),
    Row("the same with Opacus' per-sample hooks / ghost clipping", "{} / {}",
        (Cell("dpsgd_step.md", "cnn", "hooks / plain", "glibc malloc tuned"),
         Cell("dpsgd_step.md", "cnn", "ghost / plain", "glibc malloc tuned"))),
    Row("a privet round in process vs a bare PyTorch + Opacus loop doing the same DP work (CPU seconds)", "{}",
        (Cell("overhead.md", "inprocess", "CPU / bare"),)),
    Row("a round on Flower's Ray simulation vs a two-worker bare loop (CPU seconds of the whole process tree)", "{}",
        (Cell("overhead.md", "simulation", "CPU / bare"),)),
    Row("CPU per round at 6,000 clients vs at 200 (the same clients sampled per round)", "{}",
        (Cell("scale.md", "6,000", "CPU vs smallest N"),)),
    Row("CPU per round of the same Ray simulation on two nodes vs one (network namespaces sharing this machine's "
        "2 cores: the transfers' and protocol's cost, not a second machine's gain)", "{}",
        (Cell("scale_two_node.md", "two nodes", "CPU vs one node"),)),
    Row("bytes private PFA+ clients upload vs a full model's, 5 rounds incl. the warm-up (`cnn`; wire / payload)",
        "{} less", (Cell("pfa_uplink.md", "pfa-plus", "reduction private (wire / payload)", "cnn"),)),
    Row("bytes a client uploads in a secure sum with the roster and consistency round (holds against a "
        "deviating server; masked inputs packed in log2 M bits) vs a plaintext sum, K = 10 / 30 (`cnn`)", "{} / {}",
        (Cell("secure_sum_ddg.md", "10", "secure + roster / plaintext, up", "Bytes"),
         Cell("secure_sum_ddg.md", "30", "secure + roster / plaintext, up", "Bytes"))),
    Row("the same with `secagg+ddg` at 16 bits per coordinate, K = 10 / 30", "{} / {}",
        (Cell("secure_sum_ddg.md", "10", "DDG 16 bits + roster / plaintext, up", "Bytes"),
         Cell("secure_sum_ddg.md", "30", "DDG 16 bits + roster / plaintext, up", "Bytes"))),
    Row("the time of such a round vs a plaintext round, all K clients in one process (an upper bound; the "
        "ratio moves with the machine's load), K = 10 / 50", "{} / {}",
        (Cell("secure_sum.md", "10", "secure + roster / plaintext", "Time"),
         Cell("secure_sum.md", "50", "secure + roster / plaintext", "Time"))),
    Row("what the roster adds per client: its signature work (ms of CPU) and bytes down, K = 10 / 50 / 120",
        "{} / {} / {} ms; {} / {} / {} bytes",
        (Cell("secure_sum.md", "10", "ms per client", "The roster per client"),
         Cell("secure_sum.md", "50", "ms per client", "The roster per client"),
         Cell("secure_sum.md", "120", "ms per client", "The roster per client"),
         Cell("secure_sum.md", "10", "bytes down per client", "The roster per client"),
         Cell("secure_sum.md", "50", "bytes down per client", "The roster per client"),
         Cell("secure_sum.md", "120", "bytes down per client", "The roster per client"))),
    Row("GDPFed+'s server step vs FedAvg's weighted mean of 120 models", "{}",
        (Cell("gdpfed.md", "GDPFed+ server step (3 group sums + top-k (0.7,0.8,0.9) + ω_m)", "ratio"),)),
    Row("what a user waits for, each a fresh process (wall s, idle machine): `privet --help` / a config error / "
        "a tiny in-process run (2 clients × 100 examples, 1 round) against the targets 1.5 / 1.5 / 5 s",
        "{} / {} / {} s",
        (Cell("fixed_costs.md", "privet --help", "median s", "Fixed costs"),
         Cell("fixed_costs.md", "config error (privet run --set num-clients=-3)", "median s", "Fixed costs"),
         Cell("fixed_costs.md", "tiny in-process run (2 clients x 100 examples, 1 round, logreg)", "median s",
              "Fixed costs"))),
    Row("`flwr run .` vs `privet run`, the default experiment, whole process wall time (paired)", "{} (medians {} s and {} s)",
        (Cell("flwr_run.md", "A/B wall", "median"), Cell("flwr_run.md", "A wall s", "median"),
         Cell("flwr_run.md", "B wall s", "median"))),
)


def _tables(text: str, section: str | None) -> list[list[list[str]]]:
    """The markdown tables of ``text`` (of one ``##`` section), each a list of rows of cells."""
    lines = text.splitlines()
    if section is not None:
        start = next((i for i, line in enumerate(lines) if line.startswith(f"## {section}")), None)
        if start is None:
            return []
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        lines = lines[start + 1:end]
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*lines, ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):  # skip the |---| rule
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def read(cell: Cell) -> str:
    """The text of one cell.

    Raises
    ------
    KeyError
        Naming the file, row and column when the table holds no such cell.
    """
    path = RESULTS / cell.file
    for table in _tables(path.read_text(), cell.section):
        header, *body = table
        if cell.column not in header:
            continue
        col = header.index(cell.column)
        for line in body:
            if line and line[0] == cell.row and col < len(line):
                return line[col]
    raise KeyError(f"benchmarks/results/{cell.file}: no cell in row {cell.row!r}, column {cell.column!r}"
                   + (f" under '## {cell.section}'" if cell.section else ""))


def markdown() -> str:
    """The summary table, each figure read from its results file."""
    lines = ["| what | ratio | source |", "|---|---|---|"]
    for row in ROWS:
        figures = row.template.format(*(read(c) for c in row.cells))
        sources = sorted({c.file for c in row.cells})
        lines.append(f"| {row.what} | {figures} | {', '.join(f'`{s}`' for s in sources)} |")
    return "\n".join(lines) + "\n"
