"""Reply validation: a malformed client reply is rejected with a reason, never a crash.

``validate_train_reply`` returns ``None`` for an acceptable reply and a one-line reason
otherwise. It checks the record structure Flower's FedAvg relies on (exactly one
ArrayRecord and one MetricRecord), the arrays against what the server expects (names,
shapes, dtypes, finite values), the privacy figures against what the client declared
in the handshake (same ε budget and δ, spent ε within the budget, non-decreasing, the
same example count), and the mechanism it reports against what the server can derive
itself (:class:`ExpectedRelease`: the σ it fixed, DP-SGD's q and step count from the
handshake's n). Every value is checked for type and range before it is used, so no
reply, however malformed, can raise. What the server cannot verify: the noise a client
actually added, and whether it clipped (an honest client's own ledger is the guarantee).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from privacy.accountants import exceeds_budget
from privacy.mechanisms import ExpectedRelease
from protocol import keys
from protocol.replies import TrainReport

#: Most steps one reply may claim (a sanity bound: far above any real round).
MAX_STEPS = 10_000_000


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


def specs_of(arrays: ArrayRecord) -> list[ArraySpec]:
    """The specs of a reference ArrayRecord (normally the global model)."""
    return [
        ArraySpec(name, tuple(arr.shape), np.dtype(arr.dtype))
        for name, arr in zip(arrays.keys(), arrays.to_numpy_ndarrays(), strict=True)
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
    for spec, name, arr in zip(expected, names, record.to_numpy_ndarrays(), strict=True):
        if tuple(arr.shape) != spec.shape:
            return f"array '{name}' has shape {tuple(arr.shape)}, expected {spec.shape}"
        if np.dtype(arr.dtype) != spec.dtype:
            return f"array '{name}' has dtype {arr.dtype}, expected {spec.dtype}"
        if not np.all(np.isfinite(arr)):
            return f"array '{name}' contains NaN or Inf"
    return None


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def validate_mechanism(report: TrainReport, expected: ExpectedRelease) -> str | None:
    """The reported mechanism (n, σ, q, steps) against what the server can derive."""
    if report.num_examples != expected.num_examples:
        return (f"claimed {keys.NUM_EXAMPLES}={report.num_examples} contradicts the handshake's "
                f"{expected.num_examples} (the aggregation weight must be the declared count)")
    sigma, rate, steps = report.noise_multiplier, report.sample_rate, report.local_steps
    if not (math.isfinite(sigma) and sigma >= 0):
        return f"claimed noise multiplier {sigma!r} is not a finite number >= 0"
    if not (math.isfinite(rate) and 0 < rate <= 1):
        return f"claimed sample rate {rate!r} is outside (0, 1]"
    if not 1 <= steps <= MAX_STEPS:
        return f"claimed steps {steps!r} is not an integer in [1, {MAX_STEPS}]"
    if expected.noise_multiplier is not None and not _same(sigma, expected.noise_multiplier):
        return f"claimed noise multiplier {sigma:g} differs from the {expected.noise_multiplier:g} the server set"
    if expected.sample_rate is not None and not _same(rate, expected.sample_rate):
        return f"claimed sample rate {rate:g} differs from the {expected.sample_rate:g} its example count implies"
    if expected.steps is not None and steps != expected.steps:
        return f"claimed {steps} steps differ from the {expected.steps} its example count implies"
    return None


def validate_privacy_metrics(report: TrainReport, declared: DeclaredBudget | None) -> str | None:
    """The privacy figures of a train report against the handshake's declaration."""
    budget, spent, delta = report.epsilon_budget, report.epsilon_spent, report.delta
    if budget <= 0:
        return f"claimed budget eps={budget} is not positive"
    if spent < 0:
        return f"claimed spent eps={spent} is negative"
    if not 0 < delta < 1:
        return f"claimed delta={delta} is outside (0, 1)"
    if exceeds_budget(spent, budget):
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
    release: ExpectedRelease | None = None,
) -> str | None:
    """``None`` if the train reply is acceptable, else the reason it is rejected."""
    if len(content.array_records) != 1 or keys.ARRAYS not in content.array_records:
        return f"expected exactly one ArrayRecord '{keys.ARRAYS}', got {list(content.array_records)}"
    if len(content.metric_records) != 1 or keys.METRICS not in content.metric_records:
        return f"expected exactly one MetricRecord '{keys.METRICS}', got {list(content.metric_records)}"
    reason = validate_arrays(content.array_records[keys.ARRAYS], expected)
    if reason:
        return reason
    report = TrainReport.decode(content.metric_records[keys.METRICS])
    if isinstance(report, str):
        return report
    reason = validate_privacy_metrics(report, declared)
    if reason or release is None:
        return reason
    return validate_mechanism(report, release)
