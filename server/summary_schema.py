"""``summary.json``'s schema: a run's summary and each client's privacy position, every key spelled once."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from server.audit_text import AuditSection


class ClientSummary(TypedDict):
    """One client's privacy position in ``summary.json`` (every key spelled here once)."""

    client_id: str
    node_id: int
    epsilon_budget: float | None
    epsilon_spent: float | None
    epsilon_spent_before_run: float | None
    epsilon_server_recomputed_this_run: float | None
    epsilon_spent_at_most: float | None
    possibly_charged_rounds: list[int]
    delta: float
    num_examples: int
    rounds_joined: list[int]
    dropped_rounds: list[int]
    rejections: list[dict[str, Any]]
    exhausted: bool
    within_budget: bool
    relation: str
    guarantee_unit: str
    noise_source: str
    guarantee: str
    not_covered: list[str]


class RunSummary(TypedDict):
    """``summary.json``: what a run achieved and every client's position; experiment drivers read it
    with these keys (``None`` where a figure does not exist, e.g. accuracy before any round).
    """

    strategy: str
    dp_mode: str
    dataset: str
    evaluation_split: str
    model: str
    rounds: int
    rounds_completed: int
    final_accuracy: float | None
    best_accuracy: float | None
    final_loss: float | None
    final_personalized_accuracy: float | None
    best_personalized_accuracy: float | None
    accountant: str
    clip: float
    noise_multiplier: float | str
    noise_shares: int
    secure_aggregation: dict[str, Any] | str
    elapsed_seconds: float
    dropped: list[str]
    failed_rounds: list[dict[str, Any]]
    refused: list[dict[str, Any]]
    clients: list[ClientSummary]
    threat_model: dict[str, Any]
    group_dp: NotRequired[dict[str, Any]]  # GDPFed family: the group plan, the aggregation
    dpfedc: NotRequired[dict[str, Any]]  # DP-FedC: what its ε means under its calibration
    report_sections: NotRequired[list[str]]  # keys of sections {"title", "statement"} the privacy report renders
    status: NotRequired[str]
    audit: NotRequired[AuditSection]  # privet audit --out: the empirical ε beside the charge (write_audit)
