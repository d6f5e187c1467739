"""Flower's Ray actor pool without the dead: an actor lost with its node leaves the pool.

Flower's simulation engine (1.39 to 1.42, ``flwr/server/superlink/fleet/vce``) builds one
``RayBackend`` per run: a ``BasicActorPool`` of ``ClientAppActor`` actors, one per
``client-resources-num-cpus`` CPUs of the nodes alive at the start, and one worker thread per
actor. Each message takes any idle actor (``pool.pop()``), runs ``actor.run.remote(...)`` and
waits for the result (``ray.get``); on *any* exception the actor goes back into the pool
(``RayBackend.process_message``, ``add_actor_back_to_pool``). An actor whose node died stays
there, and since every call to it fails at once it takes most of the following messages: a run
that lost one node of two lost most of its clients in every later round (issue #41).

:class:`PrivetRayBackend` (built by :func:`backend_class`) runs the same calls, but an actor
whose call raised Ray's ``RayActorError`` is not given back:

* ``ActorDiedError``: Ray says the actor is dead (its process or its node is gone; Flower
  creates actors without restarts). It leaves the pool for good.
* ``ActorUnavailableError``: Ray cannot reach it now (the node may be going away, or the
  network blinked). It leaves the idle list while ``check_unavailable`` asks it for
  ``__ray_ready__`` for up to :data:`UNAVAILABLE_GRACE_S`: back in the pool if it answers,
  gone otherwise.

The message itself fails with Ray's exception, which Flower's worker turns into an error reply
(``Error(UNKNOWN, "<class 'ray.exceptions.ActorDiedError'>:...")``); the server counts that
reply as a drop (:func:`protocol.node_loss.is_node_lost`). Later messages wait for a live
actor, so later rounds run on the actors of the nodes still alive; when none is left, each
message fails at once with :class:`protocol.node_loss.NoActorLeft` (also a drop). The pool is
not refilled: as in Flower, nodes that join during a run are not used by it.

:func:`install` makes Flower's engine build this backend instead of its own: Flower looks the
class up in its module (``vce_api.start_vce``, ``backend_fn``: ``from .backend.raybackend import
RayBackend``) only after it has loaded the ClientApp, whose module (:mod:`client.app`) calls
:func:`install`. It acts only in a process that runs the engine (``flwr-simulation``), never in
a deployed ClientApp or in the Ray actors, and imports nothing of Ray before it acts.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from protocol.node_loss import NoActorLeft

log = logging.getLogger("privet.ray_pool")

#: The module of Flower's simulation engine: present only in a process that runs it.
ENGINE_MODULE = "flwr.server.superlink.fleet.vce"
#: Where the engine looks up its backend class.
BACKEND_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"

#: Seconds an unreachable actor (``ActorUnavailableError``) gets to answer before it is taken for lost.
UNAVAILABLE_GRACE_S = 30.0


def install() -> bool:
    """Make Flower's simulation engine build :class:`PrivetRayBackend` for its runs.

    Returns
    -------
    bool
        True if this process runs Flower's simulation engine and now uses privet's backend;
        False elsewhere (nothing is imported or changed).
    """
    if ENGINE_MODULE not in sys.modules:
        return False
    import importlib

    module = importlib.import_module(BACKEND_MODULE)
    if not getattr(module.RayBackend, "privet_pool", False):
        setattr(module, "RayBackend", backend_class())  # noqa: B010 - the name Flower's engine looks up
    return True


def backend_class() -> type:
    """Flower's ``RayBackend`` with :meth:`process_message` that retires lost actors (module docstring)."""
    import ray
    from flwr.common.constant import PARTITION_ID_KEY
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    class PrivetRayBackend(RayBackend):  # type: ignore[misc,valid-type]  # Flower's class, untyped for mypy
        """Flower's ``RayBackend``; an actor lost with its node leaves the pool (:mod:`client.ray_pool`)."""

        privet_pool = True

        def actors(self) -> Any:
            """Flower's ``BasicActorPool`` (built): ``pool`` (the idle actors), ``num_actors`` (alive)."""
            assert self.pool is not None, "build() first"
            return self.pool

        def build(self, app_fn: Callable[[], Any]) -> None:
            super().build(app_fn)
            self.idle = threading.Condition()
            self.lost = 0
            log.info("Ray actor pool: %d ClientApp actors on the cluster's nodes", self.actors().num_actors)

        def process_message(self, message: Any, context: Any) -> tuple[Any, Any]:
            """Run the ClientApp for ``message`` on an idle live actor; a lost actor is retired.

            Raises
            ------
            ray.exceptions.RayActorError
                The actor was lost (the message is lost with it: a drop for the server).
            NoActorLeft
                Every actor of the pool was lost.
            """
            if self.pool is None or self.app_fn is None:
                return super().process_message(message, context)  # Flower's own error
            actor = self.take()
            try:
                future = actor.run.remote(self.app_fn, message, str(context.node_config[PARTITION_ID_KEY]), context)
                _, out_message, updated_context = ray.get(future)
            except ray.exceptions.ActorUnavailableError as exc:
                log.warning("Ray actor %s is unreachable (%s); it leaves the pool until it answers",
                            actor._actor_id.hex()[:12], _first_line(exc))
                threading.Thread(target=self.check_unavailable, args=(actor,), daemon=True).start()
                raise
            except ray.exceptions.RayActorError as exc:
                self.retire(actor, exc)
                raise
            except BaseException:
                self.give_back(actor)
                raise
            self.give_back(actor)
            return out_message, updated_context

        def take(self) -> Any:
            """An idle actor, waiting for one while any is alive."""
            with self.idle:
                while not self.actors().pool:
                    if self.actors().num_actors <= 0:
                        raise NoActorLeft(f"every Ray actor of this run was lost ({self.lost} with their nodes); "
                                          "no client can be served")
                    self.idle.wait(timeout=1.0)
                return self.actors().pool.pop()

        def give_back(self, actor: Any) -> None:
            with self.idle:
                self.actors().pool.append(actor)
                self.idle.notify()

        def retire(self, actor: Any, exc: BaseException) -> None:
            """``actor`` is gone: out of the pool for good."""
            with self.idle:
                self.actors().num_actors -= 1
                self.lost += 1
                left = self.actors().num_actors
                self.idle.notify_all()
            log.warning("Ray actor %s was lost (%s: %s); it leaves the pool: %d actor(s) left on the nodes "
                        "still alive", actor._actor_id.hex()[:12], type(exc).__name__, _first_line(exc), left)

        def check_unavailable(self, actor: Any) -> None:
            """Give an unreachable actor :data:`UNAVAILABLE_GRACE_S` to answer; retire it if it does not."""
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=UNAVAILABLE_GRACE_S)
            except Exception as exc:  # noqa: BLE001 - any failure to answer: the actor is lost
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001, S110 - already gone
                    pass
                self.retire(actor, exc)
                return
            log.info("Ray actor %s answers again; it is back in the pool", actor._actor_id.hex()[:12])
            self.give_back(actor)

    return PrivetRayBackend


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]
