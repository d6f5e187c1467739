"""An audit and a run in one results folder: whether they are of the same configuration, and what a run keeps.

``privet audit --out DIR`` adds its section to DIR's ``summary.json`` (:func:`server.results.write_audit`,
which records the configuration it audited there as ``audited_config``); ``privet run --out DIR``
rewrites that summary (:class:`server.results.ResultsWriter`). Both sides ask this module one question,
answered in one place (:func:`config_difference`): an audit is of a run's configuration when the two
resolved configurations (``config.json``'s form, :func:`config_record`) are equal but for
:data:`AUDIT_IGNORED_KEYS`.

- The audit's side, :func:`audit_merge_refusal`: it refuses to write into a run of another configuration.
- The run's side, :func:`carried_audit`: a run keeps the folder's audit of its own configuration (in
  ``summary.json``, ``privacy_report.md`` and ``report.html``, ``audit.json`` untouched); an audit of
  another configuration, or of one it cannot tell, is never shown as the run's: it is left out of the
  three, its ``audit.json`` is renamed :data:`STALE_AUDIT` (kept, not deleted: it is the only record of
  that audit), and one line is logged.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Final, cast

from server.audit_text import AuditSection
from server.config import RunConfig

__all__ = ["AUDIT_IGNORED_KEYS", "STALE_AUDIT", "audit_merge_refusal", "carried_audit", "config_difference",
           "config_record"]

log = logging.getLogger("privet.server")

#: Run-config keys that do not change a client's mechanism: an audit of a config that differs from a
#: run's only in them is an audit of that run's mechanisms. ``roster``: the audit runs no secure-sum
#: protocol (:mod:`privet.audit_setup` drops it), and ``privet run`` adds a simulated one of its own.
AUDIT_IGNORED_KEYS: Final = ("out-dir", "data-dir", "checkpoint-rounds", "round-timeout", "ledger-dir", "roster")

#: What ``audit.json`` becomes in a folder where a run of another configuration left the audit out.
STALE_AUDIT: Final = "audit-of-another-config.json"


def config_record(cfg: RunConfig) -> dict[str, Any]:
    """The resolved configuration as ``config.json`` holds it (JSON types: lists, not tuples)."""
    record: dict[str, Any] = json.loads(json.dumps(cfg.model_dump(by_alias=True)))
    return record


def config_difference(recorded: dict[str, Any], cfg: RunConfig) -> list[str]:
    """The keys, sorted, in which ``recorded`` (:func:`config_record`'s form) and ``cfg`` differ, but for
    :data:`AUDIT_IGNORED_KEYS`: empty when an audit of the one is an audit of the other.
    """
    mine = config_record(cfg)
    return sorted(k for k in set(recorded) | set(mine)
                  if k not in AUDIT_IGNORED_KEYS and recorded.get(k) != mine.get(k))


def _json(path: Path) -> Any:
    """``path``'s JSON, or None where it is absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def audit_merge_refusal(out: str | os.PathLike[str], cfg: RunConfig) -> str | None:
    """Why ``privet audit`` of ``cfg`` must not write its section into ``out`` (None: it may).

    It may where ``out`` holds no ``summary.json``, one of an earlier audit alone, or a run of the
    same configuration (``config.json`` against ``cfg``: :func:`config_difference`).
    """
    out = Path(out)
    path = out / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path} is not a privet summary ({exc}); use another --out"
    if not isinstance(summary, dict) or ("clients" not in summary and "audit" not in summary):
        return f"{path} is not a privet summary; use another --out"
    if "clients" not in summary:
        return None  # an earlier audit alone: replaced
    config_path = out / "config.json"
    if not config_path.exists():
        return f"{out} holds a run without its config.json, so the audit cannot tell it audits the same config"
    differ = config_difference(json.loads(config_path.read_text()), cfg)
    if differ:
        return (f"{out} holds a run of another configuration (differs in {', '.join(differ)}); audit that "
                "run's config, or use another --out")
    return None


def carried_audit(out: str | os.PathLike[str], cfg: RunConfig) -> AuditSection | None:
    """The audit section a run of ``cfg`` into ``out`` keeps; call it before the run writes ``config.json``.

    ``out``'s ``summary.json`` may hold ``privet audit``'s section (the audit alone, or merged into an
    earlier run). The run keeps it (returned) when it audited ``cfg``: its recorded ``audited_config``,
    or, for a section written before audits recorded it and merged into a run, that run's
    ``config.json`` (which :func:`audit_merge_refusal` checked it against), is ``cfg`` by
    :func:`config_difference`. Otherwise (another configuration, none recorded, or an unreadable
    section) the run must not present it as its own: None is returned, ``out/audit.json`` is renamed
    :data:`STALE_AUDIT` (replacing an older one), and one warning line says so, naming the keys that
    differ. No summary, or one without an audit: None, and nothing is touched.
    """
    out = Path(out)
    summary = _json(out / "summary.json")
    if not isinstance(summary, dict) or "audit" not in summary:
        return None
    audit = summary["audit"]
    readable = isinstance(audit, dict) and set(AuditSection.__required_keys__) <= set(audit)
    recorded = audit.get("audited_config") if readable else None
    if readable and recorded is None and "clients" in summary:
        recorded = _json(out / "config.json")
    differ = config_difference(recorded, cfg) if isinstance(recorded, dict) else None
    if differ == []:
        return cast(AuditSection, audit)  # its required keys checked above
    what = (f"an audit of another configuration (differs in {', '.join(differ)})" if differ
            else "an audit that does not record its configuration" if readable
            else "an audit section this run cannot read")
    kept = ""
    if (out / "audit.json").is_file():
        os.replace(out / "audit.json", out / STALE_AUDIT)
        kept = f"; its audit.json is kept as {out / STALE_AUDIT}"
    log.warning("privet: %s held %s: this run's summary.json, privacy_report.md and report.html leave it out%s",
                out, what, kept)
    return None
