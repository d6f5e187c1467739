"""What the server learned in one round, typed: one line of ``rounds.jsonl``.

:meth:`PrivacyAwareFedAvg.accept_replies` opens a round's :class:`RoundResult` with who was
sampled, accepted, rejected (and why) and dropped; aggregation records its outcome
(:meth:`RoundResult.aggregated` or :meth:`RoundResult.fail`), a method its diagnostics, a
personalized strategy its clients' evaluation. The server's results writer reads
:meth:`RoundResult.to_json` beside the central test accuracy (:mod:`server.results`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoundResult:
    """One round's bookkeeping (client ids, never node ids; ε are cumulative per client).

    Attributes
    ----------
    round : int
        The server round.
    sampled, accepted, dropped : list of str
        Client ids sampled, whose replies were accepted, and that sent none.
    rejected : list of dict
        ``{"client": id, "reason": why}`` for each rejected reply.
    handshake_seconds : float
        Time spent asking new (or unanswered) nodes for their budgets before this round.
    bytes_down, bytes_up : int
        Model bytes sent to the sampled clients and accepted from them (masked vectors under
        secure aggregation).
    epsilon_spent : dict
        Client id -> cumulative ε, for the sampled clients (O(sampled) per round).
    spend : dict
        Statistics over every registered client (:func:`strategies.base.spend_statistics`).
    aggregation_seconds : float
        Time of the aggregation step (0 for a failed round).
    failed : str
        Why the round produced no new global model ("" when it did).
    diagnostics : dict
        The method's own per-round figures (:meth:`round_metrics`: e.g. PFA's public count,
        FedCEO's threshold, GDPFed's per-group counts).
    secure_sums : list of dict or None
        Each secure sum's members, survivors and whether it was released (secure aggregation).
    evaluation : dict
        Clients' evaluation of personalized models (``personalized_*``), where a strategy runs one.
    """

    round: int
    sampled: list[str]
    accepted: list[str]
    rejected: list[dict[str, str]]
    dropped: list[str]
    handshake_seconds: float = 0.0
    bytes_down: int = 0
    bytes_up: int = 0
    epsilon_spent: dict[str, float] = field(default_factory=dict)
    spend: dict[str, float | int] = field(default_factory=dict)
    aggregation_seconds: float = 0.0
    failed: str = ""
    diagnostics: dict[str, float] = field(default_factory=dict)
    secure_sums: list[dict[str, Any]] | None = None
    evaluation: dict[str, float | int] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        """The round produced no new global model, for this reason."""
        self.failed = why

    def aggregated(self, seconds: float, diagnostics: dict[str, float]) -> None:
        """The round's aggregation took ``seconds`` and the method reports ``diagnostics``."""
        self.aggregation_seconds = seconds
        self.diagnostics = dict(diagnostics)

    def to_json(self) -> dict[str, Any]:
        """The flat ``rounds.jsonl`` line (without the central evaluation the server adds)."""
        line: dict[str, Any] = {
            "round": self.round, "sampled": self.sampled, "accepted": self.accepted, "rejected": self.rejected,
            "dropped": self.dropped, "handshake_seconds": self.handshake_seconds, "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up, "epsilon_spent": self.epsilon_spent, **self.spend,
            "aggregation_seconds": self.aggregation_seconds,
        }
        if self.failed:
            line["failed"] = self.failed
        if self.secure_sums is not None:
            line["secure_sums"] = self.secure_sums
        return {**line, **self.diagnostics, **self.evaluation}
