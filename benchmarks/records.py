"""What every benchmark record holds about the machine, and how a record and its tables are written.

A benchmark keeps its measurements as a JSON record and its tables as markdown rendered from that
record (``--render RECORD.json`` rebuilds them), side by side in ``benchmarks/results/``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def machine(load_start: float) -> dict[str, Any]:
    """The date, the CPU count and the load average at the start and now (a shared machine moves every time)."""
    return {"date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "cpus": os.cpu_count(), "load_start": load_start,
            "load_end": os.getloadavg()[0]}


def write(out: Path, record: dict[str, Any], render: Callable[[dict[str, Any]], str]) -> None:
    """Write ``record`` to ``out`` with suffix .json and its tables to ``out``, and print the tables."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    text = render(record)
    out.write_text(text)
    print(text)
