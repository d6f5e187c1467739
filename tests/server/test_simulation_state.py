"""The simulation's state, looked up by node, answers Flower's engine exactly as Flower's own does.

Two simulation worlds are built the way Flower 1.39's ``_main_loop`` and ``vce_api`` build
them (the in-memory LinkState, the run, N registered nodes, the InMemoryGrid); one of them gets
:func:`server.simulation_state.index_by_node`. The same random history of pushes, engine sweeps
(``add_messages_to_queue``'s loop: every node asked for one message), replies, pulls,
deletions and expiries is played on both; every sweep must deliver the same messages, in the
same order, to the same nodes.
"""

from __future__ import annotations

import random
from queue import Queue
from uuid import uuid4

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from privet.inprocess import InProcessGrid
from server.simulation_state import NodeIndex, index_by_node, index_simulation_state

RUN_ID = 7


@pytest.fixture(autouse=True)
def _serverapp_identity(monkeypatch):
    """What Flower's simulation sets before the ServerApp creates messages (restored after)."""
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_run_id", RUN_ID)
    monkeypatch.setattr(TaskIdentity, "_node_id", SUPERLINK_NODE_ID)


class World:
    """One simulation's state, grid and nodes, as Flower's simulation sets them up."""

    def __init__(self, num_nodes: int, indexed: bool) -> None:
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
        self.state = factory.state()
        assert isinstance(self.state, InMemoryLinkState)
        run = Run.create_empty(run_id=RUN_ID)
        run.primary_task_id = 11
        run.federation_id = NOOP_FEDERATION_ID
        self.state.run_ids[run.run_id] = RunRecord(run=run)
        self.state.task_store[11] = Task(task_id=11, run_id=run.run_id)
        self.nodes = list(_register_nodes(num_nodes, factory))  # node ids in partition order
        self.grid = InMemoryGrid(state_factory=factory)
        self.grid.set_run(run)
        self.index: NodeIndex | None = index_simulation_state(self.grid) if indexed else None
        self.checks = 0
        check = self.state._check_stored_messages

        def counted(ids, run_id=None):  # type: ignore[no-untyped-def]
            self.checks += len(ids)
            return check(ids, run_id)

        self.state._check_stored_messages = counted  # type: ignore[method-assign]
        self.delivered: list[Message] = []
        self.by_label: dict[str, str] = {}  # label -> message id

    def push(self, partitions: list[int], labels: list[str], ttl: float = 3600.0) -> None:
        messages = []
        for p, label in zip(partitions, labels, strict=True):
            content = RecordDict({"c": ConfigRecord({"label": label})})
            messages.append(self.grid.create_message(content, "train", self.nodes[p], label, ttl=ttl))
        for label, message_id in zip(labels, self.grid.push_messages(messages), strict=True):
            self.by_label[label] = message_id

    def sweep(self) -> list[tuple[int, str]]:
        """``vce_api.add_messages_to_queue``'s loop body: each node asked for one message."""
        queue: Queue[Message] = Queue()
        for node_id in self.nodes:
            for message in self.state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
        out = []
        while not queue.empty():
            message = queue.get()
            self.delivered.append(message)
            out.append((self.nodes.index(message.metadata.dst_node_id), message.metadata.group_id))
        return out

    def reply(self, label: str) -> bool:
        """A node's reply, stored as the engine's ``put_message_into_state`` does (refused if
        the instruction has expired meanwhile)."""
        message = next(m for m in self.delivered if m.metadata.group_id == label)
        reply = Message(RecordDict(), reply_to=message)
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        return self.state.store_message_res(reply) is not None

    def pull(self, labels: list[str]) -> list[str]:
        """The ServerApp's pull (deletes each answered instruction)."""
        replies = self.grid.pull_messages([self.by_label[x] for x in labels])
        ids = {v: k for k, v in self.by_label.items()}
        return sorted(ids[r.metadata.reply_to_message_id] for r in replies)

    def expire(self, label: str) -> None:
        self.state.message_ins_store[self.by_label[label]].metadata.created_at -= 10_000.0

    def delete(self, labels: list[str]) -> None:
        self.state.delete_messages({self.by_label[x] for x in labels if x in self.by_label})


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_every_sweep_delivers_what_flowers_own_lookup_delivers(seed):
    rng = random.Random(seed)
    plain, indexed = World(40, indexed=False), World(40, indexed=True)
    assert indexed.index is not None and plain.index is None
    counter = 0
    for _ in range(60):
        op = rng.choice(["push", "push", "sweep", "sweep", "reply", "pull", "expire", "delete"])
        delivered = [m.metadata.group_id for m in plain.delivered]
        stored = [k for k, v in plain.by_label.items() if v in plain.state.message_ins_store]
        if op == "push":  # a round's messages; a node may get several (limit=1 per sweep)
            parts = [rng.randrange(40) for _ in range(rng.randint(1, 15))]
            labels = [f"m{counter + i}" for i in range(len(parts))]
            counter += len(parts)
            for w in (plain, indexed):
                w.push(parts, labels)
        elif op == "sweep":
            assert plain.sweep() == indexed.sweep()
        elif op == "reply" and delivered:
            label = rng.choice(delivered)
            if plain.by_label[label] in plain.state.message_ins_store \
                    and plain.by_label[label] not in plain.state.message_ins_id_to_message_res_id:
                assert plain.reply(label) == indexed.reply(label)
        elif op == "pull" and stored:
            labels = rng.sample(stored, min(len(stored), 5))
            assert plain.pull(labels) == indexed.pull(labels)
        elif op == "expire" and stored:
            label = rng.choice(stored)
            for w in (plain, indexed):
                w.expire(label)
        elif op == "delete" and stored:
            labels = rng.sample(stored, min(len(stored), 3))
            for w in (plain, indexed):
                w.delete(labels)
        assert [m.metadata.group_id for m in plain.state.message_ins_store.values()] == \
            [m.metadata.group_id for m in indexed.state.message_ins_store.values()]
    assert plain.sweep() == indexed.sweep()
    assert indexed.index.rebuilds == 1  # the writers kept it current: never rebuilt after install


def test_a_sweep_checks_only_the_stored_messages_not_nodes_times_messages():
    plain, indexed = World(200, indexed=False), World(200, indexed=True)
    for w in (plain, indexed):
        w.push(list(range(0, 200, 10)), [f"m{i}" for i in range(20)])
        w.checks = 0
        assert len(w.sweep()) == 20
    assert plain.checks == 200 * 20 - sum(range(20))  # node k's ask stops at its own message
    assert indexed.checks == 20


def test_a_writer_the_index_does_not_know_of_forces_a_rebuild():
    w = World(5, indexed=True)
    assert w.index is not None
    w.push([1, 2], ["a", "b"])
    message = w.state.message_ins_store.pop(w.by_label["a"])  # behind the index's back
    assert w.sweep() == [(2, "b")]
    w.state.message_ins_store[message.metadata.message_id] = message
    assert w.sweep() == [(1, "a")]
    assert w.index.rebuilds == 3


def test_only_flowers_simulation_grid_is_indexed():
    assert index_simulation_state(InProcessGrid(lambda *_: None, [], {})) is None  # type: ignore[arg-type]
    world = World(3, indexed=False)
    index = index_by_node(world.state)
    assert world.state.get_message_ins == index.get_message_ins
    assert InMemoryLinkState.get_message_ins is not index.get_message_ins  # the class is Flower's
    assert World(3, indexed=False).state.get_message_ins.__func__ is InMemoryLinkState.get_message_ins  # type: ignore[attr-defined]
