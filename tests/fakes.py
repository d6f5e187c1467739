"""Test doubles shared by the strategy tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from protocol import keys

#: The mechanism figures of a fake train reply: σ so large that the ε the server recomputes
#: from them stays far below any claimed ε in these tests (q and steps of one whole-update
#: release, what an update-mode strategy expects).
FAKE_MECHANISM = {keys.NOISE_MULTIPLIER: 1000.0, keys.SAMPLE_RATE: 1.0, keys.LOCAL_STEPS: 1}


def train_reply_content(arrays: Sequence[np.ndarray], *, client_id: str | None = None, num_examples: int = 100,
                        epsilon_spent: float = 1.0, epsilon_budget: float = 10.0, **metrics: Any) -> RecordDict:
    """The content of a well-formed train reply (the one reply factory of the strategy tests).

    Covered figures as an honest client reports them (:class:`protocol.replies.TrainReport`) with
    the :data:`FAKE_MECHANISM`; ``metrics`` overrides or adds raw entries by wire key, so a test can
    also forge a malformed one (NaN, a list, a missing key via ``None``).
    """
    from protocol.replies import TrainReport

    report = TrainReport(num_examples=num_examples, epsilon_budget=epsilon_budget, delta=1e-5,
                         epsilon_spent=epsilon_spent, noise_multiplier=FAKE_MECHANISM[keys.NOISE_MULTIPLIER],
                         sample_rate=FAKE_MECHANISM[keys.SAMPLE_RATE], local_steps=FAKE_MECHANISM[keys.LOCAL_STEPS])
    entries = {**report.metrics(), **metrics}
    content = RecordDict({keys.ARRAYS: ArrayRecord([np.asarray(a) for a in arrays]),
                          keys.METRICS: MetricRecord({k: v for k, v in entries.items() if v is not None})})
    if client_id is not None:
        content[keys.META] = ConfigRecord({keys.CLIENT_ID: client_id})
    return content


def train_reply(request: Message, arrays: Sequence[np.ndarray], **kwargs: Any) -> Message:
    """A well-formed reply to ``request`` from its destination node (:func:`train_reply_content`)."""
    content = train_reply_content(arrays, client_id=str(request.metadata.dst_node_id), **kwargs)
    return Message(content, reply_to=request)


class BudgetGrid(Grid):
    """Nodes that only answer the budget handshake, each with the given ε (nothing spent)
    and example count (100 unless given)."""

    def __init__(self, budgets: dict[int, float], num_examples: dict[int, int] | None = None) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
        self.budgets = budgets
        self.num_examples = num_examples or {}

    def get_node_ids(self):  # noqa: D102
        return list(self.budgets)

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        return [Message(RecordDict({
            keys.METRICS: MetricRecord({keys.EPSILON_BUDGET: self.budgets[m.metadata.dst_node_id],
                                        keys.DELTA: 1e-5, keys.NUM_EXAMPLES: self.num_examples.get(m.metadata.dst_node_id, 100),
                                        keys.EPSILON_SPENT: 0.0}),
            keys.META: ConfigRecord({keys.CLIENT_ID: str(m.metadata.dst_node_id)}),
        }), reply_to=m) for m in messages]

    # unused Grid API
    run = None

    def set_run(self, run_id): ...  # noqa: D102
    def create_message(self, *a, **k): ...  # noqa: D102
    def push_messages(self, messages): ...  # noqa: D102
    def pull_messages(self, message_ids): ...  # noqa: D102
