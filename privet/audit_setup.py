"""The audited client's setup: a run configuration turned into what one client's round would run.

``privet audit`` (:mod:`privet.audit_cmd`) audits the client mechanisms of a run config through
the objects the ClientApp itself uses (:mod:`client.round`). This module builds them, once per
audit, from the validated run config (:func:`setup`):

- the run's :class:`server.config.RunConfig` and its strategy (:func:`server.registry.build_strategy`);
- the audited client's :class:`client.profile.ClientProfile` (its budget ε, δ, noise source, floors);
- the round's :class:`protocol.train_config.TrainConfig` (:func:`server.registry.train_config`;
  GDPFed's per-node one from the strategy's own plan and ``node_config``, :func:`group_config`);
- r_min where the strategy's rounds run inside secure sums.

and hands the games (:mod:`privet.audit_games`) the per-round pieces: a fresh ledger of the
client's budget (:func:`fresh_ledger`), the client's noise source (:func:`client_noise`), what
a server that knows the run seed regenerates (:func:`server_replay`), the round's mechanism
(:func:`round_mechanism`, where a test-only hook may wrap it) and the client's shard size
(:func:`num_examples`). σ is never recomputed here: the mechanism's plan against the ledger is
privet's own calibration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from privacy.ledger import PrivacyLedger
from privacy.mechanisms import Mechanism
from privacy.randomness import NoiseSource, noise_source

__all__ = ["RUN_ID", "AuditConfigError", "AuditSetup", "MechanismHook", "client_noise", "fresh_ledger",
           "group_config", "mechanism_kind", "num_examples", "round_mechanism", "server_replay", "setup"]

#: The run id of the audit's ledgers.
RUN_ID: Final = 1

#: A test-only hook: wraps the mechanism each client round would run (None in every real use).
MechanismHook = Callable[[Mechanism], Mechanism]


class AuditConfigError(ValueError):
    """The configuration cannot be audited (one line naming the key)."""


@dataclass(frozen=True)
class AuditSetup:
    """What the audited client's rounds run, from one run config.

    Attributes
    ----------
    run_config : dict
        The validated run config (defaults < CONFIG < ``--set``).
    cfg : server.config.RunConfig
        Its parsed form.
    strategy : strategies.base.PrivacyAwareFedAvg
        The strategy the run would use (GDPFed's with its group plan made).
    profile : client.profile.ClientProfile
        The audited client's profile (budget, δ, noise source, floors).
    train : protocol.train_config.TrainConfig
        The audited client's train config (GDPFed: its group's).
    secure_floor : int or None
        r_min where uploads leave only inside a secure sum; None where the server sees each upload.
    group : bool
        A GDPFed-family strategy (group sums).
    """

    run_config: dict[str, Any]
    cfg: Any  # server.config.RunConfig
    strategy: Any  # strategies.base.PrivacyAwareFedAvg
    profile: Any  # client.profile.ClientProfile
    train: Any  # protocol.train_config.TrainConfig of the audited client
    secure_floor: int | None
    group: bool


def setup(run_config: dict[str, Any], client: int) -> AuditSetup:
    """The setup of client ``client`` (its partition id) under ``run_config``.

    Raises
    ------
    AuditConfigError
        A setting the run would refuse (one line naming it), or a client outside the run.
    """
    from client.profile import resolve_profile
    from protocol.train_config import TrainConfig
    from server.config import ConfigError, RunConfig
    from server.registry import build_strategy, train_config
    from strategies.gdpfed import GDPFedStrategy

    try:
        cfg = RunConfig.from_flower(run_config)
    except ConfigError as exc:
        raise AuditConfigError(str(exc)) from None
    if not 0 <= client < cfg.num_clients:
        raise AuditConfigError(f"--client must be in [0, {cfg.num_clients}) ('num-clients'); found {client}")
    config = {k: v for k, v in run_config.items() if k != "roster"}  # the audit runs no secure-sum protocol
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)  # Flower's notes on evaluation settings are not the audit's
    try:
        strategy = build_strategy(RunConfig.from_flower(config))
        profile = resolve_profile({"partition-id": client, "num-partitions": cfg.num_clients}, run_config)
    except ValueError as exc:  # a strategy's or a budget's setting, named in the message
        raise AuditConfigError(str(exc)) from None
    finally:
        flwr_log.setLevel(level)
    record = train_config(cfg)
    group = isinstance(strategy, GDPFedStrategy)
    if group:
        record = group_config(strategy, cfg, run_config, client, record)
    train = TrainConfig.decode(record)
    secure = strategy.secure_aggregation is not None  # the strategy's rounds run inside secure sums
    floor = max(strategy.secure_min_survivors(train.noise_shares), profile.floors.min_sum_size) if secure else None
    return AuditSetup(run_config, cfg, strategy, profile, train, floor, group)


def group_config(strategy: Any, cfg: Any, run_config: dict[str, Any], client: int, record: Any) -> Any:
    """GDPFed's per-node train config of ``client``: the strategy's own plan and ``node_config``."""
    from types import SimpleNamespace

    from client.profile import resolve_profile
    from protocol.train_config import TrainConfig
    from strategies.gdpfed import plan_groups

    budgets = []
    for pid in range(cfg.num_clients):
        p = resolve_profile({"partition-id": pid, "num-partitions": cfg.num_clients}, run_config)
        budgets.append((p.epsilon_budget, p.delta))
    base = TrainConfig.decode(record)
    try:
        plan, assign = plan_groups(strategy.variant, strategy.params, budgets, base.num_rounds, base.clip,
                                   lr=base.learning_rate, local_steps=base.local_steps or base.local_epochs,
                                   accountant=strategy.accountant)
    except ValueError as exc:
        raise AuditConfigError(str(exc)) from None
    strategy.plan = plan
    strategy.group_of = {pid: m for pid, m in enumerate(assign)}
    return strategy.node_config(1, SimpleNamespace(node_id=client), record)


def mechanism_kind(setup: AuditSetup) -> str:
    """The :attr:`~privacy.mechanisms.Mechanism.kind` of the mechanism the audited client's rounds run.

    DP-FedC's centroid release and the distributed discrete Gaussian secure sum need a round's own
    inputs (the clustering section, the sum's parameters) to be built; their kinds are named
    from the config. Every other mechanism is built as the round builds it, for a shard of one.
    """
    from privacy.mechanisms import CentroidRelease, GroupDiscreteGaussianShare, SecureDiscreteGaussianShare
    from strategies.dpfedc import DPFedC

    if isinstance(setup.strategy, DPFedC):
        return CentroidRelease.kind
    if setup.cfg.secure_aggregation == "secagg+ddg":  # GDPFed's group sums, or one sum of every member
        return GroupDiscreteGaussianShare.kind if setup.train.group_round else SecureDiscreteGaussianShare.kind
    probe = setup.train.mechanism(num_examples=1, delta=setup.profile.delta, secure_floor=setup.secure_floor)
    return str(probe.kind)


def fresh_ledger(setup: AuditSetup) -> PrivacyLedger:
    """The client's ledger at the start of the run (fresh: the audit ignores ``ledger-dir``)."""
    return PrivacyLedger(setup.profile.epsilon_budget, setup.profile.delta, accountant=setup.train.accountant)


def client_noise(setup: AuditSetup, partition_id: int, server_round: int) -> NoiseSource:
    """The DP noise source of client ``partition_id`` in ``server_round`` (:func:`client.seeds.noise_for`)."""
    from client.seeds import client_seed, noise_for

    profile = replace(setup.profile, partition_id=partition_id, client_id=str(partition_id))
    return noise_for(profile, client_seed(setup.train.seed, partition_id, server_round))


def server_replay(setup: AuditSetup, partition_id: int, server_round: int) -> NoiseSource:
    """What a server that knows the run seed regenerates as ``partition_id``'s noise of ``server_round``."""
    from client.seeds import client_seed

    return noise_source("seeded", client_seed(setup.train.seed, partition_id, server_round))


def round_mechanism(setup: AuditSetup, num_examples: int, hook: MechanismHook | None) -> Mechanism:
    """The mechanism of one client round (:meth:`TrainConfig.mechanism`), wrapped by ``hook`` (tests only)."""
    mechanism = setup.train.mechanism(num_examples=num_examples, delta=setup.profile.delta,
                                      secure_floor=setup.secure_floor)
    return hook(mechanism) if hook is not None else mechanism


def num_examples(setup: AuditSetup) -> int:
    """The audited client's shard size n (:func:`client.model_task.count_local_examples`)."""
    from client.model_task import count_local_examples
    from protocol.run_settings import RunSettings

    return int(count_local_examples(setup.profile, RunSettings.of(setup.run_config)))
