"""What ``privet run`` shows while a run goes: a progress display, a quiet console, a full log.

Every backend produces the same log lines (Flower's and privet's): the Ray simulation
through ``flwr run --stream``, the in-process backend through Python logging. Each line
goes to :class:`RunConsole` (``feed``), which

- writes it to ``run.log`` without colour codes (the full log, every line once);
- drops what is not the user's business: PyTorch's "Full backward hook is firing" warning
  that Opacus' ghost clipping triggers on every step (and the source line Python prints
  after it), and Flower's hints about resizing its default federation (privet sizes it);
- drops a line that repeats one of the last few (Flower's log stream and console handler
  can both deliver the same line);
- turns privet's round and client lines into a progress display: a bar for the rounds and
  one for the clients of the current round (``rich`` on a terminal; one plain line per
  round elsewhere, so that nothing but text lands in a redirected log);
- prints warnings and errors, and with ``verbose`` every line;
- after :meth:`RunConsole.mute` (an interrupted run) prints nothing more: lines go to ``run.log`` only.

A figure the run did not report is shown as missing, never as 0: the round line carries a training
loss only where clients reported one.
"""

from __future__ import annotations

import collections
import logging
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self

from typing_extensions import override

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

#: ANSI escape sequences (colours, cursor moves).
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: "(ClientAppActor pid=7535) " that Ray puts before a worker's lines.
RAY_PREFIX = re.compile(r"^\(\w+ pid=\d+(?:, ip=[\d.]+)?\) ?")
#: "11/24/2026 21:27:25:INFO:" of Flower's log-stream copy of a line.
STAMP_PREFIX = re.compile(r"^\d\d/\d\d/\d{4} \d\d:\d\d:\d\d:(DEBUG|INFO|WARNING|ERROR|CRITICAL):")
#: "INFO :      " of Flower's console format.
LEVEL_PREFIX = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s?\s*")

#: Lines (searched) that are dropped from the console and the log's summary view.
NOISE = (
    re.compile(r"Full backward hook is firing"),
    re.compile(r"Since flwr 1\.32, default simulated SuperNodes changed"),
    re.compile(r"To change federation size, use the following command"),
    re.compile(r"flwr federation simulation-config .*--num-supernodes"),
    # privet evaluates the global model on the server: Flower's federated evaluation is off on purpose
    re.compile(r"fraction_evaluate is set to 0\.0\. Federated evaluation will be skipped"),
)

ROUND_START = re.compile(r"round (\d+): sampled clients \[(.*?)\]")
CLIENT_DONE = re.compile(r"client (\S+) round (\d+) mode=")
ROUND_DONE = re.compile(r"round (\d+): (?:test|validation) accuracy ([\d.]+)")
EPS_ROUND = re.compile(r"'max-epsilon-spent': ([\d.eE+-]+|inf)")
#: The mean training loss in a round's aggregated metrics; absent where no client reported one
#: (only clients whose operators enabled report-train-metrics do).
TRAIN_LOSS = re.compile(r"'train-loss': '?([\d.eE+-]+|nan|inf)'?")
#: How many recent lines a repeated one is compared with.
DEDUP_WINDOW = 4


def strip_ansi(text: str) -> str:
    """``text`` without colour codes."""
    return ANSI.sub("", text)


def parse_line(raw: str) -> tuple[str, str]:
    """``(level, message)`` of one log line, prefixes (Ray, time stamp, level) removed.

    A line without a level (a library's print, a warning's source line) is "INFO"-less:
    its level is "".
    """
    line = RAY_PREFIX.sub("", strip_ansi(raw).rstrip("\r\n"))
    level = ""
    m = STAMP_PREFIX.match(line)
    if m:
        level, line = m.group(1), line[m.end():]
    m = LEVEL_PREFIX.match(line)
    if m:
        level, line = m.group(1), line[m.end():]
    return level, line


class RunConsole:
    """The console and ``run.log`` of one run (see the module docstring).

    Parameters
    ----------
    total_rounds : int
        ``num-server-rounds``.
    log : text file, optional
        Where every line goes (colour codes removed).
    verbose : bool
        Print every line, not only warnings, errors and progress.
    out : text stream
        The console (stdout by default). Colour and the live display are used only when it
        is a terminal.
    """

    def __init__(self, total_rounds: int, *, log: IO[str] | None = None, verbose: bool = False,
                 out: IO[str] | None = None) -> None:
        from rich.console import Console

        self.total_rounds = total_rounds
        self.log = log
        self.verbose = verbose
        self.console = Console(file=out or sys.stdout, highlight=False, soft_wrap=True)
        self.interactive = self.console.is_terminal
        self.recent: collections.deque[tuple[str, str]] = collections.deque(maxlen=DEDUP_WINDOW)
        self._drop_source_line = False
        self.rounds_done = 0
        self.clients_done = 0
        self.clients_total = 0
        self.current_round = 0
        self.accuracy: float | None = None
        self.max_epsilon: float | None = None
        self.train_loss: float | None = None  # this round's, where reported
        self.muted = False
        self.shown: list[str] = []  # what reached the console (for tests)
        self._progress: Progress | None = None
        self._round_task: TaskID | None = None
        self._client_task: TaskID | None = None

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Self:
        if self.interactive:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                                      transient=False)
            self._progress.start()
            self._round_task = self._progress.add_task("starting (data, model, clients)", total=self.total_rounds)
            self._client_task = self._progress.add_task("clients", total=None, visible=False)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self.log is not None:
            self.log.flush()

    # -------------------------------------------------------------------- lines
    def feed(self, raw: str) -> None:
        """Take one line of the run's output."""
        level, message = parse_line(raw)
        if self._drop_source_line:  # the indented source line Python prints after a warning
            self._drop_source_line = False
            if raw[:1].isspace() or RAY_PREFIX.sub("", strip_ansi(raw))[:1].isspace():
                return
        key = (level or "INFO", message.strip())
        if message.strip() and key in self.recent:
            return
        self.recent.append(key)
        if self.log is not None:
            self.log.write((f"{level}: " if level else "") + message + "\n")
        if any(p.search(message) for p in NOISE):
            self._drop_source_line = "Warning" in message
            return
        self._track(message)
        if self.verbose or level in ("WARNING", "ERROR", "CRITICAL") or "Traceback" in message:
            self.print((f"{level}: " if level else "") + message)

    def mute(self) -> None:
        """Print nothing more (the run was interrupted; its caller says so in one line)."""
        self.muted = True
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def print(self, text: str) -> None:
        """One line on the console (above the live display); nothing once muted."""
        if self.muted:
            return
        self.shown.append(text)
        self.console.print(text, markup=False, highlight=False)

    # ----------------------------------------------------------------- progress
    def _track(self, message: str) -> None:
        if m := ROUND_START.search(message):
            self.current_round = int(m.group(1))
            self.clients_total = len([c for c in m.group(2).split(",") if c.strip()])
            self.clients_done = 0
            self.train_loss = None
            self._update(f"round {self.current_round}/{self.total_rounds}: clients")
        elif (m := CLIENT_DONE.search(message)) and int(m.group(2)) == self.current_round:
            self.clients_done = min(self.clients_done + 1, self.clients_total or self.clients_done + 1)
            self._update(None)
        elif m := EPS_ROUND.search(message):
            self.max_epsilon = float(m.group(1))
            reported = TRAIN_LOSS.search(message)
            self.train_loss = float(reported.group(1)) if reported else None
            if self.train_loss is not None and not math.isfinite(self.train_loss):
                self.train_loss = None
        elif m := ROUND_DONE.search(message):
            r, self.accuracy = int(m.group(1)), float(m.group(2))
            if r == 0:
                self.status(f"round 0 (initial model): test accuracy {self.accuracy:.4f}")
                return
            self.rounds_done = r
            self.clients_done = self.clients_total
            eps = (f", max eps spent {self.max_epsilon:.3f}"
                   if self.max_epsilon is not None and self.max_epsilon < float("inf") else "")
            shown = f", train loss {self.train_loss:.4g}" if self.train_loss is not None else ""
            self.status(f"round {r}/{self.total_rounds}: test accuracy {self.accuracy:.4f}{eps}{shown}")
            self.train_loss = None
            self._update(None)

    def status(self, text: str) -> None:
        """A progress line: printed (above the live display, if any), and the rounds bar's label."""
        self.print(text)
        if self._progress is not None and self._round_task is not None:
            self._progress.update(self._round_task, description=text)

    def _update(self, client_label: str | None) -> None:
        if self._progress is None or self._round_task is None or self._client_task is None:
            return
        self._progress.update(self._round_task, completed=self.rounds_done)
        self._progress.update(self._client_task, completed=self.clients_done, total=self.clients_total or None,
                              visible=True, description=client_label)


class ConsoleHandler(logging.Handler):
    """A logging handler that feeds a :class:`RunConsole` (the in-process backend)."""

    def __init__(self, console: RunConsole) -> None:
        super().__init__()
        self.run_console = console

    @override
    def emit(self, record: logging.LogRecord) -> None:
        try:
            for line in self.format(record).splitlines() or [""]:
                self.run_console.feed(f"{record.levelname}: {line}")
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


@contextmanager
def logs_to(console: RunConsole, names: tuple[str, ...] = ("flwr", "privet")) -> Iterator[None]:
    """Route the named loggers to ``console`` only (instead of Flower's console handler)."""
    handler = ConsoleHandler(console)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.propagate, logger.level)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)


def open_log(path: Path) -> IO[str]:
    """``run.log`` for writing, line-buffered."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", buffering=1, encoding="utf-8")
