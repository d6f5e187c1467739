"""Who this client is and what privacy budget it holds.

A budget belongs to the client, not to the server. In a deployment it comes from the
SuperNode's ``--node-config`` (``epsilon=1.5 delta=1e-5``); in simulation, where Flower
only sets ``partition-id``/``num-partitions``, it is drawn from the run config's named
distribution, evaluated deterministically per partition id so that every process computes
the same value without coordination.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from privacy.budgets import budgets_for

UserConfig = Mapping[str, bool | int | float | str]

#: Node-config keys a SuperNode operator may set (``--node-config "k=v ..."``).
NODE_PARTITION_ID = "partition-id"
NODE_NUM_PARTITIONS = "num-partitions"
NODE_CLIENT_ID = "client-id"
NODE_EPSILON = "epsilon"
NODE_DELTA = "delta"
NODE_LEDGER_PATH = "ledger-path"
NODE_DATA_DIR = "data-dir"
NODE_SHARD_CACHE = "shard-cache"

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


def simulated_budget(run_config: UserConfig, partition_id: int, num_partitions: int) -> float:
    """ε of a simulated client, from the run config's ``budget-distribution``.

    The strategies ``minimum`` and ``maximum`` are PFA's homogeneous references: every
    client holds the smallest (resp. largest) budget of the distribution. ``maximum`` is an
    oracle that assumes every client accepts the most permissive budget; it exists only
    to bound what heterogeneous methods could reach.
    """
    distribution = str(run_config["budget-distribution"])
    if distribution == NO_BUDGET:
        return math.inf
    all_budgets = budgets_for(
        distribution,
        num_partitions,
        seed=int(run_config["seed"]),
        epsilon=float(run_config["epsilon"]),
        epsilon_min=float(run_config["epsilon-min"]),
        epsilon_max=float(run_config["epsilon-max"]),
    )
    strategy = str(run_config.get("strategy", ""))
    if strategy == "minimum":
        return float(min(all_budgets))
    if strategy == "maximum":
        return float(max(all_budgets))
    return float(all_budgets[partition_id])


def resolve_profile(node_config: UserConfig, run_config: UserConfig) -> ClientProfile:
    """Build the client's profile from its node config and the run config.

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
    if NODE_EPSILON in node_config:
        epsilon = float(node_config[NODE_EPSILON])
        source = "node-config"
    else:
        epsilon = simulated_budget(run_config, partition_id, num_partitions)
        source = "distribution"
    delta = float(node_config.get(NODE_DELTA, run_config.get("delta", 1e-5)))
    if not (epsilon > 0):  # also rejects NaN
        raise ValueError(f"node-config 'epsilon' must be > 0 (or inf); found {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"node-config 'delta' must be in (0, 1); found {delta}")
    ledger = node_config.get(NODE_LEDGER_PATH)
    data_dir = node_config.get(NODE_DATA_DIR)
    shard_cache = node_config.get(NODE_SHARD_CACHE)
    return ClientProfile(
        client_id=str(node_config.get(NODE_CLIENT_ID, partition_id)),
        partition_id=partition_id,
        num_partitions=num_partitions,
        epsilon_budget=epsilon,
        delta=delta,
        budget_source=source,
        ledger_path=str(ledger) if ledger else None,
        data_dir=str(data_dir) if data_dir else None,
        shard_cache=str(shard_cache) if shard_cache else None,
    )
