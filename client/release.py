"""The privacy steps of one client round, in one place: what the ClientApp and ``privet audit`` both run.

::

    refuse non-private training on a finite budget → refuse σ with nothing to calibrate from
    → plan → the site's floors → refuse what would exceed → run → settle → prepare the reply
    → refuse if stale → charge

:func:`release_once` is that sequence. :func:`client.round._round` runs it for every train
message (under the ledger's lock; it stores the ledger and replies), and ``privet audit``
(:mod:`privet.audit_games`) runs it through :func:`client_release` for each canary client's
round, so the audit measures the very release the ClientApp makes: the same plan against the
ledger (privet's calibration), the same budget checks, the same run, settlement and charge.
The guarantee it keeps: **nothing is released that the ledger has not charged, and nothing is
charged that is not released** — every refusal happens before the upload leaves this function,
a refusal before the run touches no data (``work`` is not even built), and a release that turns
stale, or whose charge fails, is discarded uncharged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from privacy.accountants import epsilon_of
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger
from privacy.mechanisms import LocalWork, Mechanism, Release, Upload
from privacy.randomness import NoiseSource
from protocol import keys
from protocol.errors import ERROR_BUDGET, ERROR_CONFIG, ERROR_REFUSED, ERROR_STALE
from protocol.site import SiteFloors

__all__ = ["Refused", "Released", "client_release", "release_once"]

T = TypeVar("T")


@dataclass(frozen=True)
class Refused:
    """A round that released nothing, and was charged nothing.

    Attributes
    ----------
    code : int
        The error reply's code (:mod:`protocol.errors`): budget, site floor, stale or config.
    reason : str
        The reply's one line (it names the client and, for a budget refusal, ``keys.BUDGET_EXHAUSTED``).
    """

    code: int
    reason: str


@dataclass(frozen=True)
class Released(Generic[T]):
    """A charged release.

    Attributes
    ----------
    upload : Upload
        What the mechanism released (the only thing that may leave the client).
    release : Release
        The release as settled and charged.
    prepared : T
        ``prepare(upload)`` (the round's reply arrays; the upload itself where there is no ``prepare``).
    spent_before : float
        The ledger's ε spent before this charge.
    """

    upload: Upload
    release: Release
    prepared: T
    spent_before: float


def release_once(mechanism: Mechanism, ledger: PrivacyLedger, *, client_id: str, run_id: int, server_round: int,
                 work: Callable[[], LocalWork], noise: Callable[[], NoiseSource], prepare: Callable[[Upload], T],
                 target_epsilon: float = 0.0, floors: SiteFloors | None = None,
                 stale: Callable[[], str | None] | None = None) -> Released[T] | Refused:
    """The privacy steps of one client round (module docstring); the ledger is charged in memory only.

    Parameters
    ----------
    mechanism : Mechanism
        The round's mechanism (:meth:`protocol.train_config.TrainConfig.mechanism`).
    ledger : PrivacyLedger
        The client's ledger (the caller loads and stores it; charged here on release).
    client_id : str
        Named in the refusals.
    run_id, server_round : int
        The run the release is charged to, and the round it is recorded under.
    work, noise : callable
        The round's local work and the client's DP noise source, built only once every check passed.
    prepare : callable
        Turns the upload into what the reply carries, before the charge (a ``ValueError`` from it
        discards the release uncharged).
    target_epsilon : float
        The request's target ε (where σ is calibrated from it rather than from the budget).
    floors : SiteFloors, optional
        The site's own floors (None: none).
    stale : callable, optional
        Why the request is no longer worth answering (None: it is), asked after the run, just before
        the charge.

    Returns
    -------
    Released or Refused

    Raises
    ------
    ValueError
        From the work, the mechanism's run or ``prepare``: a request the client cannot serve (nothing
        is charged; the round replies with a config error).
    """
    if not mechanism.private and math.isfinite(ledger.epsilon_budget):
        return Refused(ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {client_id} has a finite budget "
                                     f"(eps={ledger.epsilon_budget:g}) and refuses non-private training")
    if mechanism.private and mechanism.noise_multiplier <= 0 and math.isinf(ledger.epsilon_budget) \
            and target_epsilon <= 0:
        return Refused(ERROR_CONFIG, f"config-error: client {client_id} has no finite budget to calibrate noise "
                                     "from: set 'noise-multiplier' > 0 or give it an 'epsilon'")
    try:
        release = mechanism.plan(ledger, run_id)
    except (PrivacyBudgetExhausted, ValueError) as exc:  # ValueError: no σ reaches the remainder
        return Refused(ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {client_id}: {exc}")
    floor = floors.refusal(
        charged_sigma=mechanism.charged(release.noise_multiplier),
        release_epsilon=epsilon_of(list(release.charges), ledger.delta, ledger.conversion(mechanism.ledger_mode))
        if release.charges else 0.0,
        releases_in_run=ledger.releases_in_run(run_id)) if floors is not None and mechanism.private else None
    if floor:  # the site's own say over how its budget is spent, before any data is touched
        return Refused(ERROR_REFUSED, f"{keys.SITE_FLOOR}: client {client_id}: {floor}")
    if mechanism.private and ledger.would_exceed_release(release.charges, run_id, mechanism.ledger_mode):
        limit = ledger.limit(run_id)
        what = f"its budget {ledger.epsilon_budget:g}" if limit == ledger.epsilon_budget else \
            f"this run's cap eps={limit:g} (run-epsilon; budget {ledger.epsilon_budget:g})"
        return Refused(ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {client_id} has spent "
                                     f"eps={ledger.spent():.4f}; round {server_round} would exceed {what}")
    upload = mechanism.run(work(), release, noise())
    release = mechanism.settle(release, upload)
    prepared = prepare(upload)
    why = stale() if stale is not None else None
    if why:  # stopped or stalled mid-training: the release is discarded, never charged or sent
        return Refused(ERROR_STALE, why)
    before = ledger.spent()
    try:
        ledger.record_release(release.charges, server_round=server_round, run_id=run_id, mode=mechanism.ledger_mode)
    except PrivacyBudgetExhausted as exc:  # the charge exceeded the plan: discard the release
        return Refused(ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {client_id}: {exc}")
    return Released(upload, release, prepared, before)


def _as_is(upload: Upload) -> Upload:
    return upload


def client_release(mechanism: Mechanism, ledger: PrivacyLedger, *, run_id: int, server_round: int,
                   work: LocalWork, noise: NoiseSource) -> tuple[Upload, Release] | None:
    """:func:`release_once` for an audit's canary client (no site floors, never stale); None: refused.

    Returns the upload and the release as charged. A canary client has no id of its own: its
    refusals are not reported, only that it released nothing.
    """
    done = release_once(mechanism, ledger, client_id="canary", run_id=run_id, server_round=server_round,
                        work=lambda: work, noise=lambda: noise, prepare=_as_is)
    if isinstance(done, Refused):
        return None
    return done.upload, done.release
