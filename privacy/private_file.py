"""A private file written atomically and durably: what a crash can leave is the old file or the new one.

The privacy ledger (:meth:`privacy.ledger.PrivacyLedger.save`) depends on it: a torn ledger would
lose the history that keeps a client within its budget. The node's shard cache
(:mod:`client.shard_cache`) uses it for the raw data it keeps.

The bytes go to a temporary file in the target's folder (created with mode 0600 by
:func:`tempfile.mkstemp`: only the node's user can read it), are flushed and fsync'ed, and the file is
``os.replace``-d over the target (atomic on POSIX and Windows); the folder is then fsync'ed where it
can be opened, so that the rename itself survives a power loss. One writer per file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["write_private_file"]


def write_private_file(path: str | os.PathLike[str], write: Callable[[BinaryIO], object], *,
                       folder_mode: int = 0o777) -> None:
    """Replace ``path`` by what ``write`` writes to an open binary file, atomically and durably.

    Parameters
    ----------
    path : path-like
        The target; its missing parent folders are created, the target's own folder with
        ``folder_mode`` less the umask, the folders above it with the default mode.
    write : callable
        Writes the content to the file it is given (``fh.write(payload)``, ``np.savez(fh, ...)``).
    folder_mode : int
        Mode of the parent folders created.

    On any error (also one raised by ``write``) the temporary file is removed, the target is left
    as it was, and the error propagates.
    """
    target = Path(path)
    target.parent.mkdir(mode=folder_mode, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(target.parent)


def _fsync_folder(folder: Path) -> None:
    """Persist a rename on POSIX; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
