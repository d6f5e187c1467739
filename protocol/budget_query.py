"""The budget query (the handshake): what the server asks a client before any round, typed.

The server sends ``BudgetQuery(...).encode()`` as the query's config; the client decodes it
once. A strategy adds what a client must know about the run to answer (its
``budget_query``): a budget reference (PFA's Minimum/Maximum, simulation only) or the task
(DP-FedC's clustering, whose data is the clustering set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord

from privacy.accountants import ACCOUNTANTS, DEFAULT_ACCOUNTANT
from protocol import keys
from protocol.config import one_of
from protocol.roster import transcript


@dataclass(frozen=True)
class BudgetQuery:
    """The handshake's config: the accountant a client's ledger reports in, and run facts.

    Attributes
    ----------
    accountant : str
        ``"rdp"`` or ``"prv"``: the ledger's accountant for a new ledger.
    budget_reference : str
        ``"minimum"``/``"maximum"`` (simulation only, ``keys.BUDGET_REFERENCE``), else "".
    task : str
        ``"model"`` or ``"clustering"`` (DP-FedC): which data the client counts.
    challenge : bytes
        A fresh random string a client with a signing key signs with its client id and node id
        (:func:`handshake_transcript`), binding the name it declares to its roster key.
    """

    accountant: str = DEFAULT_ACCOUNTANT
    budget_reference: str = ""
    task: str = keys.TASK_MODEL
    challenge: bytes = b""

    def __post_init__(self) -> None:
        one_of(keys.ACCOUNTANT, self.accountant, tuple(ACCOUNTANTS))
        one_of(keys.BUDGET_REFERENCE, self.budget_reference, ("", *keys.BUDGET_REFERENCES))
        one_of(keys.TASK, self.task, (keys.TASK_MODEL, keys.TASK_CLUSTERING))

    def encode(self) -> ConfigRecord:
        """The query's ``ConfigRecord`` (run facts only when set)."""
        record: dict[str, Any] = {keys.ACCOUNTANT: self.accountant}
        if self.budget_reference:
            record[keys.BUDGET_REFERENCE] = self.budget_reference
        if self.task != keys.TASK_MODEL:
            record[keys.TASK] = self.task
        if self.challenge:
            record[keys.CHALLENGE] = self.challenge
        return ConfigRecord(record)

    @classmethod
    def decode(cls, record: Mapping[str, Any]) -> BudgetQuery:
        """Read a budget query; ``ValueError`` naming the key if a value is malformed."""
        accountant = record.get(keys.ACCOUNTANT, DEFAULT_ACCOUNTANT)
        reference = record.get(keys.BUDGET_REFERENCE, "")
        task = record.get(keys.TASK, keys.TASK_MODEL)
        if not all(isinstance(v, str) for v in (accountant, reference, task)):
            raise ValueError(f"'{keys.ACCOUNTANT}', '{keys.BUDGET_REFERENCE}' and '{keys.TASK}' must be text; found "
                             f"{accountant!r}, {reference!r}, {task!r}")
        challenge = record.get(keys.CHALLENGE, b"")
        if not isinstance(challenge, bytes) or len(challenge) > 64:
            raise ValueError(f"'{keys.CHALLENGE}' must be at most 64 bytes; found {challenge!r}")
        return cls(str(accountant), str(reference), str(task), challenge)


def handshake_transcript(challenge: bytes, client_id: str, node_id: int) -> bytes:
    """What a site signs at the handshake: the server's challenge, its client id, the node id addressed."""
    return transcript("handshake", challenge, client_id, node_id)
