"""What ``privet audit --runtime flower`` reports: one record per view, and the report of the run.

:class:`FlowerAudit` is one adversary's view of the canary clients of a real run (``upload``, the
server's white-box view, or ``final-model``, the black-box view of the released model; their
adversaries are :data:`VIEW_OBSERVES`); :class:`FlowerAuditReport` is the text report, the run's
``summary.json`` ``audit`` section and ``audit.json``. The audit itself is :mod:`privet.audit_flower`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from server.audit_text import AuditRecord, json_epsilon

if TYPE_CHECKING:
    from server.audit_text import AuditSection

__all__ = ["VIEW_OBSERVES", "FlowerAudit", "FlowerAuditReport"]

#: What each view's adversary sees.
VIEW_OBSERVES: Final[dict[str, str]] = {
    "upload": "every train reply of each canary client as the server's strategy receives it (white-box: "
              "the directions, the global model sent, and with noise-source = seeded the run seed)",
    "final-model": "only the released global model, its change from the initial model (black-box; with "
                   "noise-source = seeded also every client's regenerated noise, weighted as FedAvg's mean)",
}


@dataclass(frozen=True, kw_only=True)
class FlowerAudit(AuditRecord):
    """One view's audit of the canary clients of a real run.

    The result (the charge: the canaries' ledgers), mechanism, σ (the median the canaries reported
    over their replies), C, releases per canary (the most one canary's ledger recorded in the run)
    and noise source, the flag and the line are :class:`server.audit_text.AuditRecord`'s (shared
    with the in-process games' records).

    Attributes
    ----------
    view : str
        ``upload`` (white-box) or ``final-model`` (black-box) (:data:`VIEW_OBSERVES`).
    rounds : int
        The rounds the run declared.
    """

    view: str
    rounds: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record (``audit.json``)."""
        return {"view": self.view, "level": "client", "mechanism": self.mechanism,
                "observes": VIEW_OBSERVES[self.view], **self.result_record(), "noise_multiplier": self.noise_multiplier,
                "clip": self.clip, "releases_per_canary": self.releases_per_canary, "rounds": self.rounds,
                "noise_source": self.noise_source}


@dataclass(frozen=True)
class FlowerAuditReport:
    """The audit of one real run: its views, and the canaries' ledgers.

    Attributes
    ----------
    strategy, dp_mode : str
        The run's.
    client : int
        The audited client whose budget and δ every canary holds.
    epsilon_budget : float
        That budget.
    real_clients, canaries : int
        The config's clients, and the canary clients started beside them.
    audits : tuple of FlowerAudit
        One per view (``upload``, ``final-model``).
    ledger_epsilons : tuple of float
        ε spent by each canary's ledger after the run (as the ledger computes it).
    run_seconds : float
        Wall time of the run.
    results : str
        The run's results folder (summary.json with the audit's section, privacy_report.md, report.html,
        model.npz), or ``(temporary)``.
    """

    strategy: str
    dp_mode: str
    client: int
    epsilon_budget: float
    real_clients: int
    canaries: int
    audits: tuple[FlowerAudit, ...]
    ledger_epsilons: tuple[float, ...]
    run_seconds: float
    results: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def flagged(self) -> tuple[FlowerAudit, ...]:
        """The views whose lower bound exceeds the charge."""
        return tuple(a for a in self.audits if a.flagged)

    def lines(self) -> list[str]:
        """The text report."""
        spent = self.ledger_epsilons
        out = [f"privet audit (runtime flower): {self.strategy}, dp-mode {self.dp_mode}; a real run of "
               f"{self.real_clients} clients and {self.canaries} canary clients, each with the budget of client "
               f"{self.client} (eps={self.epsilon_budget:g}), {self.run_seconds:.1f} s (privet/audit_flower.py)",
               f"  canary ledgers after the run: eps spent {min(spent):.4f} to {max(spent):.4f}"]
        for a in self.audits:
            out.append(f"  {a.view} ({a.mechanism}, client level, sigma={a.noise_multiplier:.4g}, C={a.clip:g}, "
                       f"T={a.rounds}, a canary released at most {a.releases_per_canary}; noise {a.noise_source})")
            out.append(f"    observes: {VIEW_OBSERVES[a.view]}")
            out.append(f"    {a.line()}")
        out.append(f"  the run's results: {self.results}")
        out.append("A lower bound at the stated confidence: above the charge refutes it; below it proves nothing "
                   "beyond 'this attack did not break it'.")
        return out

    def summary_section(self) -> AuditSection:
        """The run's ``summary.json`` ``audit`` section (:class:`server.audit_text.AuditSection`; shown in
        ``privacy_report.md`` and ``report.html``): one entry per view; ``audit.json`` has the rest.
        """
        mechanisms = [a.summary_entry(f"real run, {a.view} view", "client", VIEW_OBSERVES[a.view])
                      for a in self.audits]
        return {"client": self.client, "strategy": self.strategy, "dp_mode": self.dp_mode,
                "epsilon_budget": json_epsilon(self.epsilon_budget), "flagged": bool(self.flagged),
                "mechanisms": mechanisms,
                "not_audited": ["the server's deviations (a run extended beyond its declared rounds): the real run's "
                                "server is the configured strategy; the in-process games play them"],
                "settings": {**self.settings, "runtime": "flower", "real_clients": self.real_clients},
                "details": "audit.json"}

    def to_dict(self) -> dict[str, Any]:
        """``audit.json``."""
        return {"runtime": "flower", "strategy": self.strategy, "dp_mode": self.dp_mode, "client": self.client,
                "epsilon_budget": json_epsilon(self.epsilon_budget), "real_clients": self.real_clients,
                "canaries": self.canaries, "flagged": bool(self.flagged),
                "audits": [a.to_dict() for a in self.audits], "ledger_epsilons": list(self.ledger_epsilons),
                "run_seconds": self.run_seconds, "results": self.results, "settings": self.settings}
