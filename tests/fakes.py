"""Test doubles shared by the strategy tests."""

from __future__ import annotations

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from protocol import keys


#: The mechanism figures of a fake train reply: σ so large that the ε the server recomputes
#: from them stays far below any claimed ε in these tests (q and steps of one whole-update
#: release, what an update-mode strategy expects).
FAKE_MECHANISM = {keys.NOISE_MULTIPLIER: 1000.0, keys.SAMPLE_RATE: 1.0, keys.LOCAL_STEPS: 1}


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
