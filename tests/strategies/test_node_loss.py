"""A client lost with its node is a drop, never a rejection (protocol/node_loss.py, issue #41).

The error replies are the ones Flower itself writes: its simulation worker
(``flwr/server/superlink/fleet/vce/vce_api.py``, ``worker``) is run on one message with a backend
whose call raises Ray's real exception, as a Ray actor lost with its node makes ``ray.get`` do.
"""

from __future__ import annotations

import json
import queue
import threading

import pytest
import ray.exceptions
from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.clientapp.client_app import ClientAppException
from flwr.common.constant import ErrorCode
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.metrics import VceMetrics
from flwr.supercore.task_identity import TaskIdentity

from protocol import keys
from protocol.node_loss import NoActorLeft, is_node_lost

NODE = 7


def _request() -> Message:
    """A train message to ``NODE`` of run 1."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0  # as a ServerApp would have
    request = Message(RecordDict(), dst_node_id=NODE, message_type=MessageType.TRAIN)
    request.metadata.__dict__["_message_id"] = "m-1"
    return request


class _Store:
    """The one node's context store that Flower's worker reads and writes (a dict's worth)."""

    def __init__(self) -> None:
        self.context = Context(run_id=1, node_id=NODE, node_config={"partition-id": 0, "num-partitions": 1},
                               state=RecordDict(), run_config={})

    def retrieve_context(self, run_id: int) -> Context:
        return self.context

    def update_context(self, run_id: int, context: Context) -> None:
        self.context = context


class _Raising:
    """A backend whose every message raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        raise self.exc


def flower_reply(exc: BaseException) -> Message:
    """The reply Flower's simulation worker writes when the backend raises ``exc`` for a train message."""
    request = _request()
    ins: queue.Queue[Message] = queue.Queue()
    res: queue.Queue[Message] = queue.Queue()
    stop = threading.Event()
    ins.put(request)
    thread = threading.Thread(target=vce_api.worker, args=(ins, res, {NODE: _Store()}, _Raising(exc), stop,
                                                           VceMetrics()))
    thread.start()
    try:
        return res.get(timeout=30)
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("exc", [ray.exceptions.ActorDiedError(),
                                 ray.exceptions.ActorUnavailableError("socket closed", None),
                                 NoActorLeft("every Ray actor of this run was lost")])
def test_what_flower_writes_for_a_lost_actor_is_a_lost_node(exc):
    reply = flower_reply(exc)
    assert reply.has_error() and reply.error.code == ErrorCode.UNKNOWN  # Flower's own code for these
    assert is_node_lost(reply), reply.error.reason


@pytest.mark.parametrize("exc", [ClientAppException("ValueError: disk full"), RuntimeError("ActorDiedError"),
                                 ValueError("<class 'ray.exceptions.ActorDiedError'>")])
def test_a_client_that_failed_is_not_a_lost_node(exc):
    """The ClientApp's own exceptions and unrelated errors stay rejections, whatever their text says."""
    reply = flower_reply(exc)
    assert reply.has_error() and not is_node_lost(reply), reply.error.reason


def test_the_superlinks_replies_for_a_gone_node_are_lost_nodes():
    request = _request()
    for code in (ErrorCode.NODE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE):
        assert is_node_lost(Message(Error(code=code, reason="gone"), reply_to=request))
    assert not is_node_lost(Message(Error(code=4003, reason="internal: disk full"), reply_to=request))
    assert not is_node_lost(Message(RecordDict(), reply_to=request))


def test_a_client_lost_with_its_ray_actor_is_a_drop_and_a_round_below_its_minimum_fails(run_config_factory, tmp_path):
    """In-process run, real ClientApp and ServerApp: in round 2 one client's reply is the one
    Flower writes for a dead actor, and another client fails. The first is booked as a drop
    (summary, round row, report), the second as a rejection, in the report's own section; the
    round, now below ``min-accepted-clients``, fails: the run is incomplete."""
    from privet.inprocess import FIRST_NODE_ID, simulation_node_configs
    from tests.system.test_site_faults import _run

    lost = flower_reply(ray.exceptions.ActorDiedError())
    cfg = run_config_factory(num_server_rounds=3, min_accepted_clients=3, budget_distribution="constant",
                             epsilon=50.0, noise_multiplier=1.0)

    def actor_lost_in_round_2(node, request, reply):  # noqa: ANN001
        is_train = request.metadata.message_type == MessageType.TRAIN
        if is_train and int(request.content[keys.CONFIG][keys.SERVER_ROUND]) == 2 and node == FIRST_NODE_ID:
            return Message(Error(code=lost.error.code, reason=lost.error.reason), reply_to=request)
        if is_train and int(request.content[keys.CONFIG][keys.SERVER_ROUND]) == 2 and node == FIRST_NODE_ID + 1:
            return Message(Error(code=4003, reason="internal: disk full"), reply_to=request)
        return reply

    with pytest.raises(RuntimeError, match=r"incomplete: 1 of 3 rounds failed \(rounds 2\)"):
        _run(cfg, simulation_node_configs(3), hook=actor_lost_in_round_2)
    out = tmp_path / "results"
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["round"]: r for r in map(json.loads, (out / "rounds.jsonl").read_text().splitlines()) if r["round"]}
    assert rows[2]["dropped"] == ["0"] and len(rows[2]["accepted"]) == 1
    assert rows[2]["rejected"] == [{"client": "1", "reason": "internal: disk full"}]
    assert all(len(rows[r]["accepted"]) == 3 and not rows[r]["dropped"] for r in (1, 3))
    assert summary["dropped"] == ["0"]
    first = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert first["dropped_rounds"] == [2] and first["rejections"] == []
    assert 2 in first["possibly_charged_rounds"], "a lost reply may have charged the client's ledger"
    report = (out / "privacy_report.md").read_text()
    assert "Clients that dropped out of at least one round: 0." in report and "## Failed rounds" in report
    section = report.split("## Rejected replies", 1)[1].split("\n## ", 1)[0]  # its own section, and only there
    assert "- round 2: client 1: internal: disk full" in section
    assert "- round 2: client 1" not in report.split("## Rejected replies", 1)[0]
