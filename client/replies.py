"""The parts every privet train reply shares: refusals, staleness, metadata, privacy metrics.

A handler never raises: it answers :func:`error_reply` with a code from
:mod:`protocol.errors` and a reason that starts with a :mod:`protocol.keys` keyword.
"""

from __future__ import annotations

import logging
import math
import time

from flwr.app import ConfigRecord, Error, Message

from client.profile import ClientProfile
from privacy.ledger import PrivacyLedger
from protocol import keys

log = logging.getLogger("privet.client")


def error_reply(msg: Message, code: int, reason: str) -> Message:
    """The refusal of ``msg``: an error reply (logged), never an exception."""
    log.warning("refusing %s: %s", msg.metadata.message_type, reason)
    return Message(Error(code=code, reason=reason), reply_to=msg)


def stale_reason(msg: Message) -> str | None:
    """Why a message must not be acted on: it outlived its time-to-live.

    The server sets a train message's TTL to its round timeout, so a message past it
    belongs to a round that is over (the node was stopped, its network stalled, or the run
    ended): training it would spend budget on a reply nobody reads. Checked before
    training and again just before charging the ledger (a process stopped mid-training).
    Assumes the node's clock is within seconds of the SuperLink's.
    """
    age = time.time() - float(msg.metadata.created_at)
    if age <= float(msg.metadata.ttl):
        return None
    return (f"{keys.STALE_MESSAGE}: message created {age:.0f}s ago, past its time-to-live of "
            f"{float(msg.metadata.ttl):g}s; the round is over, nothing trained or charged")


def reply_meta(profile: ClientProfile, **extra: str) -> ConfigRecord:
    """The reply's metadata record: client id, budget and noise sources, and ``extra``."""
    return ConfigRecord({keys.CLIENT_ID: profile.client_id, keys.BUDGET_SOURCE: profile.budget_source,
                         keys.NOISE_SOURCE: profile.noise_source, **extra})


def privacy_metrics(ledger: PrivacyLedger, before: float) -> dict[str, float]:
    """Budget, ε spent, ε of this round (spent minus ``before``) and δ, as reply metrics."""
    spent = ledger.spent()
    return {
        keys.EPSILON_BUDGET: float(ledger.epsilon_budget),
        keys.EPSILON_SPENT: float(spent),
        keys.EPSILON_ROUND: float(spent - before) if math.isfinite(spent) else math.inf,
        keys.DELTA: float(ledger.delta),
    }
