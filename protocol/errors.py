"""The error codes of privet's ClientApp replies (``Message(Error(code, reason))``).

The reason always starts with a keyword from :mod:`protocol.keys` (``budget-exhausted``,
``stale-message``, ...) that the server logs and counts; the code says which kind of
refusal it is. Flower's own codes (``flwr.app.ErrorCode``) are below 4000.
"""

from __future__ import annotations

from typing import Final

ERROR_CONFIG: Final = 4001  # a malformed node config or request
ERROR_BUDGET: Final = 4002  # the round would take the client past its privacy budget
ERROR_INTERNAL: Final = 4003  # an unexpected failure on the client (nothing charged)
ERROR_BUSY: Final = 4004  # another run holds this node's ledger
ERROR_REFUSED: Final = 4005  # a request the client must not serve (e.g. evaluation not allowed)
ERROR_STALE: Final = 4006  # the message outlived its time-to-live: the round is over
ERROR_SECURE_SUM: Final = 4007  # a secure-sum stage the client refuses (client/secure_sum.py)
