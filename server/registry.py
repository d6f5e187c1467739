"""From a validated ``RunConfig`` to a strategy and the train config its clients get."""

from __future__ import annotations

from typing import Callable

from flwr.app import ConfigRecord

from server.config import RunConfig
from protocol import keys
from strategies.base import PrivacyAwareFedAvg
from strategies.baselines import FedAvgHDP, MaximumBudget, MinimumBudget, UDPFedAvg
from strategies.dpfedc import DPFedC, strategy_params as dpfedc_params
from strategies.fedceo import FedCEO
from strategies.gdpfed import GDPFED_STRATEGIES
from strategies.pfa import PFA, PFAPlus, WeiAvg
from strategies.personalized import CENTAUR, PPSGD

StrategyFactory = Callable[..., PrivacyAwareFedAvg]

#: name -> strategy class. Paper strategies register here too.
STRATEGY_CLASSES: dict[str, StrategyFactory] = {
    "fedavg": FedAvgHDP,
    "udp-fedavg": UDPFedAvg,
    "fedavg-hdp": FedAvgHDP,
    "minimum": MinimumBudget,
    "maximum": MaximumBudget,
    "weiavg": WeiAvg,
    "pfa": PFA,
    "pfa-plus": PFAPlus,
    "fedceo": FedCEO,
    "ppsgd": PPSGD,
    "centaur": CENTAUR,
    **GDPFED_STRATEGIES,  # dp-fedavg, gdpfed, gdpfed-op, gdpfed-plus, idp-fedavg-*, pfa-groups
    "dpfedc": DPFedC,
}

#: name -> the strategy's own keyword arguments, from its run-config section.
STRATEGY_PARAMS: dict[str, Callable[[RunConfig], dict]] = {
    "pfa": lambda cfg: {"params": cfg.pfa},
    "pfa-plus": lambda cfg: {"params": cfg.pfa},
    "fedceo": lambda cfg: {"params": cfg.fedceo},
    **{name: (lambda cfg: {"params": cfg.gdpfed}) for name in GDPFED_STRATEGIES},
    "dpfedc": dpfedc_params,
}


def build_strategy(cfg: RunConfig) -> PrivacyAwareFedAvg:
    """The configured strategy, with the shared sampling and privacy settings."""
    factory = STRATEGY_CLASSES[cfg.strategy]
    min_train = min(cfg.min_train_clients, cfg.num_clients)
    return factory(
        dp_mode=cfg.resolved_dp_mode,
        noise_shares=cfg.noise_shares,
        accountant=cfg.accountant,
        seed=cfg.seed,
        fraction_train=cfg.fraction_train,
        min_train_nodes=min_train,
        min_available_nodes=max(min_train, 1),
        min_accepted=min(cfg.min_accepted_clients, cfg.num_clients),
        max_examples=cfg.max_examples_per_client,
        handshake_timeout=cfg.round_timeout,
        message_ttl=cfg.round_timeout,
        secure_aggregation=cfg.secagg if cfg.secure_aggregation != "none" else None,
        **STRATEGY_PARAMS.get(cfg.strategy, lambda _: {})(cfg),
    )


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
