"""What a client answers, typed on both sides: its budget declaration and its train report.

The client encodes (:meth:`BudgetDeclaration.encode`, :meth:`TrainReport.metrics`); the server
decodes, and a reply it cannot decode is refused with the reason, never an exception
(:meth:`BudgetDeclaration.decode` raises ``ValueError``; :meth:`TrainReport.decode` returns the
reason). Decoding checks only form (present, scalar, a number of the right kind); what the
figures must agree with (the handshake, the server's own recomputation) is checked by
:mod:`strategies.validation`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ConfigRecord, MetricRecord, RecordDict

from protocol import keys

#: The metrics every train reply must carry (covered by the client's ledger).
REQUIRED_TRAIN_METRICS = (
    keys.NUM_EXAMPLES,
    keys.EPSILON_SPENT,
    keys.EPSILON_BUDGET,
    keys.DELTA,
    keys.NOISE_MULTIPLIER,
    keys.SAMPLE_RATE,
    keys.LOCAL_STEPS,
)


@dataclass(frozen=True)
class BudgetDeclaration:
    """The handshake reply: who the client is and what it may spend.

    Attributes
    ----------
    client_id : str
        The node's ``client-id`` (the name every report uses).
    epsilon_budget, delta : float
        Its (ε, δ) budget (ε may be inf: a client without one, for non-private runs).
    num_examples : int
        The examples it trains on (a FedAvg weight, capped by ``max-examples-per-client``).
    epsilon_spent : float
        ε its ledger holds already, from earlier runs.
    guarantee_unit : str
        ``"record"`` or ``"client"``: what its ε protects.
    noise_source : str
        Where its DP randomness comes from (:mod:`privacy.randomness`).
    client_evaluation : bool
        Whether its operator lets it evaluate on its private data (an uncharged release).
    signature : bytes
        Its signature of the handshake's challenge (:func:`protocol.budget_query.handshake_transcript`);
        empty without a signing key.
    """

    client_id: str
    epsilon_budget: float
    delta: float
    num_examples: int
    epsilon_spent: float
    guarantee_unit: str = "record"
    noise_source: str = "unknown"
    client_evaluation: bool = False
    signature: bytes = b""

    def encode(self, meta: Mapping[str, str] | None = None) -> RecordDict:
        """The reply's content; ``meta`` adds metadata (e.g. the budget source)."""
        metrics = MetricRecord({keys.EPSILON_BUDGET: float(self.epsilon_budget),
                                keys.EPSILON_SPENT: float(self.epsilon_spent), keys.DELTA: float(self.delta),
                                keys.NUM_EXAMPLES: int(self.num_examples)})
        record = ConfigRecord({**(meta or {}), keys.CLIENT_ID: self.client_id,
                               keys.NOISE_SOURCE: self.noise_source, keys.GUARANTEE_UNIT: self.guarantee_unit,
                               keys.CLIENT_EVALUATION: "on" if self.client_evaluation else "off",
                               keys.SIGNATURE: self.signature})
        return RecordDict({keys.METRICS: metrics, keys.META: record})

    @classmethod
    def decode(cls, content: RecordDict) -> BudgetDeclaration:
        """Read a handshake reply; ``ValueError`` with the reason if it is malformed.

        Form only: (ε, δ, spent) must be numbers, the example count a positive integer; the
        handshake then checks their ranges and what the strategy can use.
        """
        try:
            m = content.metric_records[keys.METRICS]
            meta = content.config_records[keys.META]
            num = _number(m, keys.NUM_EXAMPLES)
            if not (math.isfinite(num) and num >= 1 and num == int(num)):
                raise ValueError(f"'{keys.NUM_EXAMPLES}' must be a positive integer, got {num!r}")
            return cls(client_id=str(meta[keys.CLIENT_ID]), epsilon_budget=_number(m, keys.EPSILON_BUDGET),
                       delta=_number(m, keys.DELTA), num_examples=int(num),
                       epsilon_spent=_number(m, keys.EPSILON_SPENT),
                       guarantee_unit=str(meta.get(keys.GUARANTEE_UNIT, "record")),
                       noise_source=str(meta.get(keys.NOISE_SOURCE, "unknown")),
                       client_evaluation=str(meta.get(keys.CLIENT_EVALUATION, "off")) == "on",
                       signature=_bytes(meta.get(keys.SIGNATURE, b"")))
        except KeyError as exc:
            raise ValueError(f"missing {exc}") from None


def _bytes(value: object) -> bytes:
    if not isinstance(value, bytes) or len(value) > 256:
        raise ValueError(f"'{keys.SIGNATURE}' must be at most 256 bytes")
    return value


@dataclass(frozen=True)
class TrainReport:
    """The privacy figures of a train reply (all covered by the client's ledger).

    Attributes
    ----------
    num_examples : int
        The examples trained on (a FedAvg weight: must equal what the server expects).
    epsilon_budget, delta, epsilon_spent : float
        The ledger's budget and cumulative ε after this round.
    noise_multiplier, sample_rate : float
        The mechanism run: σ (as sent to it) and q.
    local_steps : int
        Its number of steps (DP-SGD steps; 1 for an update release; T for a GDPFed group).
    epsilon_round : float
        ε of this round alone (NaN when the client did not say).
    clip : float
        C (NaN when the client did not say).
    extra : dict
        Every other scalar metric (uncovered ones only where the operator opted in).
    """

    num_examples: int
    epsilon_budget: float
    delta: float
    epsilon_spent: float
    noise_multiplier: float
    sample_rate: float
    local_steps: int
    epsilon_round: float = math.nan
    clip: float = math.nan
    extra: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, int | float | list[int] | list[float]]:
        """The reply's MetricRecord entries."""
        out: dict[str, int | float | list[int] | list[float]] = {
            **self.extra, keys.NUM_EXAMPLES: int(self.num_examples), keys.EPSILON_BUDGET: float(self.epsilon_budget),
            keys.DELTA: float(self.delta), keys.EPSILON_SPENT: float(self.epsilon_spent),
            keys.NOISE_MULTIPLIER: float(self.noise_multiplier), keys.SAMPLE_RATE: float(self.sample_rate),
            keys.LOCAL_STEPS: float(self.local_steps)}
        if not math.isnan(self.epsilon_round):
            out[keys.EPSILON_ROUND] = float(self.epsilon_round)
        if not math.isnan(self.clip):
            out[keys.CLIP] = float(self.clip)
        return out

    def as_dict(self) -> dict[str, float]:
        """Every scalar figure by its wire key (what strategies read by key)."""
        return {k: float(v) for k, v in self.metrics().items() if not isinstance(v, list)}

    @classmethod
    def decode(cls, metrics: Mapping[str, Any]) -> TrainReport | str:
        """The report, or the reason it cannot be read.

        A required metric missing, not a scalar number or NaN, an example count that is not a
        positive integer, or a step count that is not an integer.
        """
        for key in REQUIRED_TRAIN_METRICS:
            if key not in metrics:
                return f"missing metric '{key}'"
            value = metrics[key]
            if isinstance(value, list) or isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"metric '{key}' must be a scalar, got {value!r}"
            if math.isnan(float(value)):
                return f"metric '{key}' is NaN"
        num = float(metrics[keys.NUM_EXAMPLES])
        if not math.isfinite(num) or num <= 0 or num != int(num):
            return f"metric '{keys.NUM_EXAMPLES}' must be a positive integer, got {metrics[keys.NUM_EXAMPLES]!r}"
        steps = float(metrics[keys.LOCAL_STEPS])
        if not (math.isfinite(steps) and steps == int(steps)):
            return f"claimed steps {steps!r} is not an integer"
        scalars = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        known = {*REQUIRED_TRAIN_METRICS, keys.EPSILON_ROUND, keys.CLIP}
        return cls(num_examples=int(num), epsilon_budget=scalars[keys.EPSILON_BUDGET], delta=scalars[keys.DELTA],
                   epsilon_spent=scalars[keys.EPSILON_SPENT], noise_multiplier=scalars[keys.NOISE_MULTIPLIER],
                   sample_rate=scalars[keys.SAMPLE_RATE], local_steps=int(steps),
                   epsilon_round=scalars.get(keys.EPSILON_ROUND, math.nan), clip=scalars.get(keys.CLIP, math.nan),
                   extra={k: v for k, v in scalars.items() if k not in known})


@dataclass(frozen=True)
class EvaluationReport:
    """An evaluate reply: the client's model on its local test split.

    An uncharged release, sent only where the client's operator allows it.
    """

    accuracy: float
    loss: float
    num_examples: int

    def metrics(self) -> MetricRecord:
        """The reply's MetricRecord."""
        return MetricRecord({keys.EVAL_LOSS: float(self.loss), keys.EVAL_ACCURACY: float(self.accuracy),
                             keys.NUM_EXAMPLES: int(self.num_examples)})

    @classmethod
    def decode(cls, content: RecordDict) -> EvaluationReport:
        """Read an evaluate reply; ``ValueError`` if malformed or implausible.

        Implausible: an accuracy outside [0, 1], a non-finite loss, no examples.
        """
        try:
            m = content.metric_records[keys.METRICS]
            accuracy, loss, num = _number(m, keys.EVAL_ACCURACY), _number(m, keys.EVAL_LOSS), _number(m, keys.NUM_EXAMPLES)
        except KeyError as exc:
            raise ValueError(f"missing {exc}") from None
        if not (0.0 <= accuracy <= 1.0 and math.isfinite(loss) and num >= 1 and num == int(num)):
            raise ValueError(f"implausible (accuracy={accuracy}, loss={loss}, n={num})")
        return cls(accuracy, loss, int(num))


def _number(record: Mapping[str, Any], key: str) -> float:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'{key}' must be a number, got {value!r}")
    return float(value)
