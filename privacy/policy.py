"""When is a budget spent? One rule for clients and server alike.

A client whose remaining budget is below ``MIN_USABLE_FRACTION`` of its total treats the
budget as spent: calibrating a round to fit such a remainder would need noise so large
that the upload is pure noise, which spends (a little) privacy and harms the global model.
The client refuses the round; the server stops scheduling it.
"""

from __future__ import annotations

import math

MIN_USABLE_FRACTION = 0.01


def is_spent(epsilon_spent: float, epsilon_budget: float) -> bool:
    """``True`` when less than ``MIN_USABLE_FRACTION`` of a finite budget remains."""
    if math.isinf(epsilon_budget):
        return False
    return epsilon_spent >= (1.0 - MIN_USABLE_FRACTION) * epsilon_budget
