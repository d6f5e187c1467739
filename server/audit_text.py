"""The audit's section of a run's results: ``summary.json``'s ``audit`` and its report text.

``privet audit`` (:mod:`privet.audit_cmd`) writes these figures into a results folder
(:func:`server.results.write_audit`); the privacy report (:func:`server.results.format_privacy_report`)
and the page (:mod:`server.report_html`) both render them from here, so neither imports the other
for them.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

__all__ = ["AUDIT_STATEMENT", "AuditSection", "AuditedMechanism", "audit_figure", "audit_lines"]


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
