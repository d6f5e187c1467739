"""The strategy's collaborators on their own, with fake replies: the client registry and the reply book.

(Flower tests its strategies with mocked messages; the end-to-end runs live in tests/privet.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from privacy.accountants import Step, epsilon_of
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.mechanisms import ExpectedRelease
from protocol import keys
from protocol.budget_query import BudgetQuery, handshake_transcript
from protocol.roster import Roster, SigningKey, generate
from strategies.clients import Admission, ClientAccount, ClientRegistry
from strategies.reply_book import ReplyBook
from strategies.validation import ArraySpec
from tests.fakes import BudgetGrid, train_reply_content

SPECS = [ArraySpec("w", (3,), np.dtype(np.float32))]
ARRAYS = [np.zeros(3, np.float32)]


# ------------------------------------------------------------------ client registry
def _registry(**admission: Any) -> ClientRegistry:
    return ClientRegistry(Admission(**admission), handshake_timeout=5.0)


def test_the_registry_registers_declarations_and_refuses_what_it_cannot_use():
    grid = BudgetGrid({1: 2.0, 2: 5.0, 3: 9.0}, num_examples={3: 5000})
    registry = _registry(max_examples=1000, refuse=lambda a: "too large" if a.epsilon_budget > 4.5 else None)
    registry.handshake(grid, [1, 2, 3], BudgetQuery())
    assert set(registry.accounts) == {1}
    assert "max-examples-per-client" in registry.refused[3].reason and registry.refused[2].reason == "too large"
    assert registry.eligible([1, 2, 3]) == [1]
    registry.accounts[1].exhausted = True
    assert registry.eligible([1, 2, 3]) == []


def test_a_second_node_with_a_taken_client_id_is_refused():
    class Twins(BudgetGrid):
        def send_and_receive(self, messages, *, timeout=None):
            replies = super().send_and_receive(messages)
            for r in replies:
                r.content[keys.META] = ConfigRecord({keys.CLIENT_ID: "site-0"})
            return replies

    registry = _registry()
    registry.handshake(Twins({1: 2.0, 2: 2.0}), [1, 2], BudgetQuery())
    assert len(registry.accounts) == 1 and "already held" in next(iter(registry.refused.values())).reason


def test_with_a_roster_only_a_signature_over_the_fresh_challenge_binds_the_name(tmp_path):
    roster_path = generate(["site-0"], tmp_path)
    key = SigningKey.load(tmp_path / "keys" / "site-0.pem")
    challenges: list[bytes] = []

    class Signing(BudgetGrid):
        def __init__(self, signer: dict[int, SigningKey | None]) -> None:
            super().__init__({n: 2.0 for n in signer})
            self.signer = signer

        def send_and_receive(self, messages, *, timeout=None):
            replies = super().send_and_receive(messages)
            for m, r in zip(messages, replies, strict=True):
                challenge = BudgetQuery.decode(m.content[keys.CONFIG]).challenge
                challenges.append(challenge)
                node = m.metadata.dst_node_id
                k = self.signer[node]
                sig = k.sign(handshake_transcript(challenge, "site-0", node)) if k else b"not a signature"
                r.content[keys.META] = ConfigRecord({keys.CLIENT_ID: "site-0", keys.SIGNATURE: sig})
            return replies

    registry = ClientRegistry(Admission(), 5.0, Roster.load(roster_path))
    registry.handshake(Signing({1: None, 2: key}), [1, 2], BudgetQuery())
    assert set(registry.accounts) == {2} and "not bound to this node's key" in registry.refused[1].reason
    assert len(set(challenges)) == 1 and len(challenges[0]) == 32  # one fresh challenge per handshake
    # a signature for another node id does not carry over (a reply cannot be replayed by another node)
    assert Roster.load(roster_path).verify("site-0", key.sign(handshake_transcript(challenges[0], "site-0", 2)),
                                           handshake_transcript(challenges[0], "site-0", 1)) is not None


def test_a_silent_node_is_listed_and_asked_again_with_a_short_timeout():
    class Silent(BudgetGrid):
        def send_and_receive(self, messages, *, timeout=None):
            self.timeout = timeout
            return []

    grid, registry = Silent({1: 2.0}), _registry()
    registry.handshake(grid, [1], BudgetQuery())
    assert registry.refused[1].retry and grid.timeout == 5.0
    registry.handshake(grid, [1], BudgetQuery())
    assert grid.timeout == min(5.0, 10.0)


# ------------------------------------------------------------------ reply book
class Verifier:
    """What a strategy tells the book: update mode at σ = 1000 (fake replies' figures), or a refusal."""

    charges_run_once = False

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse

    def expected_specs(self, server_round: int, account: ClientAccount) -> list[ArraySpec]:
        return SPECS

    def expected_release(self, server_round: int, account: ClientAccount) -> ExpectedRelease:
        return ExpectedRelease(100, 1000.0, 1.0, 1)

    def server_steps(self, server_round: int, account: ClientAccount, metrics: dict[str, float]) -> list[Step]:
        if self.refuse:
            raise PrivacyBudgetExhausted("beyond the T it paid for")
        return [(1000.0, 1.0, 1)]


def _book(nodes: list[int]) -> ReplyBook:
    registry = _registry()
    registry.handshake(BudgetGrid({n: 10.0 for n in nodes}), nodes, BudgetQuery())
    book = ReplyBook(registry, "rdp", min_accepted=2)
    book.open_round(1, nodes, 0.5)
    return book


def _reply(node: int, **metrics: Any) -> Message:
    request = Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
    implied = epsilon_of([(1000.0, 1.0, 1)], 1e-5, "rdp")
    content = train_reply_content(ARRAYS, client_id=str(node), epsilon_spent=metrics.pop("spent", implied), **metrics)
    return Message(content, reply_to=request)


def test_the_book_accepts_rejects_and_counts_drops_in_one_round():
    book = _book([1, 2, 3, 4])
    refusal = Message(Error(code=1, reason=f"{keys.BUDGET_EXHAUSTED}: client 3: spent"),
                      reply_to=Message(RecordDict(), dst_node_id=3, message_type=MessageType.TRAIN))
    accepted = book.accept(1, [_reply(1), _reply(2, **{keys.NUM_EXAMPLES: 7}), refusal], Verifier())
    assert [a.node_id for a in accepted] == [1]
    result = book.result(1)
    assert result is not None and result.accepted == ["1"] and result.dropped == ["4"]
    reasons = {r["client"]: r["reason"] for r in result.rejected}
    assert "contradicts the handshake's 100" in reasons["2"] and reasons["3"].startswith(keys.BUDGET_EXHAUSTED)
    accounts = book.registry.accounts
    assert accounts[3].exhausted and accounts[4].dropped_rounds == [1] and accounts[1].rounds == [1]
    assert accounts[1].server_history == [(1000.0, 1.0, 1)]
    failed = book.too_few(1, len(accepted))  # one accepted, two needed: the round fails, visibly
    assert failed is not None and failed[keys.NUM_ACCEPTED] == 1 and "fewer than the minimum" in book.failed_rounds[1]


def test_a_claim_below_the_servers_recomputation_or_a_release_its_mechanism_forbids_is_rejected():
    book = _book([1, 2])
    accepted = book.accept(1, [_reply(1, spent=1e-9)], Verifier())
    assert not accepted and "below the" in book.registry.accounts[1].rejections[0][1]
    accepted = book.accept(1, [_reply(2)], Verifier(refuse=True))
    assert not accepted and "does not allow" in book.registry.accounts[2].rejections[0][1]
    assert book.registry.accounts[2].server_history == []  # nothing booked for a rejected reply


def test_a_reply_from_a_node_that_never_did_the_handshake_is_rejected_not_booked():
    book = _book([1])
    assert book.accept(1, [_reply(99)], Verifier()) == []
    result = book.result(1)
    assert result is not None and result.rejected == [{"client": "node-99",
                                                        "reason": "reply from a node that never did the handshake"}]


def test_a_prepaid_run_is_not_ended_by_its_precharge():
    book = _book([1])
    verifier = Verifier()
    verifier.charges_run_once = True
    book.registry.accounts[1].epsilon_budget = epsilon_of([(1000.0, 1.0, 1)], 1e-5, "rdp")  # the charge is all
    book.accept(1, [_reply(1, **{keys.EPSILON_BUDGET: book.registry.accounts[1].epsilon_budget})], verifier)
    assert book.registry.accounts[1].rounds == [1] and not book.registry.accounts[1].exhausted
    assert math.isfinite(book.registry.accounts[1].epsilon_spent)


def test_metric_records_carry_the_round_counts_under_the_wire_keys():
    book = _book([1, 2])
    book.accept(1, [_reply(1)], Verifier())
    failed = book.too_few(1, 1)
    assert isinstance(failed, MetricRecord) and set(failed) == {keys.NUM_ACCEPTED, keys.NUM_REJECTED, keys.NUM_DROPPED}
    with pytest.raises(KeyError):
        _ = failed[keys.NUM_SUMMED]
