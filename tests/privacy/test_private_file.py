"""privacy.private_file: a crash mid-write leaves the old file, only the owner can read the new one."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

import pytest

from privacy.private_file import write_private_file


def test_error_while_writing_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    write_private_file(path, lambda fh: fh.write(b"old"))

    def torn(fh: BinaryIO) -> None:
        fh.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_private_file(path, torn)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_new_file_and_its_folder_are_private(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        path = tmp_path / "a" / "b" / "shard.npz"
        write_private_file(path, lambda fh: fh.write(b"records"), folder_mode=0o700)
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == b"records"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700  # the folder that holds the data
