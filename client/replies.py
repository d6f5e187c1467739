"""The parts every privet train reply shares: refusals, staleness, metadata, the train report.

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
from protocol.replies import TrainReport

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


def train_report(ledger: PrivacyLedger, before: float, *, num_examples: int, noise_multiplier: float,
                 sample_rate: float, local_steps: int, clip: float,
                 extra: dict[str, float] | None = None) -> TrainReport:
    """The round's covered figures, as a :class:`~protocol.replies.TrainReport`.

    The ledger's budget, δ and ε spent (and this round's ε, spent minus ``before``), with the
    mechanism run; ``extra``: uncovered metrics the operator opted into (``report-train-metrics``).
    """
    spent = ledger.spent()
    return TrainReport(num_examples=int(num_examples), epsilon_budget=float(ledger.epsilon_budget),
                       delta=float(ledger.delta), epsilon_spent=float(spent), noise_multiplier=float(noise_multiplier),
                       sample_rate=float(sample_rate), local_steps=int(local_steps),
                       epsilon_round=float(spent - before) if math.isfinite(spent) else math.inf, clip=float(clip),
                       extra=dict(extra or {}))
