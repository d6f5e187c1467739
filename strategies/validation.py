"""Reply validation: a malformed client reply is rejected with a reason, never a crash.

``validate_train_reply`` returns ``None`` for an acceptable reply and a one-line reason
otherwise. It checks the record structure Flower's FedAvg relies on (exactly one
ArrayRecord and one MetricRecord), the arrays against what the server expects (names,
shapes, dtypes, finite values) and the privacy figures against what the client declared
in the handshake (same ε budget and δ, spent ε within the budget, non-decreasing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from strategies import keys

#: Relative slack when comparing a claimed spent ε with its budget (float round-off).
EPSILON_TOLERANCE = 1e-6

REQUIRED_TRAIN_METRICS = (keys.NUM_EXAMPLES, keys.EPSILON_SPENT, keys.EPSILON_BUDGET, keys.DELTA)


@dataclass(frozen=True)
class ArraySpec:
    """What one uploaded array must look like."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class DeclaredBudget:
    """What a client said about its budget in the handshake (or its last reply)."""

    epsilon_budget: float
    delta: float
    epsilon_spent: float


def kebab(name: str) -> str:
    """A Python field name as a run-config key: ``half_spectrum`` -> ``half-spectrum``."""
    return name.replace("_", "-")


def one_of(key: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else a ValueError naming the key and the choices."""
    if value not in allowed:
        raise ValueError(f"'{key}' must be one of {', '.join(allowed)}; found {value!r}")
    return value


def specs_of(arrays: ArrayRecord) -> list[ArraySpec]:
    """The specs of a reference ArrayRecord (normally the global model)."""
    return [
        ArraySpec(name, tuple(arr.shape), np.dtype(arr.dtype))
        for name, arr in zip(arrays.keys(), arrays.to_numpy_ndarrays())
    ]


def _same_budget(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def validate_arrays(record: ArrayRecord, expected: Sequence[ArraySpec]) -> str | None:
    """Names, shapes, dtypes and finiteness of an uploaded ArrayRecord."""
    names = list(record.keys())
    if len(names) != len(expected):
        return f"expected {len(expected)} arrays, got {len(names)}"
    for spec, name, arr in zip(expected, names, record.to_numpy_ndarrays()):
        if tuple(arr.shape) != spec.shape:
            return f"array '{name}' has shape {tuple(arr.shape)}, expected {spec.shape}"
        if np.dtype(arr.dtype) != spec.dtype:
            return f"array '{name}' has dtype {arr.dtype}, expected {spec.dtype}"
        if not np.all(np.isfinite(arr)):
            return f"array '{name}' contains NaN or Inf"
    return None


def validate_privacy_metrics(metrics: MetricRecord, declared: DeclaredBudget | None) -> str | None:
    """The privacy figures of a train reply against the handshake's declaration."""
    for key in REQUIRED_TRAIN_METRICS:
        if key not in metrics:
            return f"missing metric '{key}'"
        value = metrics[key]
        if isinstance(value, list) or isinstance(value, bool):
            return f"metric '{key}' must be a scalar, got {value!r}"
        if math.isnan(float(value)):
            return f"metric '{key}' is NaN"
    num = metrics[keys.NUM_EXAMPLES]
    if float(num) <= 0 or float(num) != int(num):
        return f"metric '{keys.NUM_EXAMPLES}' must be a positive integer, got {num!r}"
    budget = float(metrics[keys.EPSILON_BUDGET])
    spent = float(metrics[keys.EPSILON_SPENT])
    delta = float(metrics[keys.DELTA])
    if budget <= 0:
        return f"claimed budget eps={budget} is not positive"
    if spent < 0:
        return f"claimed spent eps={spent} is negative"
    if not 0 < delta < 1:
        return f"claimed delta={delta} is outside (0, 1)"
    if spent > budget * (1 + EPSILON_TOLERANCE) + 1e-12:
        return f"claimed spent eps={spent:.6g} exceeds the claimed budget {budget:.6g}"
    if declared is not None:
        if not _same_budget(budget, declared.epsilon_budget):
            return f"claimed budget eps={budget:.6g} contradicts the handshake's {declared.epsilon_budget:.6g}"
        if not _same_budget(delta, declared.delta):
            return f"claimed delta={delta:.3g} contradicts the handshake's {declared.delta:.3g}"
        if spent + 1e-9 < declared.epsilon_spent:
            return f"claimed spent eps={spent:.6g} is below what it had already spent ({declared.epsilon_spent:.6g})"
    return None


def validate_train_reply(
    content: RecordDict,
    expected: Sequence[ArraySpec],
    declared: DeclaredBudget | None,
) -> str | None:
    """``None`` if the train reply is acceptable, else the reason it is rejected."""
    if len(content.array_records) != 1 or keys.ARRAYS not in content.array_records:
        return f"expected exactly one ArrayRecord '{keys.ARRAYS}', got {list(content.array_records)}"
    if len(content.metric_records) != 1 or keys.METRICS not in content.metric_records:
        return f"expected exactly one MetricRecord '{keys.METRICS}', got {list(content.metric_records)}"
    reason = validate_arrays(content.array_records[keys.ARRAYS], expected)
    if reason:
        return reason
    return validate_privacy_metrics(content.metric_records[keys.METRICS], declared)
