"""Who this client is and what privacy budget it holds.

A budget belongs to the client, not to the server. In a deployment it comes from the
SuperNode's ``--node-config`` (``epsilon=1.5 delta=1e-5``) and from nowhere else: a
deployed site that declares none takes part only in non-private runs and refuses every
private one at the handshake, saying so. In simulation, where Flower only sets
``partition-id``/``num-partitions`` and the experimenter operates every client, it is drawn
from the run config's named distribution, evaluated deterministically per partition id so
that every process computes the same value without coordination.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from privacy.budgets import budget_for
from privacy.randomness import NOISE_SOURCES
from protocol.keys import (
    BUDGET_REFERENCE,
    BUDGET_REFERENCES,
    NODE_ALLOW_EVALUATION,
    NODE_ALLOW_SEEDED_NOISE,
    NODE_CLIENT_ID,
    NODE_DATA_DIR,
    NODE_DELTA,
    NODE_EPSILON,
    NODE_LEDGER_PATH,
    NODE_MAX_EXAMPLES,
    NODE_NOISE_SOURCE,
    NODE_NUM_PARTITIONS,
    NODE_PARTITION_ID,
    NODE_REPORT_TRAIN_METRICS,
    NODE_ROSTER,
    NODE_SHARD_CACHE,
    NODE_SIGNING_KEY,
)
from protocol.roster import Roster, SigningKey, simulated_key_path
from protocol.run_settings import RunSettings
from protocol.site import SiteFloors

_T = TypeVar("_T")

UserConfig = Mapping[str, bool | int | float | str]

#: δ of a deployed site that declares none: its own default, never the server's run config.
DEFAULT_DELTA = 1e-5

#: The ``budget-distribution`` value of the non-private baseline: no budget at all.
NO_BUDGET = "none"


@dataclass(frozen=True)
class ClientProfile:
    """The static facts about one client.

    Attributes
    ----------
    client_id : str
        Stable identity across runs (node-config ``client-id``, else the partition id).
    partition_id, num_partitions : int
        Which shard of the training set this client holds.
    epsilon_budget : float
        Total ε this client allows over *all* runs (``math.inf`` = no DP required).
    delta : float
        The δ of its (ε, δ) guarantee.
    budget_source : str
        ``"node-config"`` or ``"distribution"``.
    ledger_path : str | None
        Where the durable ledger lives, if the operator configured one.
    data_dir : str | None
        Node-local data directory overriding the run config's ``data-dir``.
    shard_cache : str | None
        Folder of the node-local shard cache (``client.shard_cache``); None = the default
        folder, ``"off"`` = no cache.
    noise_source : str
        Where DP randomness comes from (:mod:`privacy.randomness`); ``"seeded"`` only
        where the operator allows it.
    allow_evaluation : bool
        Whether the server may evaluate models on this client's data (an uncharged
        release, declared in the report as outside the guarantee).
    report_train_metrics : bool
        Whether train replies carry the un-noised training loss, time and update norm
        (outside the guarantee; off by default).
    max_examples : int | None
        Operator's cap on the examples this client trains on (and declares).
    floors : SiteFloors
        What the site refuses whatever the server asks (:mod:`protocol.site`).
    roster, signing_key : str or None
        The federation roster and this site's signing key (:mod:`protocol.roster`): a deployed
        site's from its node config only; a simulated one's from the run's ``roster`` (its key
        beside it). None: no roster (secure sums then hold against a server that follows the
        protocol only).
    """

    client_id: str
    partition_id: int
    num_partitions: int
    epsilon_budget: float
    delta: float
    budget_source: str
    ledger_path: str | None
    data_dir: str | None
    shard_cache: str | None = None
    noise_source: str = "csprng"
    allow_evaluation: bool = False
    report_train_metrics: bool = False
    max_examples: int | None = None
    floors: SiteFloors = SiteFloors()
    roster: str | None = None
    signing_key: str | None = None

    @property
    def simulated(self) -> bool:
        """A client whose budget comes from the run's distribution (simulation)."""
        return self.budget_source == "distribution"


def _node_int(node_config: UserConfig, key: str) -> int:
    if key not in node_config:
        raise ValueError(
            f"node-config is missing '{key}'; start the SuperNode with "
            f"--node-config \"partition-id=<i> num-partitions=<n> epsilon=<eps>\""
        )
    value = node_config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"node-config '{key}' must be an integer; found {value!r}")
    return int(value)


def simulated_budget(settings: RunSettings, partition_id: int, num_partitions: int, reference: str = "") -> float:
    """ε of a simulated client, from the run's ``budget-distribution``.

    ``reference`` (``keys.BUDGET_REFERENCE`` of the message) is PFA's homogeneous references:
    ``"minimum"`` (resp. ``"maximum"``) gives every client the smallest (largest) budget of
    the distribution. ``maximum`` is an oracle that assumes every client accepts the most
    permissive budget; it exists only to bound what heterogeneous methods could reach.
    """
    if settings.budget_distribution == NO_BUDGET:
        return math.inf
    params = settings.budget_params

    def draw(client_id: int) -> float:
        return budget_for(settings.budget_distribution, client_id, num_clients=num_partitions, **params)

    if reference in BUDGET_REFERENCES:  # the reference needs every budget: O(N), these two only
        everyone = [draw(i) for i in range(num_partitions)]
        return float((min, max)[BUDGET_REFERENCES.index(reference)](everyone))
    if reference:
        raise ValueError(f"'{BUDGET_REFERENCE}' must be one of {', '.join(BUDGET_REFERENCES)}; found {reference!r}")
    return float(draw(partition_id))  # O(1): only this client's own draw (each client's is its own stream)


def deployed() -> bool:
    """Whether this ClientApp runs under a SuperNode (a deployment), not in a simulation.

    Flower 1.39 runs a deployed ClientApp in its own ``flwr-clientapp`` process (subprocess
    or process isolation; Flower's own exit handling tests the same), while simulations run
    it inside the simulation process or a Ray worker. The server cannot change this.
    """
    return sys.argv[0].endswith("flwr-clientapp")


def resolve_profile(node_config: UserConfig, run_config: UserConfig, reference: str = "") -> ClientProfile:
    """Build the client's profile from its node config and the run config.

    ``reference`` is the message's ``keys.BUDGET_REFERENCE`` (simulation only, see
    :func:`simulated_budget`).

    Raises
    ------
    ValueError
        If the node config lacks the partition keys or declares an invalid budget.
    """
    partition_id = _node_int(node_config, NODE_PARTITION_ID)
    num_partitions = _node_int(node_config, NODE_NUM_PARTITIONS)
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"node-config 'partition-id' must be in [0, {num_partitions}); found {partition_id}"
        )
    settings = RunSettings.of(run_config)
    if NODE_EPSILON in node_config:
        epsilon = _node_float(node_config, NODE_EPSILON)
        source = "node-config"
    elif deployed():
        if settings.budget_distribution != NO_BUDGET:
            raise ValueError(
                f"node-config declares no '{NODE_EPSILON}': a deployed site's privacy budget comes only from "
                f"the site; start the SuperNode with --node-config \"... {NODE_EPSILON}=<eps> {NODE_DELTA}=<delta>\" "
                f"(without one, this site takes part in non-private runs only)"
            )
        epsilon, source = math.inf, "none-declared"
    else:
        epsilon = simulated_budget(settings, partition_id, num_partitions, reference)
        source = "distribution"
    simulated = source == "distribution"
    # δ is part of the guarantee: a site's own (its node config, else DEFAULT_DELTA), never the server's
    delta = _node_float(node_config, NODE_DELTA) if NODE_DELTA in node_config else (
        settings.delta if simulated else DEFAULT_DELTA)
    if not (epsilon > 0):  # also rejects NaN
        raise ValueError(f"node-config 'epsilon' must be > 0 (or inf); found {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"node-config 'delta' must be in (0, 1); found {delta}")
    # In simulation the run config speaks for every client; in deployment only the node.
    noise = str(node_config.get(NODE_NOISE_SOURCE, settings.noise_source if simulated else "csprng"))
    if noise not in NOISE_SOURCES:
        raise ValueError(f"node-config '{NODE_NOISE_SOURCE}' must be one of {', '.join(NOISE_SOURCES)}; "
                         f"found {noise!r}")
    if noise == "seeded" and not (simulated or _node_flag(node_config, NODE_ALLOW_SEEDED_NOISE)):
        raise ValueError(f"'{NODE_NOISE_SOURCE}=seeded' lets whoever knows the run seed remove this client's "
                         f"noise; a deployed node accepts it only with node-config "
                         f"'{NODE_ALLOW_SEEDED_NOISE}=true'")
    evaluation = _node_flag(node_config, NODE_ALLOW_EVALUATION) or (simulated and settings.client_evaluation == "on")
    train_metrics = _node_flag(node_config, NODE_REPORT_TRAIN_METRICS) or (simulated and settings.report_train_metrics)
    floors = settings.site if simulated else SiteFloors.from_node_config(node_config)
    client_id = str(node_config.get(NODE_CLIENT_ID, partition_id))
    roster, signing_key = _identity(node_config, settings, simulated, client_id)
    ledger = node_config.get(NODE_LEDGER_PATH)
    ledger_dir = settings.ledger_dir if simulated else ""
    if not ledger and ledger_dir:
        ledger = str(Path(ledger_dir) / f"client-{partition_id}.json")
    data_dir = node_config.get(NODE_DATA_DIR)
    shard_cache = node_config.get(NODE_SHARD_CACHE)
    max_examples = _node_int(node_config, NODE_MAX_EXAMPLES) if NODE_MAX_EXAMPLES in node_config else None
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"node-config '{NODE_MAX_EXAMPLES}' must be an integer >= 1; found {max_examples}")
    return ClientProfile(
        client_id=client_id,
        partition_id=partition_id,
        num_partitions=num_partitions,
        epsilon_budget=epsilon,
        delta=delta,
        budget_source=source,
        ledger_path=str(ledger) if ledger else None,
        data_dir=str(data_dir) if data_dir else None,
        shard_cache=str(shard_cache) if shard_cache else None,
        noise_source=noise,
        allow_evaluation=evaluation,
        report_train_metrics=train_metrics,
        max_examples=max_examples,
        floors=floors,
        roster=roster,
        signing_key=signing_key,
    )


def _identity(node_config: UserConfig, settings: RunSettings, simulated: bool,
              client_id: str) -> tuple[str | None, str | None]:
    """The roster and signing key paths, checked: both or neither, and the roster holds this site's key.

    A deployed site's come from its node config alone: a server that could point a client at a roster
    of its choosing could vouch for keys of its own.
    """
    if simulated:
        if not settings.roster:
            return None, None
        roster, key = settings.roster, str(simulated_key_path(settings.roster, client_id))
    else:
        given_roster, given_key = node_config.get(NODE_ROSTER), node_config.get(NODE_SIGNING_KEY)
        if not given_roster and not given_key:
            return None, None
        if not (given_roster and given_key):
            raise ValueError(f"node-config needs both '{NODE_ROSTER}' and '{NODE_SIGNING_KEY}' (files the operator "
                             "generated with `privet roster generate`), or neither")
        roster, key = str(given_roster), str(given_key)
    if not load_roster(str(roster)).holds(client_id, load_signing_key(str(key))):
        raise ValueError(f"the roster {roster!r} does not hold this site's signing key under client-id "
                         f"{client_id!r}: check 'client-id', '{NODE_ROSTER}' and '{NODE_SIGNING_KEY}'")
    return str(roster), str(key)


@functools.lru_cache(maxsize=64)
def _roster(path: str, mtime: float) -> Roster:
    return Roster.load(path)


def load_roster(path: str) -> Roster:
    """The roster file (read again when it changes); ValueError naming the file."""
    return _mtime_cached(_roster, path, "roster")


@functools.lru_cache(maxsize=64)
def _signing_key(path: str, mtime: float) -> SigningKey:
    return SigningKey.load(path)


def load_signing_key(path: str) -> SigningKey:
    """The signing key file (read again when it changes); ValueError naming the file."""
    return _mtime_cached(_signing_key, path, "signing key")


def _mtime_cached(load: Callable[[str, float], _T], path: str, what: str) -> _T:
    """``load(path, mtime)``: a cached loader keyed by the file's modification time."""
    try:
        return load(path, os.stat(path).st_mtime)
    except OSError as exc:
        raise ValueError(f"{what} {path!r} cannot be read: {exc}") from None


def _node_float(node_config: UserConfig, key: str) -> float:
    try:
        return float(node_config[key])
    except (TypeError, ValueError):
        raise ValueError(f"node-config '{key}' must be a number (e.g. {key}=2.5); "
                         f"found {node_config[key]!r}") from None


def _node_flag(node_config: UserConfig, key: str) -> bool:
    """A boolean node-config key: true/false (Flower parses ``key=true`` to a bool)."""
    value = node_config.get(key, False)
    if isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"node-config '{key}' must be true or false; found {value!r}")
        return value.lower() == "true"
    return bool(value)
