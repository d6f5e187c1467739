"""How run-config names and choices are spelled and checked, for both sides of the wire.

Flower's run config is flat and kebab-case (``fedceo.half-spectrum``); privet's pydantic
sections use Python field names (``half_spectrum``). These two helpers are the only bridge,
so a bad value is reported under the key the user typed.
"""

from __future__ import annotations

from collections.abc import Sequence


def kebab(name: str) -> str:
    """A Python field name as a run-config key: ``half_spectrum`` -> ``half-spectrum``."""
    return name.replace("_", "-")


def one_of(key: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else a ValueError naming the key and the choices."""
    if value not in allowed:
        raise ValueError(f"'{key}' must be one of {', '.join(allowed)}; found {value!r}")
    return value


def numbers(key: str, value: str) -> tuple[float, ...]:
    """A run-config list of numbers, written ``"0.5, 1.5, 3"`` (``""`` is empty).

    Flower's run config holds scalars only; a ValueError names the key and the expected form.
    """
    try:
        return tuple(float(x) for x in value.replace(";", ",").split(",") if x.strip())
    except ValueError:
        raise ValueError(f"'{key}' must be comma-separated numbers, e.g. \"0.5, 1.5, 3\"; found {value!r}") from None
