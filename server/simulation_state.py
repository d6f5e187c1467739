"""The simulation's message store, looked up by destination node.

Flower 1.39's simulation engine hands messages to the SuperNodes from one thread
(``vce_api.add_messages_to_queue``): every 0.1 s it asks the in-memory LinkState, for each
of the N simulated nodes in turn, for that node's next undelivered message, and
``InMemoryLinkState.get_message_ins`` answers each ask by scanning the whole message store
(checking every stored message's expiry on the way) under the state's lock. A sweep costs
O(N × M) for M stored messages: at N = 6,000 that is 6,000 × 120 checks a sweep during a
round with 120 clients sampled, and 6,000 × 6,000 during the budget handshake, all in the
process that also runs the ServerApp (the engine thread holds the lock and the interpreter
while the server aggregates). Measured with privet's scaling benchmark: a round at
N = 6,000 took 1.59× one at N = 200, and the handshake 74 s.

:func:`index_by_node` gives the simulation's own state an index from node to its stored
messages, kept current by the state's two writers (``store_message_ins`` and
``delete_messages``), and a ``get_message_ins`` that looks only at the asking node's
messages: the same messages, in the same (insertion) order, through the same checks
(expiry, run, not yet delivered, ``limit``), marked delivered the same way. Flower's scan
also deletes the expired messages of other nodes that it passes; here each node's ask
checks all of its own messages instead, and the engine asks every node every sweep, so a
sweep leaves the same store behind. If the index ever disagrees with the
store's size (a writer it does not know of) it is rebuilt from the store before answering.

Only this process's simulation state is touched, as an attribute of that one instance
(never Flower's class): a deployed SuperLink, where each node asks for its own messages,
and privet's in-process backend are left as they are.
"""

from __future__ import annotations

from flwr.app import Message
from flwr.server.superlink.linkstate import InMemoryLinkState
from flwr.serverapp import Grid
from flwr.supercore.date import now

from server.federation import is_simulation


class NodeIndex:
    """Stored instruction messages of one :class:`InMemoryLinkState`, by destination node."""

    def __init__(self, state: InMemoryLinkState) -> None:
        self._state = state
        self._store = state.store_message_ins  # Flower's own writers, bound to ``state``
        self._delete = state.delete_messages
        self._by_node: dict[int, dict[str, None]] = {}  # node -> message ids, insertion order
        self._node_of: dict[str, int] = {}
        self.rebuilds = 0
        with state.lock:
            self._rebuild()

    def _rebuild(self) -> None:
        self._by_node.clear()
        self._node_of.clear()
        for message_id, message in self._state.message_ins_store.items():
            self._add(message_id, message.metadata.dst_node_id)
        self.rebuilds += 1

    def _add(self, message_id: str, node_id: int) -> None:
        self._node_of[message_id] = node_id
        self._by_node.setdefault(node_id, {})[message_id] = None

    def _discard(self, message_id: str) -> None:
        node_id = self._node_of.pop(message_id, None)
        if node_id is not None:
            ids = self._by_node[node_id]
            del ids[message_id]
            if not ids:
                del self._by_node[node_id]

    def store_message_ins(self, message: Message) -> str | None:
        """Flower's ``store_message_ins``, then the stored message into the index."""
        with self._state.lock:
            message_id = self._store(message)
            if message_id is not None and message_id not in self._node_of \
                    and message_id in self._state.message_ins_store:
                self._add(message_id, self._state.message_ins_store[message_id].metadata.dst_node_id)
        return message_id

    def delete_messages(self, message_ins_ids: set[str]) -> None:
        """Flower's ``delete_messages``, then the same ids out of the index."""
        with self._state.lock:
            self._delete(message_ins_ids)
            for message_id in message_ins_ids:
                if message_id not in self._state.message_ins_store:
                    self._discard(message_id)

    def get_message_ins(self, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Message]:
        """``InMemoryLinkState.get_message_ins`` over ``node_id``'s own messages only."""
        if limit is not None and limit < 1:
            raise AssertionError("`limit` must be >= 1")
        state = self._state
        found: list[Message] = []
        with state.lock:
            if len(self._node_of) != len(state.message_ins_store):
                self._rebuild()
            for message_id in list(self._by_node.get(node_id, ())):
                state._check_stored_messages({message_id})  # expiry, federation: Flower's own
                message = state.message_ins_store.get(message_id)
                if (message and message.metadata.dst_node_id == node_id
                        and (run_id is None or message.metadata.run_id == run_id)
                        and message.metadata.delivered_at == "" and not (limit and len(found) == limit)):
                    found.append(message)
        delivered_at = now().isoformat()
        for message in found:
            message.metadata.delivered_at = delivered_at
        return found


def index_by_node(state: InMemoryLinkState) -> NodeIndex:
    """Install a :class:`NodeIndex` on ``state`` (this instance only); returns it."""
    index = NodeIndex(state)
    for name in ("store_message_ins", "delete_messages", "get_message_ins"):
        setattr(state, name, getattr(index, name))
    return index


def index_simulation_state(grid: Grid) -> NodeIndex | None:
    """Index the LinkState behind ``grid`` if it is Flower's simulation grid; else nothing."""
    state = getattr(grid, "state", None)
    if is_simulation(grid) and isinstance(state, InMemoryLinkState):
        return index_by_node(state)
    return None
