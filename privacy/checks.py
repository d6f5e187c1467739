"""Argument checks shared by the privacy core and the papers' math modules.

Each helper names the offending argument and value in its message and rejects ``bool``
(a ``True`` noise multiplier is a bug, not 1.0), NaN and infinities unless told otherwise.
Validation never uses ``assert``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

__all__ = [
    "check_choice",
    "check_delta",
    "check_int",
    "check_nonnegative_finite",
    "check_positive",
    "check_positive_finite",
    "check_probability",
    "check_real",
    "check_release",
    "check_step",
]


def _as_real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number; found {value!r}")
    out = float(value)
    if math.isnan(out):
        raise ValueError(f"{name} must not be NaN; found {value!r}")
    return out


def check_real(name: str, value: Any, *, minimum: float) -> float:
    """``value`` as a finite float >= ``minimum``."""
    out = _as_real(name, value)
    if not (minimum <= out < math.inf):
        raise ValueError(f"{name} must be >= {minimum:g} and finite; found {value!r}")
    return out


def check_positive_finite(name: str, value: Any) -> float:
    """``value`` as a float in (0, ∞)."""
    out = _as_real(name, value)
    if not (0.0 < out < math.inf):
        raise ValueError(f"{name} must be > 0 and finite; found {value!r}")
    return out


def check_positive(name: str, value: Any) -> float:
    """``value`` as a float in (0, ∞]; infinity is allowed (e.g. an unlimited budget)."""
    out = _as_real(name, value)
    if not out > 0.0:
        raise ValueError(f"{name} must be > 0; found {value!r}")
    return out


def check_nonnegative_finite(name: str, value: Any) -> float:
    """``value`` as a float in [0, ∞)."""
    out = _as_real(name, value)
    if not (0.0 <= out < math.inf):
        raise ValueError(f"{name} must be >= 0 and finite; found {value!r}")
    return out


def check_probability(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """``value`` as a float in (0, 1], or [0, 1] when ``allow_zero``."""
    out = _as_real(name, value)
    low_ok = out >= 0.0 if allow_zero else out > 0.0
    if not (low_ok and out <= 1.0):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {interval}; found {value!r}")
    return out


def check_delta(value: Any, name: str = "delta") -> float:
    """δ as a float in the open interval (0, 1)."""
    out = _as_real(name, value)
    if not 0.0 < out < 1.0:
        raise ValueError(f"{name} must be in (0, 1); found {value!r}")
    return out


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """``value`` as an ``int`` >= ``minimum`` (numpy integers accepted, floats rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer; found {value!r}")
    out = int(value)
    if out < minimum:
        raise ValueError(f"{name} must be >= {minimum}; found {value!r}")
    return out


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """``value`` if it is one of ``allowed``; the error lists the allowed values."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; found {value!r}")
    return value


def check_step(step: Any, *, name: str = "step") -> tuple[float, float, int]:
    """One ``(noise_multiplier, sample_rate, num_steps)`` history entry, normalised.

    Allowed: σ >= 0 finite (σ = 0 means no noise, i.e. infinite ε), q in [0, 1] and an
    integer count >= 0 (q = 0 or count = 0 is a no-op that costs nothing).
    """
    if isinstance(step, (str, bytes)) or not hasattr(step, "__len__") or len(step) != 3:
        raise ValueError(
            f"{name} must be a (noise_multiplier, sample_rate, num_steps) triple; found {step!r}"
        )
    sigma, rate, count = step
    return (
        check_nonnegative_finite(f"{name} noise_multiplier", sigma),
        check_probability(f"{name} sample_rate", rate, allow_zero=True),
        check_int(f"{name} num_steps", count, minimum=0),
    )


def check_release(noise_multiplier: Any, sample_rate: Any, steps: Any) -> tuple[float, float, int]:
    """A mechanism about to run: σ >= 0 finite, q in (0, 1], steps >= 1."""
    return (
        check_nonnegative_finite("noise_multiplier", noise_multiplier),
        check_probability("sample_rate", sample_rate),
        check_int("steps", steps, minimum=1),
    )
