"""The server's book of train replies: validation, verification, booking and the round's result.

:class:`ReplyBook` reads every reply of a round before anything is aggregated. A reply is
**accepted** only if it is well formed (:mod:`strategies.validation`: structure, arrays, privacy
figures against the handshake), its mechanism is the one the server asked for (σ it fixed, q and
steps it derives from public figures: :class:`privacy.mechanisms.ExpectedRelease`), and the
cumulative ε it claims is at least what the verified mechanisms of this run imply under the
server's own accountant. Anything else is **rejected** with a logged reason (the round goes on
with the others); a sampled client that sent nothing is **dropped**. Per client the book keeps
the ε it reports, the server's recomputation, rounds joined, drops and rejections; per round one
:class:`strategies.round_result.RoundResult`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from flwr.app import Message, MetricRecord

from privacy.accountants import Charge, epsilon_of, exceeds_budget
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.mechanisms import ExpectedRelease
from privacy.policy import is_spent
from protocol import keys
from protocol.node_loss import is_node_lost
from protocol.replies import TrainReport
from strategies.clients import ClientAccount, ClientRegistry, spend_statistics
from strategies.round_result import RoundResult
from strategies.validation import ArraySpec, validate_train_reply

log = logging.getLogger("privet.strategy")

#: Relative slack when the claimed cumulative ε is compared with the server's recomputation (both
#: use the same accountant; the slack absorbs float round-off only). Whether an ε is within its
#: budget is one decision everywhere: :func:`privacy.accountants.exceeds_budget`.
CLAIM_RTOL = 1e-6


@dataclass(frozen=True)
class AcceptedReply:
    """A validated train reply, unpacked."""

    node_id: int
    client_id: str
    arrays: list[np.ndarray]
    metrics: dict[str, float]
    meta: dict[str, str]

    @property
    def num_examples(self) -> int:
        """The example count it claims (checked against the handshake)."""
        return int(self.metrics[keys.NUM_EXAMPLES])


class Verifier(Protocol):
    """What the strategy tells the book about the reply it expects from one client."""

    def expected_specs(self, server_round: int, account: ClientAccount) -> list[ArraySpec]:
        """The arrays the upload must hold."""

    def expected_release(self, server_round: int, account: ClientAccount) -> ExpectedRelease:
        """The mechanism figures the server can derive."""

    def server_steps(self, server_round: int, account: ClientAccount, metrics: dict[str, float]) -> list[Charge]:
        """What the verified reply adds to the client's server-side history."""

    @property
    def charges_run_once(self) -> bool:
        """Its clients pre-charge the whole run (GDPFed): a spent budget then does not end their run."""


class ReplyBook:
    """The rounds' replies and results (module docstring).

    Parameters
    ----------
    registry : ClientRegistry
        The run's accounts.
    accountant : str
        The server's accountant for the recomputation.
    min_accepted : int
        A round with fewer accepted inputs fails (``min-accepted-clients``).
    """

    def __init__(self, registry: ClientRegistry, accountant: str, min_accepted: int) -> None:
        self.registry = registry
        self.accountant = accountant
        self.min_accepted = min_accepted
        #: One :class:`RoundResult` per round that reached aggregation, in order.
        self.round_log: list[RoundResult] = []
        #: Rounds that produced no new global model: round -> why.
        self.failed_rounds: dict[int, str] = {}
        self._sampled: dict[int, list[int]] = {}
        self._bytes_down: dict[int, int] = {}
        self._handshake_seconds: dict[int, float] = {}

    # ------------------------------------------------------------------ a round
    def open_round(self, server_round: int, sampled: list[int], handshake_seconds: float) -> None:
        """Who was sampled in ``server_round`` (drops are counted against it)."""
        self._sampled[server_round] = list(sampled)
        self._handshake_seconds[server_round] = handshake_seconds
        self._bytes_down[server_round] = 0

    def sampled(self, server_round: int) -> list[int]:
        """The nodes sampled in ``server_round``."""
        return list(self._sampled.get(server_round, []))

    def add_bytes_down(self, server_round: int, count: int) -> None:
        """Bytes of model (or basis) sent to the sampled clients in ``server_round``."""
        self._bytes_down[server_round] = self._bytes_down.get(server_round, 0) + int(count)

    def result(self, server_round: int) -> RoundResult | None:
        """This round's result, once its replies were read (None before, or for a round that never
        reached aggregation).
        """
        return next((r for r in reversed(self.round_log) if r.round == server_round), None)

    def fail(self, server_round: int, why: str) -> MetricRecord:
        """The round produced no new global model: recorded, logged, and its counts returned."""
        self.failed_rounds[server_round] = why
        entry = self.result(server_round)
        if entry is not None:
            entry.fail(why)
        log.error("round %d failed: %s", server_round, why)
        return MetricRecord({keys.NUM_ACCEPTED: len(entry.accepted) if entry else 0,
                             keys.NUM_REJECTED: len(entry.rejected) if entry else 0,
                             keys.NUM_DROPPED: len(entry.dropped) if entry else 0})

    def too_few(self, server_round: int, accepted: int) -> MetricRecord | None:
        """Fail the round if fewer than ``min_accepted`` inputs were accepted (None: enough)."""
        if accepted >= self.min_accepted:
            return None
        return self.fail(server_round, f"{accepted} accepted replies, fewer than the minimum of {self.min_accepted} "
                                       "(min-accepted-clients); the global model is unchanged")

    # ------------------------------------------------------------------ replies
    def accept(self, server_round: int, replies: Iterable[Message], verifier: Verifier,
               invalid: dict[int, str] | None = None) -> list[AcceptedReply]:
        """Validate every reply; book errors, rejections, drops and privacy spending.

        ``invalid``: nodes whose reply the caller already found unusable, and why.
        """
        invalid = invalid or {}
        accounts = self.registry.accounts
        sampled = set(self._sampled.get(server_round, []))
        replied: set[int] = set()
        accepted: list[AcceptedReply] = []
        rejected: list[dict[str, str]] = []
        for reply in replies:
            if is_node_lost(reply):
                continue  # written for a vanished node or a lost Ray actor: counted as dropped below
            node = reply.metadata.src_node_id
            replied.add(node)
            account = accounts.get(node)
            if account is None:
                rejected.append({"client": self.registry.name(node),
                                 "reason": "reply from a node that never did the handshake"})
                continue
            reason, taken = self._read(server_round, account, reply, verifier, invalid.get(node))
            if reason is not None:
                account.rejections.append((server_round, reason))
                rejected.append({"client": account.client_id, "reason": reason})
                if reply.has_error():
                    log.warning("round %d: client %s replied with an error: %s", server_round, account.client_id,
                                reason)
                else:
                    log.warning("round %d: rejected reply of client %s: %s", server_round, account.client_id, reason)
                continue
            assert taken is not None
            accepted.append(taken)
        dropped = sorted(sampled - replied)
        for node in dropped:
            accounts[node].dropped_rounds.append(server_round)
            log.warning("round %d: client %s dropped out (no reply)", server_round, accounts[node].client_id)
        self.round_log.append(RoundResult(
            round=server_round,
            sampled=[accounts[n].client_id for n in sorted(sampled)],
            accepted=[r.client_id for r in accepted],
            rejected=rejected,
            dropped=[accounts[n].client_id for n in dropped],
            handshake_seconds=self._handshake_seconds.get(server_round, 0.0),
            bytes_down=self._bytes_down.get(server_round, 0),
            bytes_up=int(sum(a.nbytes for r in accepted for a in r.arrays)),
            # O(sampled) per round: the sampled clients' spend, and statistics over everyone
            epsilon_spent={accounts[n].client_id: accounts[n].epsilon_spent for n in sorted(sampled) if n in accounts},
            spend=spend_statistics(accounts.values()),
        ))
        return accepted

    def _read(self, server_round: int, account: ClientAccount, reply: Message, verifier: Verifier,
              invalid: str | None) -> tuple[str | None, AcceptedReply | None]:
        """(why the reply is rejected, None) or (None, the accepted reply, booked)."""
        if reply.has_error():
            refusal = reply.error.reason or f"error code {reply.error.code}"
            if refusal.startswith(keys.BUDGET_EXHAUSTED):
                account.exhausted = True
            return refusal, None
        reason = invalid or validate_train_reply(reply.content, verifier.expected_specs(server_round, account),
                                                 account.declared(), verifier.expected_release(server_round, account))
        if reason:
            return reason, None
        report = TrainReport.decode(reply.content.metric_records[keys.METRICS])
        assert isinstance(report, TrainReport)  # validated above
        metrics = report.as_dict()
        try:
            steps = verifier.server_steps(server_round, account, metrics)
        except PrivacyBudgetExhausted as exc:  # a release its mechanism does not allow (GDPFed beyond T)
            return f"a release its mechanism does not allow: {exc}", None
        reason = self._check_claimed_epsilon(account, metrics, steps)
        if reason:
            return reason, None
        meta = dict(reply.content[keys.META]) if keys.META in reply.content.config_records else {}
        account.epsilon_spent = metrics[keys.EPSILON_SPENT]
        account.rounds.append(server_round)
        account.server_history.extend(steps)
        account.guarantee_unit = str(meta.get(keys.GUARANTEE_UNIT, account.guarantee_unit))
        account.train_metrics = str(meta.get(keys.TRAIN_METRICS, "off")) == "on"
        if is_spent(account.epsilon_spent, account.epsilon_budget) and not verifier.charges_run_once:
            account.exhausted = True
        return None, AcceptedReply(account.node_id, account.client_id,
                                   reply.content.array_records[keys.ARRAYS].to_numpy_ndarrays(), metrics,
                                   {k: str(v) for k, v in meta.items()})

    def _check_claimed_epsilon(self, account: ClientAccount, metrics: dict[str, float],
                               steps: list[Charge]) -> str | None:
        """The claimed cumulative ε against the server's own recomputation of this run.

        The verified mechanisms of this run alone imply ε_run (the server's accountant); a client's
        cumulative ε can only be larger (earlier runs, rounds whose reply was lost), never smaller,
        and never above its budget.
        """
        try:
            implied = epsilon_of([*account.server_history, *steps], account.delta, self.accountant)
        except ValueError as exc:
            return f"its mechanism cannot be accounted ({exc})"
        claimed = metrics[keys.EPSILON_SPENT]
        if claimed < implied * (1.0 - CLAIM_RTOL) - 1e-12:
            return (f"claimed spent eps={claimed:.6g} is below the {implied:.6g} that its reported mechanisms "
                    f"(sigma, q, steps) imply under the server's {self.accountant} accountant")
        if exceeds_budget(implied / (1.0 + CLAIM_RTOL), account.epsilon_budget):
            return f"its reported mechanisms imply eps={implied:.6g}, above its budget {account.epsilon_budget:g}"
        return None
