"""privet's public API: the strategies, the ClientApp and the train config, for your own Flower app.

::

    import privet

    strategy = privet.strategy("gdpfed-plus", fraction_train=0.02)   # any name `privet run --help` lists
    strategy = privet.FedAvgHDP(min_train_nodes=2, seed=0)            # or a class, Flower-style options
    arrays = privet.initial_arrays("cnn", input_shape=(1, 28, 28), num_classes=10, seed=0)
    config = privet.TrainConfig(num_rounds=3, dp_mode="dpsgd", local_epochs=1, batch_size=64,
                                learning_rate=0.05).encode()          # what privet's ClientApp reads
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3, train_config=config)
    report = privet.audit("experiment.toml", ["dp-mode=update"])   # empirical eps beside the charge

and ``clientapp = "privet:client_app"`` in your app's ``[tool.flwr.app.components]``. Every strategy
brings the budget handshake, budget-aware sampling, reply verification and each client's ε
bookkeeping (``strategy.accounts``); privet's ClientApp trains within each node's own budget and
refuses what would exceed it. Names load on first use, so ``import privet`` costs nothing.

This package is also the composition root: the ``privet`` CLI (:mod:`privet.cli`), the in-process
Grid of the fast tests and quick runs (:mod:`privet.inprocess`) and one-process simulations
(:mod:`privet.dpfedc_simulation`) import both sides; ``server/`` and ``client/`` import neither each
other nor this package.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CENTAUR", "DPFedAvg", "DPFedC", "FedAvgHDP", "FedCEO", "GDPFed", "GDPFedOp", "GDPFedPlus",
           "IDPFedAvgSample", "IDPFedAvgScale", "MaximumBudget", "MinimumBudget", "PFA", "PFAGroups", "PFAPlus",
           "PPSGD", "PrivacyAwareFedAvg", "PrivacyLedger", "Roster", "TrainConfig", "UDPFedAvg", "WeiAvg",
           "audit", "client_app", "initial_arrays", "strategy"]

#: public name -> (module, attribute), imported on first use
_LAZY = {
    "PrivacyAwareFedAvg": ("strategies.base", "PrivacyAwareFedAvg"),
    "FedAvgHDP": ("strategies.baselines", "FedAvgHDP"),
    "UDPFedAvg": ("strategies.baselines", "UDPFedAvg"),
    "MinimumBudget": ("strategies.baselines", "MinimumBudget"),
    "MaximumBudget": ("strategies.baselines", "MaximumBudget"),
    "WeiAvg": ("strategies.pfa", "WeiAvg"),
    "PFA": ("strategies.pfa", "PFA"),
    "PFAPlus": ("strategies.pfa", "PFAPlus"),
    "FedCEO": ("strategies.fedceo", "FedCEO"),
    "PPSGD": ("strategies.personalized", "PPSGD"),
    "CENTAUR": ("strategies.personalized", "CENTAUR"),
    "DPFedAvg": ("strategies.gdpfed", "DPFedAvg"),
    "GDPFed": ("strategies.gdpfed", "GDPFed"),
    "GDPFedOp": ("strategies.gdpfed", "GDPFedOp"),
    "GDPFedPlus": ("strategies.gdpfed", "GDPFedPlus"),
    "IDPFedAvgScale": ("strategies.gdpfed", "IDPFedAvgScale"),
    "IDPFedAvgSample": ("strategies.gdpfed", "IDPFedAvgSample"),
    "PFAGroups": ("strategies.gdpfed", "PFAGroups"),
    "DPFedC": ("strategies.dpfedc", "DPFedC"),
    "TrainConfig": ("protocol.train_config", "TrainConfig"),
    "PrivacyLedger": ("privacy.ledger", "PrivacyLedger"),
    "Roster": ("protocol.roster", "Roster"),
    "client_app": ("client.app", "app"),
    "audit": ("privet.audit_cmd", "audit"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'privet' has no attribute {name!r}")


def strategy(name: str, **options: Any) -> Any:
    """The strategy ``name`` (a catalogue entry: ``privet run --help`` lists them), ready to ``start``.

    ``options`` are the strategy's keyword arguments (:class:`strategies.base.StrategyOptions`, and
    ``params=`` for a method's own section); ``dp_mode`` defaults to the method's own mode.

    Raises
    ------
    ValueError
        For an unknown name, naming the allowed ones.
    """
    from strategies.catalogue import CATALOGUE

    if name not in CATALOGUE:
        raise ValueError(f"unknown strategy {name!r}; one of {', '.join(CATALOGUE)}")
    entry = CATALOGUE[name]
    return entry.cls(**{"dp_mode": entry.dp_mode, **options})


def initial_arrays(model: str, *, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> Any:
    """The initial weights of privet's ``model`` (``privet run --help`` lists them) as Flower's ``ArrayRecord``.

    The names are the model's ``state_dict`` names, the ones privet's ClientApp loads; the same
    ``seed`` gives the same weights.
    """
    import numpy as np
    from flwr.app import Array, ArrayRecord

    from tasks.models import build_model, get_weights, weight_names

    net = build_model(model, input_shape=input_shape, num_classes=num_classes, seed=seed)
    return ArrayRecord({n: Array(np.asarray(w)) for n, w in zip(weight_names(net), get_weights(net), strict=True)})
