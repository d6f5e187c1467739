"""From a validated ``RunConfig`` to a strategy and the train config its clients get."""

from __future__ import annotations


from flwr.app import ConfigRecord

from server.config import RunConfig
from protocol import keys
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
        secure_aggregation=cfg.secagg if cfg.secure_aggregation != "none" else None,
        **entry.kwargs(cfg),
    )
    return strategy


def train_config(cfg: RunConfig) -> ConfigRecord:
    """The ConfigRecord every sampled client receives (strategies may add per-node keys)."""
    record = ConfigRecord(
        {
            keys.NUM_ROUNDS: cfg.num_server_rounds,
            keys.DP_MODE: cfg.resolved_dp_mode,
            keys.CLIP: cfg.clip,
            keys.NOISE_MULTIPLIER: cfg.noise_multiplier,
            keys.NOISE_SHARES: cfg.noise_shares,
            keys.LOCAL_EPOCHS: cfg.local_epochs,
            keys.BATCH_SIZE: cfg.batch_size,
            keys.LEARNING_RATE: cfg.learning_rate,
            keys.MOMENTUM: cfg.momentum,
            keys.GRAD_SAMPLE_MODE: cfg.grad_sample_mode,
            keys.ACCOUNTANT: cfg.accountant,
            keys.SEED: cfg.seed,
        }
    )
    if cfg.run_epsilon > 0:  # spend at most this much of each client's budget in this run
        record[keys.TARGET_EPSILON] = cfg.run_epsilon
    return record
