"""How run-config names and choices are spelled and checked, for both sides of the wire.

Flower's run config is flat and kebab-case (``fedceo.half-spectrum``); privet's pydantic
sections use Python field names (``half_spectrum``). These two helpers are the only bridge,
so a bad value is reported under the key the user typed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


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


def typed(key: str, value: Any, kind: type) -> Any:
    """A wire value as ``kind`` (int, float or str); a ValueError names the key.

    An int must be integral and not a bool; a float a real number (not NaN; ±inf passes,
    for the caller's range check to name).
    """
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"'{key}' must be text; found {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{key}' must be a number; found {value!r}")
    if kind is int:
        if not float(value).is_integer():
            raise ValueError(f"'{key}' must be an integer; found {value!r}")
        return int(value)
    if math.isnan(value):
        raise ValueError(f"'{key}' must be a number; found {value!r}")
    return float(value)


def decode_fields(cls: Callable[..., T], record: Mapping[str, Any], key_of: Callable[[str], str],
                  required: Sequence[str] = ()) -> T:
    """A frozen dataclass from a flat record (a Flower ``ConfigRecord``).

    Each field is read under ``key_of(name)`` and typed by its annotation (int, float, str);
    a missing required field or a mistyped value is a ValueError naming the key. Keys the
    class does not know are ignored.
    """
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        key = key_of(f.name)
        if key not in record:
            if f.name in required:
                raise ValueError(f"the config has no '{key}'")
            continue
        values[f.name] = typed(key, record[key], {"int": int, "float": float, "str": str}[str(f.type)])
    return cls(**values)
