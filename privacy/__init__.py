"""Differential privacy for privet: accounting, calibration, mechanisms, budgets, ledgers.

Modules
-------
accountants
    Cumulative ε of composed (sub)sampled Gaussian mechanisms (Opacus RDP / PRV).
calibration
    The smallest noise multiplier that meets a target ε (never overshoots).
mechanisms
    The mechanisms a client round runs, one object each; clipping and Gaussian noise.
budgets
    Per-client budgets from PFA's and GDPFed's distributions, deterministic per client.
ledger
    A client's durable record of what it has spent; refuses releases past its budget.
exceptions
    ``PrivacyBudgetExhausted``.

Importing this package does not import Opacus or torch; accounting imports them lazily.
"""

from privacy.accountants import ACCOUNTANTS, Step, epsilon_of
from privacy.budgets import BUDGET_DISTRIBUTIONS, budget_for, budgets_for, group_of
from privacy.calibration import epsilon_for, noise_multiplier_for
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger
from privacy.mechanisms.gaussian import (
    clip_update,
    gaussian_noise_like,
    l2_norm,
    local_noise_multiplier,
    privatize_update,
)

__all__ = [
    "ACCOUNTANTS",
    "BUDGET_DISTRIBUTIONS",
    "PrivacyBudgetExhausted",
    "PrivacyLedger",
    "Step",
    "budget_for",
    "budgets_for",
    "clip_update",
    "epsilon_for",
    "epsilon_of",
    "gaussian_noise_like",
    "group_of",
    "l2_norm",
    "local_noise_multiplier",
    "noise_multiplier_for",
    "privatize_update",
]
