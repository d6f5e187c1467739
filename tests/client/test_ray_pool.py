"""Lost Ray actors leave the ClientApp actor pool (client/ray_pool.py, issue #41).

The pool test runs Flower's real ``RayBackend`` and privet's on a local Ray instance with 2 CPUs
(2 actors), a real ClientApp, and an actor killed with ``ray.kill``, so that calls to it raise
Ray's own ``ActorDiedError``, as they do for an actor whose node died. Flower's backend puts the
dead actor back into its pool, and since it pops the actor it put back last, every later message
goes to the dead one; privet's retires it and serves every later message on the live actor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

ROOT = Path(__file__).resolve().parents[2]

echo = ClientApp()


@echo.query()
def _answer(msg: Message, context: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


def _load_echo() -> ClientApp:
    return echo


def _message() -> tuple[Message, Context]:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    msg = Message(RecordDict(), dst_node_id=5, message_type=MessageType.QUERY)
    msg.metadata.__dict__["_message_id"] = "m"
    context = Context(run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 1}, state=RecordDict(),
                      run_config={})
    return msg, context


def _outcomes(backend, n: int) -> list[str]:  # noqa: ANN001
    """What ``n`` messages in a row got: "ok", or the exception's class name."""
    got = []
    for _ in range(n):
        try:
            out, _ = backend.process_message(*_message())
            got.append("ok" if not out.has_error() else "error")
        except Exception as exc:  # noqa: BLE001 - what Flower's worker would turn into an error reply
            got.append(type(exc).__name__)
    return got


def _kill(actor) -> None:  # noqa: ANN001
    """``ray.kill`` the actor and wait until Ray reports it dead (the kill is asynchronous: under load a
    message sent right after it could still be served by the actor)."""
    import ray

    ray.kill(actor)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.2)
    raise AssertionError("an actor killed 120 s ago still answers")


@pytest.mark.slow
def test_a_dead_actor_leaves_privets_pool_and_stays_in_flowers(monkeypatch):
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    from client.ray_pool import backend_class

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # Flower's init_ray rewrites it
    config = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
              "init_args": {"num_cpus": 2, "logging_level": "ERROR", "log_to_driver": False}}
    try:
        flower = RayBackend(config)
        flower.build(_load_echo)
        assert flower.num_workers == 2 and _outcomes(flower, 2) == ["ok", "ok"]
        _kill(flower.pool.pool[-1])  # the actor the next message gets
        flower_after = _outcomes(flower, 6)
        for actor in flower.pool.pool:
            ray.kill(actor)

        privet = backend_class()(config)  # Ray is up: joins it, as Flower's backend does
        privet.build(_load_echo)
        assert privet.num_workers == 2 and _outcomes(privet, 2) == ["ok", "ok"]
        _kill(privet.pool.pool[-1])
        privet_after = _outcomes(privet, 6)
        actors_left = privet.pool.num_actors
        _kill(privet.pool.pool[-1])  # the last one
        privet_none_left = _outcomes(privet, 3)
    finally:
        ray.shutdown()
    assert flower_after == ["ActorDiedError"] * 6, flower_after  # the dead actor serves every message
    assert privet_after == ["ActorDiedError"] + ["ok"] * 5, privet_after  # one message lost, then the live actor
    assert actors_left == 1
    assert privet_none_left == ["ActorDiedError", "NoActorLeft", "NoActorLeft"], privet_none_left


def _installed(preload: str) -> str:
    """In a fresh interpreter: import ``preload``, then ``client.app``; which class Flower's engine would build."""
    code = (f"import sys\nimport {preload}\nimport client.app\n"
            "mod = sys.modules.get('flwr.server.superlink.fleet.vce.backend.raybackend')\n"
            "print(mod.RayBackend.__name__ if mod else 'not imported', 'ray' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_clientapp_installs_the_pool_only_where_flowers_engine_runs():
    """``flwr-simulation`` imports the engine before it loads the ClientApp: there the engine will
    build privet's backend. A deployed ClientApp, or any other process, imports no Ray for it."""
    assert _installed("flwr.server.superlink.fleet.vce") == "PrivetRayBackend True"
    assert _installed("flwr.app") == "not imported False"
