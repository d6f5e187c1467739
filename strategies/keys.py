"""Moved to :mod:`protocol.keys` (the wire keys live below both client and server).

Kept so that a ServerApp written against the earlier layout (``from strategies import keys``)
keeps working; new code imports :mod:`protocol.keys`.
"""

from protocol.keys import *  # noqa: F401,F403
