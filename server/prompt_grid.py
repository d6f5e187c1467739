"""Replies as soon as they arrive, in a deployment.

Flower 1.39's gRPC/HTTP grid (``HttpGrid``, what a ServerApp gets from a SuperLink)
``send_and_receive`` pushes a round's messages and then pulls the replies with a fixed
3 s sleep between pulls, so every exchange (the budget handshake, each round's train
messages, each stage of a secure sum) waits 1.5 s on average, and up to 3 s, after its last
reply has arrived. :class:`PromptGrid` pulls every :data:`REPLY_POLL_SECONDS` instead; all
else is the wrapped grid's. The simulation's and the in-process grid are left as they are.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

from flwr.app import Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from server.federation import grid_is

#: Seconds between two pulls of the replies (Flower 1.39's gRPC grid: 3); one small request
#: to the SuperLink each.
REPLY_POLL_SECONDS: Final = 0.2


class PromptGrid(Grid):
    """A deployed grid whose ``send_and_receive`` pulls replies every :data:`REPLY_POLL_SECONDS`."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid

    def set_run(self, run: Run) -> None:  # noqa: D102
        self._grid.set_run(run)

    @property
    def run(self) -> Run:  # noqa: D102
        return self._grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,  # noqa: D102
                       ttl: float | None = None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return self._grid.get_node_ids()

    def get_nodes(self) -> Iterable[NodeInfo]:  # noqa: D102
        return self._grid.get_nodes()

    def __getattr__(self, name: str) -> Any:
        """Anything else (``close``, the wrapped grid's own helpers) is the wrapped grid's."""
        return getattr(self._grid, name)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``, then pull until every one has a reply or ``timeout`` s have passed
        (``None``: no limit), as Flower's does, but every :data:`REPLY_POLL_SECONDS`.
        """
        pending = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending and (deadline is None or time.monotonic() < deadline):
            arrived = list(self.pull_messages(pending))
            replies.extend(arrived)
            pending.difference_update(m.metadata.reply_to_message_id for m in arrived)
            if pending:
                time.sleep(REPLY_POLL_SECONDS)
        return replies


def prompt(grid: Grid) -> Grid:
    """``grid`` wrapped in :class:`PromptGrid` if it is Flower's deployed (HTTP/gRPC) grid."""
    return PromptGrid(grid) if grid_is(grid, "HttpGrid") else grid
