"""The federation a run gets must be the one its config describes.

Flower 1.39's local simulation starts ``num-supernodes`` SuperNodes (2 unless told
otherwise: ``flwr run . --federation-config "num-supernodes=10 client-resources-num-cpus=1"``;
the second option gives each ClientApp actor one CPU instead of Flower's 2, so that a 2-core
machine trains two clients at a time instead of one), and each simulated
ClientApp partitions the data by the ``num-partitions`` Flower gives it, which is that
number. A config that says ``num-clients = 10`` run on 2 SuperNodes would silently train
2 clients on 30,000 examples each, with 2 budgets instead of 10: the ServerApp refuses it
before anything is written.

Only the simulation is checked (its SuperNodes are all registered within a moment of the
start); a deployed SuperLink's nodes connect whenever their operators start them, and
the strategies wait for ``min-train-clients`` of them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from flwr.serverapp import Grid

from server.config import ConfigError, RunConfig

#: How long the simulation may take to register its SuperNodes.
REGISTRATION_TIMEOUT_S = 120.0
#: The node count is taken as final once it has not changed for this long.
SETTLE_S = 2.0


def grid_is(grid: Grid, name: str) -> bool:
    """Whether ``grid`` is an instance of ``flwr.superlink.grid.<name>`` (``InMemoryGrid``, ``HttpGrid``).

    Answered without importing that package (0.8 s: Flower's link-state and SQL stack, #38): no grid
    of its classes can exist before the package is imported, so where it is not, the answer is no.
    """
    package = sys.modules.get("flwr.superlink.grid")
    kind = getattr(package, name, None)
    return isinstance(kind, type) and isinstance(grid, kind)


def is_simulation(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's simulation grid (the in-memory one ``flwr-simulation`` uses)."""
    return grid_is(grid, "InMemoryGrid")


def settled_node_count(grid: Grid, *, timeout: float = REGISTRATION_TIMEOUT_S, settle: float = SETTLE_S,
                       clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep) -> int:
    """The number of nodes once it is non-zero and unchanged for ``settle`` seconds."""
    deadline = clock() + timeout
    last, since = -1, clock()
    while True:
        count = len(list(grid.get_node_ids()))
        now = clock()
        if count != last:
            last, since = count, now
        elif count > 0 and now - since >= settle:
            return count
        if now > deadline:
            return count
        sleep(0.25)


def mismatch_message(num_supernodes: int, num_clients: int) -> str:
    """What to do when the simulation's size and ``num-clients`` differ."""
    return (
        f"invalid run config: 'num-clients' = {num_clients} but Flower's simulation started "
        f"{num_supernodes} SuperNodes (each would train on 1/{num_supernodes} of the data). "
        f"Start it with as many (and one CPU per ClientApp, so that clients train in parallel): "
        f"flwr run . --federation-config \"num-supernodes={num_clients} client-resources-num-cpus=1\" "
        f"--stream (or set num-clients={num_supernodes}; `privet run` does this for you)"
    )


def check_federation(grid: Grid, cfg: RunConfig) -> None:
    """Refuse a simulation whose number of SuperNodes differs from ``num-clients``."""
    if not is_simulation(grid):
        return
    count = settled_node_count(grid)
    if count != cfg.num_clients:
        raise ConfigError(mismatch_message(count, cfg.num_clients))
