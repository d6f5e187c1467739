"""glibc malloc tuning at client start (issue 11: allocator churn in DP-SGD steps).

A DP-SGD step allocates and frees per-sample gradient buffers of a few MB each. glibc
serves blocks above ``M_MMAP_THRESHOLD`` (dynamic, 128 KiB to 32 MiB) with ``mmap`` and
returns them to the kernel on ``free``; the next step maps them again and takes a page
fault per 4 KiB page (≈ 2,000 per step measured). Fixing the mmap threshold at 256 MiB
and the trim threshold at 512 MiB keeps those buffers in the heap between steps.

Cost: the process keeps up to that much freed memory mapped (RSS stays at the step's
peak instead of dropping between steps). No effect on results: only where memory comes
from. Off with ``PRIVET_MALLOC_TUNE=0``; a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 * 2**20
TRIM_THRESHOLD_BYTES = 512 * 2**20

_tuned: bool | None = None


def tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds once per process; whether it took effect."""
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = False
    if os.environ.get("PRIVET_MALLOC_TUNE", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _tuned = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _tuned
