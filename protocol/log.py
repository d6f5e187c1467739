"""privet's loggers (``privet.*``) speak through Flower's log handlers.

Flower configures its ``flwr`` logger (console, and the log stream ``flwr log`` and the
SuperLink show); our loggers forward to the same handlers so that "which client did what in
which round" appears wherever Flower's own lines do. No data or raw update is ever logged:
only client ids, rounds, ε figures and rejection reasons.
"""

from __future__ import annotations

import logging

#: The root-logger format of ``logging.basicConfig`` in Opacus 1.6 (``opacus/utils/module_utils.py``).
OPACUS_ROOT_FORMAT = "%(asctime)s:%(levelname)s:%(message)s"


def drop_opacus_root_handler() -> None:
    """Remove the stderr handler Opacus puts on the root logger if something imported it first.

    Opacus 1.6 calls ``logging.basicConfig`` at import time; Flower's ``flwr`` logger propagates
    to the root logger, so every Flower line was printed twice, once as
    ``11/24/2026 21:27:25:INFO:...``. privet imports Opacus through
    :func:`privacy.accountants.import_opacus`, which keeps the handler from being added (and
    lets a message that needs no DP skip the import); this removes one that another import
    added. Only that handler goes; the application's own stay.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and getattr(handler.formatter, "_fmt", None) == OPACUS_ROOT_FORMAT:
            root.removeHandler(handler)


def route_privet_logs_to_flower(level: int = logging.INFO) -> None:
    """Attach Flower's handlers to the ``privet`` logger (idempotent).

    Also drops Opacus' duplicate root handler (:func:`drop_opacus_root_handler`).
    """
    drop_opacus_root_handler()
    privet = logging.getLogger("privet")
    privet.setLevel(level)
    if privet.handlers:
        return
    for handler in logging.getLogger("flwr").handlers:
        privet.addHandler(handler)
    privet.propagate = not privet.handlers
