"""An in-process Flower ``Grid``: the real ServerApp strategies and the real ClientApp,
called directly in one Python process, without Ray or gRPC.

It is what the fast tests run on, and ``privet run --backend inprocess`` offers it for
quick experiments. Every node keeps its own ``Context`` (and so its own ``context.state``)
for the whole run, as a SuperNode does. Exceptions raised by the ClientApp become error
replies, as Flower's runtime turns them into error messages.

Outside a real run Flower needs a task identity to build messages; it is set through
``flwr.supercore.task_identity`` (an internal API of Flower 1.39, pinned by this project).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from protocol import keys

#: A hook that may replace (tamper with) or drop (return None) a node's reply: for tests.
ReplyHook = Callable[[int, Message, Message], Message | None]

FIRST_NODE_ID = 2**63 + 100  # real node ids are uint64: exercise ids above int64
ERROR_CLIENT_EXCEPTION = 5000


class InProcessGrid(Grid):
    """A Grid whose nodes are ``ClientApp`` calls in this process.

    Parameters
    ----------
    client_app : ClientApp
        The app every node runs.
    node_configs : sequence of mappings
        One node config per node (``partition-id``, ``num-partitions``, budgets, ...).
    run_config : mapping
        The run config every node sees.
    run_id : int
        The run id put into every Context.
    reply_hook : callable, optional
        ``hook(node_id, request, reply) -> reply | None``; ``None`` drops the reply.
    """

    def __init__(
        self,
        client_app: ClientApp,
        node_configs: Iterable[Mapping[str, bool | int | float | str]],
        run_config: Mapping[str, bool | int | float | str],
        *,
        run_id: int = 1,
        reply_hook: ReplyHook | None = None,
    ) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 0
        self.app = client_app
        self.reply_hook = reply_hook
        self._run: int | None = None
        self.contexts: dict[int, Context] = {
            FIRST_NODE_ID + i: Context(
                run_id=run_id,
                node_id=FIRST_NODE_ID + i,
                node_config=dict(nc),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, nc in enumerate(node_configs)
        }
        self.offline: set[int] = set()
        self.messages_sent = 0

    def set_run(self, run_id: int) -> None:  # type: ignore[override]  # noqa: D102 - Grid API: an id is all we keep
        self._run = run_id

    @property
    def run(self):  # noqa: ANN201, D102 - Grid API
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        """A message to one node (Flower's ``Grid.create_message``; ``ttl`` is not used in process)."""
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> list[int]:  # noqa: D102 - Grid API
        return [n for n in self.contexts if n not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
        raise NotImplementedError("InProcessGrid only supports send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        raise NotImplementedError("InProcessGrid only supports send_and_receive")

    def _call(self, msg: Message) -> Message:
        try:
            return self.app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 - mirror Flower: an exception is an error reply
            return Message(Error(code=ERROR_CLIENT_EXCEPTION, reason=f"{type(exc).__name__}: {exc}"),
                           reply_to=msg)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Deliver each message to its node and collect the replies (dropped ones omitted)."""
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if node in self.offline:
                continue
            self.messages_sent += 1
            reply: Message | None = self._call(msg)
            if self.reply_hook is not None and reply is not None:
                reply = self.reply_hook(node, msg, reply)
            if reply is not None:
                replies.append(reply)
        return replies


def simulation_node_configs(num_clients: int) -> list[dict[str, int]]:
    """The node configs Flower's simulation gives: partition-id / num-partitions only."""
    return [{keys.NODE_PARTITION_ID: i, keys.NODE_NUM_PARTITIONS: num_clients} for i in range(num_clients)]
