"""The audit's results: one audited mechanism's record, ``summary.json``'s ``audit`` section and its report text.

``privet audit`` (:mod:`privet.audit_cmd`, :mod:`privet.audit_flower`) keeps each audited mechanism
in an :class:`AuditRecord` and writes these figures into a results folder
(:func:`server.results.write_audit`); the privacy report (:func:`server.privacy_report.format_privacy_report`)
and the page (:mod:`server.report_html`) both render them from here, so neither imports the other
for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:
    from privacy.mechanism_audit import AuditResult

__all__ = ["AUDIT_STATEMENT", "AuditRecord", "AuditSection", "AuditedMechanism", "audit_figure", "audit_lines",
           "json_epsilon"]


class AuditedMechanism(TypedDict):
    """One audited mechanism in ``summary.json``'s ``audit`` section (``privet audit``'s figures).

    ε figures are numbers, or the strings ``"inf"`` / ``"-inf"`` (as in ``audit.json``).
    """

    game: str
    level: str
    mechanism: str
    observes: str
    canaries: int
    confidence: float
    delta: float
    lower_bound: float | str
    one_shot_epsilon: float | str
    charged_epsilon: float
    flagged: bool
    line: str


class AuditSection(TypedDict):
    """``summary.json``'s ``audit``: what ``privet audit`` measured for one client's mechanisms."""

    client: int
    strategy: str
    dp_mode: str
    epsilon_budget: float | str
    flagged: bool
    mechanisms: list[AuditedMechanism]
    not_audited: list[str]
    settings: dict[str, Any]
    details: str
    #: the resolved configuration audited (``config.json``'s form), written by
    #: :func:`server.results.write_audit`; a later run into the folder keeps the section only if it is its own
    #: (:func:`server.audit_merge.carried_audit`). Absent from sections written before it was recorded.
    audited_config: NotRequired[dict[str, Any]]


def json_epsilon(x: float) -> float | str:
    """An ε figure as ``audit.json`` and ``summary.json`` write it: the number, or ``"inf"`` / ``"-inf"``."""
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One audited mechanism: the statistics, and what every audit of it states, whichever runtime ran it.

    The base of ``privet audit``'s records (:class:`privet.audit_cmd.MechanismAudit`, a canary game in
    process; :class:`privet.audit_flower_report.FlowerAudit`, one view of a real run), which add what their
    runtime ran and observed.

    Attributes
    ----------
    mechanism : str
        The client mechanism's kind (:attr:`privacy.mechanisms.Mechanism.kind`).
    result : AuditResult
        The bounds, the estimate, the charge and the flag (:func:`privacy.mechanism_audit.assess`).
    noise_multiplier, clip : float
        σ the canaries ran with, C.
    releases_per_canary : int
        The most releases one canary made.
    noise_source : str
        The canaries' DP randomness (the config's ``noise-source``).
    """

    mechanism: str
    result: AuditResult
    noise_multiplier: float
    clip: float
    releases_per_canary: int
    noise_source: str

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the charge (:attr:`AuditResult.flagged`)."""
        return self.result.flagged

    def line(self) -> str:
        """One line naming the mechanism and both figures (:meth:`AuditResult.line`)."""
        return self.result.line()

    def result_record(self) -> dict[str, Any]:
        """The flag, the line and the result's figures, JSON-safe: the part of ``audit.json``'s record that every
        runtime writes alike (between the record's identity and its runtime's parameters).
        """
        r = self.result
        return {"flagged": self.flagged, "line": self.line(), "lower_bound": json_epsilon(r.lower_bound),
                "one_run_bound": json_epsilon(r.one_run_bound), "threshold_bound": json_epsilon(r.threshold_bound),
                "one_shot_epsilon": json_epsilon(r.one_shot_epsilon), "charged_epsilon": r.charged_epsilon,
                "delta": r.delta, "confidence": r.confidence, "canaries": r.canaries, "releases": r.releases,
                "violation": r.violation, "profile": [list(p) for p in r.profile],
                "charged_history": r.charged_history(), "relation": r.relation, "seconds": r.seconds}

    def summary_entry(self, game: str, level: str, observes: str) -> AuditedMechanism:
        """This mechanism in ``summary.json``'s ``audit`` section, under the name ``game`` (what ran it),
        ``level`` (what one canary is) and ``observes`` (what its adversary saw).
        """
        r = self.result
        return {"game": game, "level": level, "mechanism": self.mechanism, "observes": observes,
                "canaries": r.canaries, "confidence": r.confidence, "delta": r.delta,
                "lower_bound": json_epsilon(r.lower_bound), "one_shot_epsilon": json_epsilon(r.one_shot_epsilon),
                "charged_epsilon": r.charged_epsilon, "flagged": self.flagged, "line": self.line()}


#: What an audit's result proves, said with every audit section.
AUDIT_STATEMENT = ("A lower bound at the stated confidence: above the charge refutes it; below it proves nothing "
                   "beyond 'this attack did not break it'. The one-shot figure is an estimate, never a bound.")


def audit_figure(x: float | str | None) -> str:
    """An audit's ε figure for a report: three decimals, or ``inf`` / ``-inf`` as ``audit.json`` writes them."""
    return str(x) if isinstance(x, str) else "n/a" if x is None else f"{x:.3f}"


def audit_lines(audit: AuditSection) -> list[str]:
    """``privacy_report.md``'s section for ``privet audit``'s figures (markdown), from ``summary.json``'s ``audit``."""
    lines = [f"## Empirical privacy audit (privet audit, client {audit['client']})", "",
             f"{audit['strategy']}, dp-mode {audit['dp_mode']}, client {audit['client']} (budget "
             f"eps={audit_figure(audit['epsilon_budget'])}): canaries through privet's own client mechanisms, "
             f"calibration and ledger; every figure in {audit['details']}.", ""]
    if audit["mechanisms"]:
        lines += ["| game | level | mechanism | canaries | confidence | lower bound eps | one-shot estimate eps "
                  "| charged eps | delta | flagged |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {m['game']} | {m['level']} | {m['mechanism']} | {m['canaries']} | {m['confidence']:g} | "
                  f"{audit_figure(m['lower_bound'])} | {audit_figure(m['one_shot_epsilon'])} | "
                  f"{audit_figure(m['charged_epsilon'])} | {m['delta']:g} | {'FLAGGED' if m['flagged'] else 'no'} |"
                  for m in audit["mechanisms"]]
        lines += [""] + [f"- {m['game']} observes {m['observes']}." for m in audit["mechanisms"]]
        lines += [f"- {m['line']}" for m in audit["mechanisms"] if m["flagged"]]
    else:
        lines.append("No mechanism was audited.")
    lines += [f"- not audited: {why}" for why in audit["not_audited"]]
    return [*lines, "", AUDIT_STATEMENT]
