"""Run-time errors of the privacy package.

Construction-time mistakes (a negative ε, an unknown accountant name) raise ``ValueError``
or ``TypeError`` where they are made; the types here are for conditions that arise while a
run is under way and that callers are expected to catch and report.
"""

from __future__ import annotations

__all__ = ["PrivacyBudgetExhausted"]


class PrivacyBudgetExhausted(RuntimeError):
    """A release would take a client's cumulative ε past its budget (or a mechanism allows no more).

    Raised *before* anything is recorded or released: the ledger and the accountant are
    unchanged when this is raised, so the caller can refuse the work and report it. (The
    privacy package depends on nothing of Flower's.)
    """
