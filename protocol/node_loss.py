"""Which replies say that the client's machine was lost, not that the client answered.

Shared by the simulation's actor pool (:mod:`client.ray_pool`, which raises
:class:`NoActorLeft`) and the server's reply book (:mod:`strategies.reply_book`, which
counts what :func:`is_node_lost` recognises as drops).

A sampled client whose reply never came is **dropped**; one
that answered with an error or a bad update is **rejected**. Two kinds of error reply are in
fact "no answer", written by Flower on the client's behalf:

* the SuperLink's own replies for a node that is gone (``NODE_UNAVAILABLE``) or whose reply
  expired (``REPLY_MESSAGE_UNAVAILABLE``);
* in a Ray simulation, the reply Flower writes when the Ray actor that was to run the
  ClientApp died with its node: Flower's simulation worker catches the exception of
  ``ray.get`` and answers ``Error(code=UNKNOWN, reason="<class 'ray.exceptions.ActorDiedError'>:<'...'>")``
  (``flwr/server/superlink/fleet/vce/vce_api.py``, ``worker``; the same in Flower 1.39 to
  1.42). The ClientApp never ran, or ran and its reply was lost with the node.

Both are counted as drops. A reply can only *claim* such a loss; believing it grants the
client nothing: no update is accepted either way, and the round is booked as one the client
may have been charged for (``possibly_charged_rounds``) exactly as a rejection is.
"""

from __future__ import annotations

from flwr.app import Message
from flwr.common.constant import ErrorCode

#: Flower's error codes for replies the SuperLink writes itself when the destination node is gone.
NODE_GONE_ERRORS = (ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE)

#: Exceptions whose name in an ``UNKNOWN`` error reply means the client's Ray actor or node
#: was lost: Ray's (``ray.exceptions``; ``ActorDiedError`` and ``ActorUnavailableError`` are
#: ``RayActorError`` subclasses) and :class:`NoActorLeft`'s, raised by privet's actor pool
#: (:mod:`client.ray_pool`) when every actor of the run is gone.
LOST_ACTOR_EXCEPTIONS = ("ray.exceptions.ActorDiedError", "ray.exceptions.ActorUnavailableError",
                         "ray.exceptions.RayActorError", "ray.exceptions.NodeDiedError",
                         "ray.exceptions.LocalRayletDiedError", "NoActorLeft")


class NoActorLeft(RuntimeError):
    """Every Ray actor of the run's pool was lost: no message can be served any more."""


def lost_actor_reason(reason: str) -> bool:
    """Whether ``reason`` names an exception of :data:`LOST_ACTOR_EXCEPTIONS`.

    ``reason`` is as Flower's simulation writes it: ``"<class 'X'>:<'message'>"``.
    """
    head = reason.split(">:<", 1)[0]
    return head.startswith("<class '") and any(head.endswith(f"{name}'") for name in LOST_ACTOR_EXCEPTIONS)


def is_node_lost(reply: Message) -> bool:
    """Whether ``reply`` stands for a client that could not answer because its node was lost.

    Its node: its SuperNode, or in simulation the Ray actor (and node) serving it. Such a reply is counted as a drop, never as a rejection: see the module docstring.
    """
    if not reply.has_error():
        return False
    code = reply.error.code
    return code in NODE_GONE_ERRORS or (code == ErrorCode.UNKNOWN and lost_actor_reason(reply.error.reason or ""))
