"""privet's loggers (``privet.*``) speak through Flower's log handlers.

Flower configures its ``flwr`` logger (console, and the log stream ``flwr log`` and the
SuperLink show); our loggers forward to the same handlers so that "which client did what in
which round" appears wherever Flower's own lines do. No data or raw update is ever logged:
only client ids, rounds, ε figures and rejection reasons.
"""

from __future__ import annotations

import logging


def route_privet_logs_to_flower(level: int = logging.INFO) -> None:
    """Attach Flower's handlers to the ``privet`` logger (idempotent)."""
    privet = logging.getLogger("privet")
    privet.setLevel(level)
    if privet.handlers:
        return
    for handler in logging.getLogger("flwr").handlers:
        privet.addHandler(handler)
    privet.propagate = not privet.handlers
