"""Where a client's privacy ledger lives between messages, rounds, runs and restarts.

Two stores, one truth: the node's ``context.state`` (survives rounds of one run, also in
deployment where each message runs in a fresh process) and, when the operator sets
``ledger-path`` in the node config, a JSON file written atomically (survives restarts and
later runs: a budget is for the client's data, not for one run). When both exist the
file wins, since it is the durable record.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context

from client.profile import ClientProfile
from privacy.ledger import PrivacyLedger

STATE_KEY = "privet.ledger"
_JSON = "json"


def load_ledger(profile: ClientProfile, context: Context, accountant: str) -> PrivacyLedger:
    """The client's ledger: the durable file if configured, else the node state, else new."""
    if profile.ledger_path:
        return PrivacyLedger.load_or_create(
            profile.ledger_path,
            epsilon_budget=profile.epsilon_budget,
            delta=profile.delta,
            accountant=accountant,
        )
    if STATE_KEY in context.state:
        record = context.state[STATE_KEY]
        assert isinstance(record, ConfigRecord)  # only this module writes the key
        return PrivacyLedger.from_json(str(record[_JSON]))
    return PrivacyLedger.load_or_create(
        None, epsilon_budget=profile.epsilon_budget, delta=profile.delta, accountant=accountant
    )


def store_ledger(ledger: PrivacyLedger, profile: ClientProfile, context: Context) -> None:
    """Persist the ledger in the node state and, if configured, atomically on disk."""
    context.state[STATE_KEY] = ConfigRecord({_JSON: ledger.to_json()})
    if profile.ledger_path:
        ledger.save(profile.ledger_path)
