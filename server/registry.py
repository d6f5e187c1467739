"""From a validated ``RunConfig`` to a strategy and the train config its clients get."""

from __future__ import annotations

from flwr.app import ConfigRecord

from protocol.roster import Roster
from protocol.train_config import TrainConfig
from server.config import RunConfig
from strategies.base import PrivacyAwareFedAvg
from strategies.catalogue import CATALOGUE


def build_strategy(cfg: RunConfig) -> PrivacyAwareFedAvg:
    """The configured strategy, with the shared sampling and privacy settings."""
    entry = CATALOGUE[cfg.strategy]
    min_train = min(cfg.min_train_clients, cfg.num_clients)
    strategy: PrivacyAwareFedAvg = entry.cls(
        dp_mode=cfg.resolved_dp_mode,
        noise_shares=cfg.noise_shares,
        accountant=cfg.accountant,
        seed=cfg.seed,
        fraction_train=cfg.fraction_train,
        min_train_nodes=min_train,
        min_available_nodes=max(min_train, 1),
        min_accepted=min(cfg.min_accepted_clients, cfg.num_clients),
        max_examples=cfg.max_examples_per_client,
        max_epsilon_ratio=cfg.max_epsilon_ratio,
        handshake_timeout=cfg.round_timeout,
        message_ttl=cfg.round_timeout,
        secure_aggregation=cfg.secagg.for_mode(cfg.secure_aggregation) if cfg.secure_aggregation != "none" else None,
        roster=Roster.load(cfg.roster) if cfg.roster else None,
        **entry.kwargs(cfg),
    )
    return strategy


def train_config(cfg: RunConfig) -> ConfigRecord:
    """The ConfigRecord every sampled client receives (strategies may add per-node keys)."""
    return TrainConfig(
        num_rounds=cfg.num_server_rounds,
        dp_mode=cfg.resolved_dp_mode,
        clip=cfg.clip,
        noise_multiplier=cfg.noise_multiplier,
        noise_shares=cfg.noise_shares,
        local_epochs=cfg.local_epochs,
        local_steps=cfg.local_steps,
        calibration=cfg.calibration,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        momentum=cfg.momentum,
        grad_sample_mode=cfg.grad_sample_mode,
        accountant=cfg.accountant,
        seed=cfg.seed,
        target_epsilon=cfg.run_epsilon,  # spend at most this much of each client's budget in this run
    ).encode()
