"""The privacy steps of one client round, in one place: plan, refuse what would exceed, run, settle, charge.

:func:`client_release` is what :func:`client.round._round` and ``privet audit``
(:mod:`privet.audit_games`) run, so that the audit measures the release the ClientApp makes.
"""

from __future__ import annotations

from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger
from privacy.mechanisms import LocalWork, Mechanism, Release, Upload
from privacy.randomness import NoiseSource

__all__ = ["client_release"]


def client_release(mechanism: Mechanism, ledger: PrivacyLedger, *, run_id: int, server_round: int,
                   work: LocalWork, noise: NoiseSource) -> tuple[Upload, Release] | None:
    """The privacy steps of one client round, in :func:`client.round._round`'s order; None: refused.

    Returns the upload and the release as charged.

    plan against the ledger (refused on exhaustion or no σ) → refuse a release the ledger could
    not charge → run → settle → charge (refused, the upload discarded, if the charge fails).
    """
    try:
        release = mechanism.plan(ledger, run_id)
    except (PrivacyBudgetExhausted, ValueError):
        return None
    if mechanism.private and ledger.would_exceed_release(release.charges, run_id, mechanism.ledger_mode):
        return None
    upload = mechanism.run(work, release, noise)
    release = mechanism.settle(release, upload)
    try:
        ledger.record_release(release.charges, server_round=server_round, run_id=run_id, mode=mechanism.ledger_mode)
    except PrivacyBudgetExhausted:
        return None
    return upload, release
