"""CPU seconds and memory of a process and all its descendants, from Linux's ``/proc``.

A benchmark starts a run as a child process and watches its tree with :class:`TreeWatch`:

- **CPU seconds** of the tree at a moment: Σ over the live processes of the tree of
  utime + stime + cutime + cstime (``/proc/PID/stat``). A process that exited and was reaped
  by its parent is in the parent's cutime/cstime, so nothing is counted twice or lost, except
  a process re-parented away from the tree (a daemon that double-forks) and the last tick of
  one that exits between two samples before its parent reaps it. Ray's raylet, GCS and workers
  are descendants of the driver, so a Ray simulation is counted whole.
- **memory** of the tree at a moment: Σ PSS over its processes (``/proc/PID/smaps_rollup``:
  shared pages split among the processes that map them, so shared libraries count once),
  falling back to RSS where PSS cannot be read. The peak is the maximum over the samples.
- **marks**: the moments a file (a run's ``rounds.jsonl``) gains a line, with the tree's CPU
  seconds then, so per-round wall and CPU come from the same samples.

Sampling every ``interval`` seconds costs a few milliseconds of CPU per sample (counted in no
tree: the watcher runs in the benchmark's own process).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's ``children`` list)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return found


def tree(root: int) -> list[int]:
    """``root`` and every descendant alive now."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children(pid)
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its reaped children: utime + stime + cutime + cstime (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is fields[0]
    return sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime: stat fields 14-17


def memory_bytes(pid: int) -> int:
    """PSS of ``pid`` in bytes, else its RSS (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except OSError:
        return 0


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root``'s tree so far (module docstring)."""
    return sum(cpu_seconds(p) for p in tree(root))


@dataclass
class TreeWatch:
    """Samples a process tree in a thread: CPU at each new line of ``marks``, peak memory.

    Use as a context manager around the child's lifetime; ``marks`` is the file whose lines
    mark round ends (it may not exist yet).
    """

    root: int
    marks: Path | None = None
    interval: float = 0.1
    memory_every: int = 5  # memory is costlier to read: every 5th sample
    mark_times: list[float] = field(default_factory=list)
    mark_cpu: list[float] = field(default_factory=list)
    peak_memory: int = 0
    last_cpu: float = 0.0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _lines(self) -> int:
        if self.marks is None:
            return 0
        try:
            return self.marks.read_bytes().count(b"\n")
        except OSError:
            return 0

    def _loop(self) -> None:
        seen, k = 0, 0
        while not self._stop.is_set():
            now = time.perf_counter()
            pids = tree(self.root)
            cpu = sum(cpu_seconds(p) for p in pids)
            if cpu > 0:
                self.last_cpu = cpu
            lines = self._lines()
            while seen < lines:  # a line appeared since the last sample: charge it to now
                self.mark_times.append(now)
                self.mark_cpu.append(self.last_cpu)
                seen += 1
            if k % self.memory_every == 0:
                self.peak_memory = max(self.peak_memory, sum(memory_bytes(p) for p in pids))
            k += 1
            self._stop.wait(self.interval)
