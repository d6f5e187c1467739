"""The server's view of its clients: the budget handshake, their accounts, refusals and eligibility.

:class:`ClientRegistry` asks every node seen for the first time for its declared budget (a
``query.budget`` message, :mod:`protocol.budget_query`) and keeps one :class:`ClientAccount`
per node that answered with a budget the strategy can use; every other node is a
:class:`Refusal`, listed in the summary and report with the reason and never scheduled. It is a
collaborator of :class:`strategies.base.PrivacyAwareFedAvg`, which decides what a declaration
must satisfy (:class:`Admission`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from privacy.accountants import Charge, epsilon_of
from privacy.policy import is_spent
from protocol import keys
from protocol.budget_query import BudgetQuery, handshake_transcript
from protocol.node_loss import is_node_lost
from protocol.replies import BudgetDeclaration
from protocol.roster import Roster
from strategies.validation import DeclaredBudget

log = logging.getLogger("privet.strategy")

#: Timeout of a handshake that only re-asks nodes that did not answer before.
RETRY_HANDSHAKE_SECONDS = 10.0

#: Flower's error codes for replies the SuperLink writes itself when the destination node is
#: gone; such a node is counted as dropped (a handshake: as unanswered).
NODE_GONE_ERRORS = (ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE)


@dataclass
class ClientAccount:
    """The server's view of one client, keyed by its Flower node id."""

    node_id: int
    client_id: str
    epsilon_budget: float
    delta: float
    num_examples: int
    epsilon_spent: float
    epsilon_at_start: float
    server_history: list[Charge] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    dropped_rounds: list[int] = field(default_factory=list)
    rejections: list[tuple[int, str]] = field(default_factory=list)
    exhausted: bool = False
    guarantee_unit: str = "record"
    noise_source: str = "csprng"
    client_evaluation: bool = False
    train_metrics: bool = False

    def declared(self) -> DeclaredBudget:
        """What it declared (its spend updated by its accepted replies)."""
        return DeclaredBudget(self.epsilon_budget, self.delta, self.epsilon_spent)

    def server_epsilon(self, accountant: str) -> float:
        """ε recomputed by the server from the mechanisms of its accepted replies (this run only);
        an independent check on the client's own ledger.
        """
        return epsilon_of(self.server_history, self.delta, accountant) if self.server_history else 0.0


@dataclass(frozen=True)
class Refusal:
    """A node refused at the handshake: who it said it was, and why."""

    client_id: str
    reason: str
    retry: bool = False  #: it did not answer: asked again at later rounds


@dataclass(frozen=True)
class Admission:
    """What a declaration must satisfy to be registered (the strategy's rules).

    Attributes
    ----------
    max_examples : int
        The run's ``max-examples-per-client`` (0: none): an honest client never declares more.
    max_epsilon_ratio : float
        Where clients are weighted by their declared ε (``weights_by_epsilon``), a declaration
        above this many times the median declared ε is refused (0: none).
    weights_by_epsilon : bool
        Whether the strategy weights clients by their declared ε.
    refuse : callable
        The strategy's own rule: why it cannot use a well-formed declaration (None: it can).
    """

    max_examples: int = 0
    max_epsilon_ratio: float = 0.0
    weights_by_epsilon: bool = False
    refuse: Callable[[ClientAccount], str | None] = lambda account: None


def spend_statistics(accounts: Iterable[ClientAccount]) -> dict[str, float | int]:
    """Largest and mean cumulative ε over the registered clients with a finite spend."""
    spent = [a.epsilon_spent for a in accounts if math.isfinite(a.epsilon_spent)]
    return {"epsilon_spent_max": max(spent, default=0.0),
            "epsilon_spent_mean": float(np.mean(spent)) if spent else 0.0,
            "num_registered": len(spent)}


class ClientRegistry:
    """Accounts and refusals of a run's nodes (module docstring)."""

    def __init__(self, admission: Admission, handshake_timeout: float, roster: Roster | None = None) -> None:
        self.admission = admission
        self.handshake_timeout = handshake_timeout
        #: The federation roster: with one, a node is registered only under the client id whose roster key
        #: signed the handshake's fresh challenge (and the node id it was sent to).
        self.roster = roster
        self.accounts: dict[int, ClientAccount] = {}
        #: Nodes refused at the handshake (never scheduled, not asked again): node -> why.
        self.refused: dict[int, Refusal] = {}

    def name(self, node: int) -> str:
        """The client id a node declared (``node-<id>`` before it did)."""
        account = self.accounts.get(node)
        if account is not None:
            return account.client_id
        refusal = self.refused.get(node)
        return refusal.client_id if refusal is not None else f"node-{node}"

    def eligible(self, node_ids: Iterable[int]) -> list[int]:
        """Connected, registered clients whose budget is not spent."""
        return [n for n in node_ids if n in self.accounts and not self.accounts[n].exhausted]

    def refuse(self, node: int, client_id: str, reason: str, retry: bool = False) -> None:
        """List ``node`` as refused (logged once)."""
        if node not in self.refused:
            log.warning("handshake: %s (node %d) refused: %s", client_id, node, reason)
        self.refused[node] = Refusal(client_id, reason, retry)

    def handshake(self, grid: Grid, node_ids: Iterable[int], query: BudgetQuery) -> float:
        """Ask every node not seen before (and every unanswered one again) for its budget; seconds taken.

        A node is refused when it answers with an error (e.g. a malformed node config), declares
        a malformed or invalid budget, one the strategy cannot use, or a ``client-id`` another
        node already holds. A node that does not answer within ``handshake_timeout`` (hung,
        restarting, unreachable) is listed too, but asked again at later rounds with a short
        timeout (``RETRY_HANDSHAKE_SECONDS``), so a hung site costs little and a restarted one
        rejoins.
        """
        started = time.perf_counter()
        node_ids = list(node_ids)
        new = [n for n in node_ids if n not in self.accounts and n not in self.refused]
        retry = [n for n in node_ids if n in self.refused and self.refused[n].retry]
        if not new and not retry:
            return 0.0
        timeout = self.handshake_timeout if new else min(self.handshake_timeout, RETRY_HANDSHAKE_SECONDS)
        challenge = os.urandom(32)
        config = replace(query, challenge=challenge).encode()
        messages = [Message(RecordDict({keys.CONFIG: config}), dst_node_id=n,
                            message_type=f"{MessageType.QUERY}.{keys.QUERY_BUDGET}") for n in new + retry]
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        # the grid gives each message its id when it sends it; a reply the SuperLink writes for an
        # unavailable node comes from the SuperLink, so map replies back by that id
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
        for reply in replies:
            self._register(asked.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id), reply,
                           challenge)
        self._refuse_dominant([self.accounts[n] for n in new + retry if n in self.accounts])
        for node in new + retry:
            if node not in self.accounts and (node not in self.refused or self.refused[node].retry):
                self.refuse(node, f"node-{node}", f"no answer to the budget handshake within {timeout:g}s "
                            "(asked again at later rounds)", retry=True)
        return time.perf_counter() - started

    def _register(self, node: int, reply: Message, challenge: bytes) -> None:
        if reply.has_error():
            if not is_node_lost(reply):  # gone (a node, or a lost Ray actor): counted as unanswered
                self.refuse(node, f"node-{node}", reply.error.reason or f"error code {reply.error.code}")
            return
        try:
            declared = BudgetDeclaration.decode(reply.content)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            self.refuse(node, f"node-{node}", f"malformed budget declaration ({exc})")
            return
        account = ClientAccount(
            node_id=node, client_id=declared.client_id, epsilon_budget=declared.epsilon_budget,
            delta=declared.delta, num_examples=declared.num_examples, epsilon_spent=declared.epsilon_spent,
            epsilon_at_start=declared.epsilon_spent, guarantee_unit=declared.guarantee_unit,
            noise_source=declared.noise_source, client_evaluation=declared.client_evaluation)
        why = self._unbound(node, declared, challenge) or self._why_not(account)
        if why:
            self.refuse(node, account.client_id, why)
            return
        account.exhausted = is_spent(account.epsilon_spent, account.epsilon_budget)
        self.accounts[node] = account
        self.refused.pop(node, None)
        log.info("handshake: client %s (node %d) eps=%g delta=%g spent=%.4f n=%d", account.client_id, node,
                 account.epsilon_budget, account.delta, account.epsilon_spent, account.num_examples)

    def _unbound(self, node: int, declared: BudgetDeclaration, challenge: bytes) -> str | None:
        """Why the declared client id is not this node's by the roster (None: it is, or there is no roster)."""
        if self.roster is None:
            return None
        why = self.roster.verify(declared.client_id, declared.signature,
                                 handshake_transcript(challenge, declared.client_id, node))
        return f"client-id {declared.client_id!r} is not bound to this node's key: {why}" if why else None

    def _why_not(self, account: ClientAccount) -> str | None:
        if not (account.epsilon_budget > 0 and 0 < account.delta < 1
                and math.isfinite(account.epsilon_spent) and account.epsilon_spent >= 0):
            return (f"invalid budget declaration (eps={account.epsilon_budget}, delta={account.delta}, "
                    f"spent={account.epsilon_spent})")
        holder = next((a for a in self.accounts.values() if a.client_id == account.client_id), None)
        if holder is not None:
            return f"client-id {account.client_id!r} is already held by node {holder.node_id}"
        cap = self.admission.max_examples
        if cap and account.num_examples > cap:
            return (f"declares {account.num_examples} examples, more than the run's max-examples-per-client "
                    f"({cap}) that an honest client trains on")
        return self.admission.refuse(account)

    def _refuse_dominant(self, batch: list[ClientAccount]) -> None:
        """Refuse, from a handshake batch, each declared ε above ``max_epsilon_ratio`` × the median
        declared ε of every registered client (ε-weighted strategies only).
        """
        ratio = self.admission.max_epsilon_ratio
        if not (self.admission.weights_by_epsilon and ratio > 0 and batch):
            return
        median = float(np.median([a.epsilon_budget for a in self.accounts.values()]))
        for account in batch:
            if account.epsilon_budget > ratio * median:
                del self.accounts[account.node_id]
                self.refuse(account.node_id, account.client_id,
                            f"declared eps={account.epsilon_budget:g} is more than max-epsilon-ratio={ratio:g} "
                            f"times the median declared eps ({median:g}); the strategy weights clients by eps, "
                            "so this site would take nearly all of a round's weight (the operator may raise "
                            "max-epsilon-ratio)")

    def wait_for_nodes(self, grid: Grid, minimum: int, timeout: float) -> list[int]:
        """The connected nodes, once ``minimum`` are (or after ``timeout`` seconds, with those there are)."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= minimum or time.monotonic() > deadline:
                if len(nodes) < minimum:
                    log.warning("only %d of %d nodes connected after %.0fs; going on with them", len(nodes),
                                minimum, timeout)
                return nodes
            log.info("waiting for nodes: %d connected, %d required", len(nodes), minimum)
            time.sleep(1.0)
