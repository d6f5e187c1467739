"""A deployed grid hands a round's replies over as soon as they are all there."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from privet.inprocess import InProcessGrid
from server.prompt_grid import REPLY_POLL_SECONDS, PromptGrid, prompt


class SlowSuperLink:
    """A grid whose reply to message i becomes pullable ``delays[i]`` s after the push."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.pushed_at = 0.0
        self.pulls = 0

    def push_messages(self, messages):
        self.pushed_at = time.monotonic()
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        self.pulls += 1
        now = time.monotonic() - self.pushed_at
        ready = [m for m in message_ids if now >= self.delays[int(m[1:])]]
        return [_reply_to(m) for m in ready]


def _reply_to(message_id: str) -> SimpleNamespace:
    """What the exchange reads of a reply: ``metadata.reply_to_message_id``."""
    return SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=message_id))


def _messages(n: int) -> list[object]:
    return [object() for _ in range(n)]


def test_replies_come_back_within_one_poll_of_the_last_one():
    link = SlowSuperLink([0.0, 0.3, 0.5])
    started = time.monotonic()
    replies = list(PromptGrid(link).send_and_receive(_messages(3), timeout=10))  # type: ignore[arg-type]
    waited = time.monotonic() - started
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    # Flower's grid would have slept 3 s before its second pull; one poll interval of slack
    assert 0.5 <= waited < 0.5 + 2 * REPLY_POLL_SECONDS + 0.5
    assert link.pulls <= 0.5 / REPLY_POLL_SECONDS + 3


def test_a_missing_reply_ends_the_exchange_at_the_timeout_with_the_rest():
    link = SlowSuperLink([0.0, 99.0])
    replies = list(PromptGrid(link).send_and_receive(_messages(2), timeout=0.5))  # type: ignore[arg-type]
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]


def test_only_the_deployed_grid_is_wrapped():
    grid = InProcessGrid(lambda *_: None, [], {})  # type: ignore[arg-type]
    assert prompt(grid) is grid


def test_flowers_deployed_grid_is_wrapped_and_its_simulation_grid_recognised():
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import HttpGrid, InMemoryGrid

    from server.federation import is_simulation

    deployed = HttpGrid("127.0.0.1:9", insecure=True, token="t")  # connects on first use only
    assert isinstance(prompt(deployed), PromptGrid)
    assert not is_simulation(deployed)
    simulated = InMemoryGrid(state_factory=LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                                                                  ObjectStoreFactory()))
    assert is_simulation(simulated) and prompt(simulated) is simulated
    assert not is_simulation(InProcessGrid(lambda *_: None, [], {}))  # type: ignore[arg-type]


def test_telling_grids_apart_imports_none_of_flowers_link_state():
    """The in-process run never pays for Flower's link-state stack (0.8 s of imports, #38)."""
    probe = ("import sys\nfrom privet.inprocess import InProcessGrid\nfrom server.federation import is_simulation\n"
             "from server.prompt_grid import prompt\ngrid = InProcessGrid(lambda *_: None, [], {})\n"
             "assert prompt(grid) is grid and not is_simulation(grid)\n"
             "print(sorted(m for m in sys.modules if m.startswith(('flwr.superlink.grid', 'flwr.server.superlink.linkstate'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
