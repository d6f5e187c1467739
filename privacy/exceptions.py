"""Run-time errors of the privacy package.

Construction-time mistakes (a negative ε, an unknown accountant name) raise ``ValueError``
or ``TypeError`` where they are made; the types here are for conditions that arise while a
run is under way and that callers are expected to catch and report.
"""

from __future__ import annotations

from flwr.serverapp.exception import PrivacyBudgetExhausted as FlowerPrivacyBudgetExhausted

__all__ = ["PrivacyBudgetExhausted"]


class PrivacyBudgetExhausted(FlowerPrivacyBudgetExhausted, RuntimeError):
    """A release would take a client's cumulative ε past its budget.

    Raised *before* anything is recorded or released: the ledger and the accountant are
    unchanged when this is raised, so the caller can refuse the work and report it.
    It is Flower's exception of the same name (``flwr.serverapp.exception``), so code
    written for Flower's differential-privacy wrappers catches it too; raised out of a
    ServerApp it exits with Flower's exit code for an unmet strategy precondition.
    """
