"""client/allocator.py: glibc tuning takes effect once, and can be switched off."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE = "from client.allocator import tune_malloc as t; print(t(), t())"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.parametrize(("flag", "expected"), [("1", "True True"), ("0", "False False")])
def test_tune_malloc_is_idempotent_and_can_be_disabled(flag, expected):
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "PRIVET_MALLOC_TUNE": flag})
    assert out.stdout.strip() == expected
