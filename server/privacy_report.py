"""The privacy report of a run (``privacy_report.md``, what ``privet report <out>`` prints), from its summary."""

from __future__ import annotations

from typing import Any

from server.audit_text import audit_lines
from server.summary_schema import RunSummary


def format_privacy_report(summary: RunSummary) -> str:
    """The human-readable privacy report of a run (markdown), with ``privet audit``'s section where it has one.

    A folder that holds only an audit (``privet audit --out`` without a run) gets that section alone.
    """
    if "clients" not in summary:
        return "\n".join(["# Privacy report: an empirical audit (no run in this folder)", "",
                          *audit_lines(summary["audit"])]) + "\n"
    return _format_run_report(summary) + ("\n" + "\n".join(audit_lines(summary["audit"])) + "\n"
                                          if "audit" in summary else "")


def _format_run_report(summary: RunSummary) -> str:
    def eps(x: float | None) -> str:
        return "inf" if x is None else f"{x:.4f}"

    lines = [
        f"# Privacy report: {summary['strategy']} ({summary['dp_mode']})",
        "",
        f"Dataset {summary['dataset']}, model {summary['model']}, "
        f"{summary['rounds_completed']}/{summary['rounds']} rounds, accountant {summary['accountant']}, "
        f"clip {summary['clip']}, noise multiplier {summary['noise_multiplier']}.",
        f"Run status: {summary.get('status', 'completed')}.",
        f"Threat model: the guarantees below hold against {summary['threat_model']['holds_against']} "
        f"({summary['threat_model']['why']}).",
        f"Final {summary.get('evaluation_split', 'test')} accuracy: {summary['final_accuracy']}"
        + (f"; clients' personal models: {summary['final_personalized_accuracy']}"
           if summary.get("final_personalized_accuracy") is not None else ""),
        "",
        "| client | budget eps | spent eps | before run | server check (this run) | delta | rounds | dropped | within budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["clients"]:
        lines.append(
            f"| {c['client_id']} | {eps(c['epsilon_budget'])} | {eps(c['epsilon_spent'])} | "
            f"{eps(c['epsilon_spent_before_run'])} | {eps(c['epsilon_server_recomputed_this_run'])} | "
            f"{c['delta']:g} | {len(c['rounds_joined'])} | {len(c['dropped_rounds'])} | "
            f"{'n/a (no budget)' if c['epsilon_budget'] is None else 'yes' if c['within_budget'] else 'NO'} |"
        )
    over = [c["client_id"] for c in summary["clients"] if c["epsilon_budget"] is not None and not c["within_budget"]]
    lines += ["", f"Clients over budget: {', '.join(over) if over else 'none'}."]
    if summary["dropped"]:
        lines.append(f"Clients that dropped out of at least one round: {', '.join(summary['dropped'])}.")
    rejected = [(c["client_id"], r) for c in summary["clients"] for r in c["rejections"]]
    lines += ["", "## Rejected replies (not aggregated; the reason each was refused)", ""] if rejected else []
    for cid, r in rejected:
        lines.append(f"- round {r['round']}: client {cid}: {r['reason']}")
    if summary.get("refused"):
        lines += ["", "## Sites refused at the handshake (never scheduled, no budget spent here)", ""]
        lines += [f"- {r['client_id']} (node {r['node_id']}): {r['reason']}" for r in summary["refused"]]
    possible = [c for c in summary["clients"] if c.get("possibly_charged_rounds")
                and c.get("epsilon_spent_at_most", c["epsilon_spent"]) != c["epsilon_spent"]]
    if possible:
        lines += ["", "## Spend possibly charged by replies the server did not receive", "",
                  "Rounds a client was sampled in without an accepted reply (dropped, rejected, or in flight when the",
                  "run stopped) may have charged its ledger with the mechanism the server asked for: its ledger holds",
                  "at least the spent eps above and at most:", ""]
        lines += [f"- {c['client_id']}: at most {eps(c['epsilon_spent_at_most'])} (known {eps(c['epsilon_spent'])}; "
                  f"possibly charged in round{'s' if len(c['possibly_charged_rounds']) > 1 else ''} "
                  f"{', '.join(map(str, c['possibly_charged_rounds']))})" for c in possible]
    if summary.get("failed_rounds"):
        lines += ["", "## Failed rounds (no new global model; what clients spent in them is counted above)", ""]
        lines += [f"- round {f['round']}: {f['reason']}" for f in summary["failed_rounds"]]
    guarantees: dict[str, list[str]] = {}
    for c in summary["clients"]:
        guarantees.setdefault(c["guarantee"], []).append(str(c["client_id"]))
    if guarantees:
        lines += ["", "## What each client's epsilon guarantees", ""]
        for text, ids in guarantees.items():
            lines.append(f"- clients {', '.join(ids)}: {text}.")
    uncovered = [(c["client_id"], what) for c in summary["clients"] for what in c.get("not_covered", [])]
    lines += ["", "## Not covered by any client's epsilon", ""]
    lines += [f"- client {cid}: {what}" for cid, what in uncovered] or ["- nothing beyond what every reply carries:"]
    lines += [
        "- every reply also carries the client's example count (public under replace-one), its budget, delta and",
        "  spent epsilon, and the mechanism's sigma, q and step count: functions of public figures only;",
        *_secure_lines(summary.get("secure_aggregation")),
        _sampler_line(summary.get("secure_aggregation")),
        "",
        "'spent eps' is the client's own ledger (cumulative over all runs it took part in); 'server check' is",
        "recomputed by the server from the mechanism each accepted reply reported, after checking what it can",
        "derive itself (example count, the sigma it set, DP-SGD's q and steps); a reply whose claimed epsilon is",
        "below that recomputation is rejected. The server cannot see the noise a client actually added.",
    ]
    for key in summary.get("report_sections", []):  # a task's own sections (server.evaluation: DP-FedC's calibration)
        section = summary[key]  # type: ignore[literal-required]
        lines += ["", f"## {section['title']}", "", section["statement"]]
    return "\n".join(lines) + "\n"


def _secure_lines(secure: Any) -> list[str]:
    """The report's lines on who saw individual uploads."""
    if not isinstance(secure, dict):
        return ["- secure aggregation is not used: the server sees every upload, and each is charged on its own;"]
    if secure.get("mode") == "secagg+ddg":  # the distributed discrete Gaussian (privacy/mechanisms/ddg.py)
        return [
            f"- secure aggregation ({secure['protocol']}, threshold {secure['threshold']}, r_min "
            f"{secure['min-survivors'] or 'noise-shares'}, sums mod 2^{secure['bits']} of distributed discrete "
            f"Gaussian shares): {secure['trust_model']};",
            "  it cannot stop a malicious client from sending an out-of-bound input (only a gross one fails the sum's",
            "  norm check); the released integer sum is exactly the mechanism accounted (nothing is quantised outside",
            f"  it); a sum wraps around mod 2^{secure['bits']} with probability <= {secure['wrap-probability']:g} (a "
            "utility event, stated per sum in rounds.jsonl);",
            "  the round's wall time is not covered (exact sampling and conditional rounding take random time, the",
            "  rounding's retries depend on the update's norm);",
        ]
    return [
        f"- secure aggregation ({secure['protocol']}, threshold {secure['threshold']}, r_min "
        f"{secure['min-survivors'] or 'noise-shares'}, {secure['bits']} bits): {secure['trust_model']};",
        "  it cannot stop a malicious client from sending an unclipped update (only a gross one fails the sum's",
        "  norm check), and the quantisation before the sum is outside the accounting;",
    ]


def _sampler_line(secure: Any) -> str:
    """The report's line on the noise sampler's floating-point arithmetic (issue 39, item 3)."""
    if isinstance(secure, dict) and secure.get("mode") == "secagg+ddg":
        return ("- the noise is exact: discrete Gaussian integers drawn with integer and rational arithmetic only "
                "(Canonne, Kamath & Steinke 2020), so floating-point attacks on the sampler do not apply.")
    return ("- floating-point attacks on the Gaussian sampler are not countered (float Gaussian noise; "
            "secure-aggregation = \"secagg+ddg\" draws exact integer noise instead).")
