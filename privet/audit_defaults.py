"""``privet audit``'s defaults, read by its command line (:mod:`privet.audit_cli`) and by
:func:`privet.audit_cmd.audit`; a module of its own so that neither imports the other for them.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_CANARIES", "DEFAULT_EXTENSION"]

#: Default canaries (client-level: canary clients; record-level: canary records in one shard).
DEFAULT_CANARIES: Final = 1000
#: The deviating server asks for this many times the T rounds the run declared.
DEFAULT_EXTENSION: Final = 2
