"""The budget query (the handshake): what the server asks a client before any round, typed.

The server sends ``BudgetQuery(...).encode()`` as the query's config; the client decodes it
once. A strategy adds what a client must know about the run to answer (its
``handshake_config``): a budget reference (PFA's Minimum/Maximum, simulation only) or
DP-FedC's cluster count, which tells the client it is a clustering run with its own data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from flwr.app import ConfigRecord

from privacy.accountants import ACCOUNTANTS, DEFAULT_ACCOUNTANT
from protocol import keys
from protocol.config import one_of


@dataclass(frozen=True)
class BudgetQuery:
    """The handshake's config: the accountant a client's ledger reports in, and run facts.

    Attributes
    ----------
    accountant : str
        ``"rdp"`` or ``"prv"``: the ledger's accountant for a new ledger.
    budget_reference : str
        ``"minimum"``/``"maximum"`` (simulation only, ``keys.BUDGET_REFERENCE``), else "".
    dpfedc_k : int
        DP-FedC's cluster count K (0: not a clustering run).
    """

    accountant: str = DEFAULT_ACCOUNTANT
    budget_reference: str = ""
    dpfedc_k: int = 0

    def __post_init__(self) -> None:
        one_of(keys.ACCOUNTANT, self.accountant, tuple(ACCOUNTANTS))
        one_of(keys.BUDGET_REFERENCE, self.budget_reference, ("", *keys.BUDGET_REFERENCES))
        if isinstance(self.dpfedc_k, bool) or not isinstance(self.dpfedc_k, int) or self.dpfedc_k < 0:
            raise ValueError(f"'{keys.DPFEDC_K}' must be an integer >= 0; found {self.dpfedc_k!r}")

    @property
    def clustering(self) -> bool:
        """A DP-FedC run: the client answers for its clustering data set."""
        return self.dpfedc_k > 0

    def encode(self) -> ConfigRecord:
        """The query's ``ConfigRecord`` (run facts only when set)."""
        record: dict[str, Any] = {keys.ACCOUNTANT: self.accountant}
        if self.budget_reference:
            record[keys.BUDGET_REFERENCE] = self.budget_reference
        if self.dpfedc_k:
            record[keys.DPFEDC_K] = self.dpfedc_k
        return ConfigRecord(record)

    @classmethod
    def decode(cls, record: Mapping[str, Any]) -> BudgetQuery:
        """Read a budget query; ``ValueError`` naming the key if a value is malformed."""
        accountant = record.get(keys.ACCOUNTANT, DEFAULT_ACCOUNTANT)
        reference = record.get(keys.BUDGET_REFERENCE, "")
        k = record.get(keys.DPFEDC_K, 0)
        if not isinstance(accountant, str) or not isinstance(reference, str):
            raise ValueError(f"'{keys.ACCOUNTANT}' and '{keys.BUDGET_REFERENCE}' must be text; found "
                             f"{accountant!r}, {reference!r}")
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        return cls(accountant, reference, k)
