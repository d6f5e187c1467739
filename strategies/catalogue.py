"""Every strategy privet offers, once: name → class, parameters, default DP mode, one line.

Config validation reads the allowed names, what ``dp-mode = "auto"`` means and which
strategies compose with secure aggregation (:mod:`server.config`); construction reads the
class and its run-config section (:mod:`server.registry`); ``privet run --help`` prints the
lines. Classes are named ``"module:Class"`` (as Flower names its components) and imported
only when a run builds one, so validating a config or printing help imports no model code.
A new method is one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Final

from protocol import keys


@dataclass(frozen=True)
class StrategyEntry:
    """One registered strategy.

    Attributes
    ----------
    target : str
        ``"module:Class"`` of the Flower strategy (a :class:`~strategies.base.PrivacyAwareFedAvg`).
    dp_mode : str
        The DP mode its clients run when ``dp-mode = "auto"`` (:mod:`privacy.dp_modes`).
    section : str or None
        The run-config section holding its own parameters (``[tool.flwr.app.config.<section>]``),
        passed to the class as ``params``; ``None``: it has none.
    summary : str
        One line for the CLI's help.
    params : str or None
        ``"module:function"`` building the class's own keyword arguments from the validated
        run config where they are more than its section (DP-FedC).
    sums_only : bool
        Its aggregation needs only sums of the clients' updates, so it composes with secure
        aggregation (``secure-aggregation = "secagg+"``).
    takes_local_steps : bool
        Its clients' local work can be τ = ``local-steps`` mini-batch steps; False where it is
        set otherwise (personalization's passes, DP-FedC's own Q₁/Q₂ steps).
    """

    target: str
    dp_mode: str
    section: str | None
    summary: str
    params: str | None = None
    sums_only: bool = False
    takes_local_steps: bool = True

    @property
    def cls(self) -> Any:
        """The strategy class (imported now)."""
        return _load(self.target)

    def kwargs(self, cfg: Any) -> dict[str, Any]:
        """The class's own keyword arguments from a validated run config."""
        if self.params is not None:
            built: dict[str, Any] = _load(self.params)(cfg)
            return built
        return {} if self.section is None else {"params": getattr(cfg, self.section)}


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _gdpfed(cls: str, summary: str) -> StrategyEntry:
    return StrategyEntry(f"strategies.gdpfed:{cls}", keys.DP_UPDATE, "gdpfed", summary, sums_only=True)


#: name -> entry, in the order the CLI lists them.
CATALOGUE: Final[dict[str, StrategyEntry]] = {
    "fedavg-hdp": StrategyEntry("strategies.baselines:FedAvgHDP", keys.DP_SGD, None,
                                "FedAvg over heterogeneous DP-SGD clients (the default)"),
    "fedavg": StrategyEntry("strategies.baselines:FedAvgHDP", keys.DP_NONE, None, "FedAvg without privacy",
                            sums_only=True),
    "udp-fedavg": StrategyEntry("strategies.baselines:UDPFedAvg", keys.DP_UPDATE, None,
                                "FedAvg over clipped, noised client updates", sums_only=True),
    "minimum": StrategyEntry("strategies.baselines:MinimumBudget", keys.DP_SGD, None,
                             "PFA's reference: everyone at the smallest budget"),
    "maximum": StrategyEntry("strategies.baselines:MaximumBudget", keys.DP_SGD, None,
                             "PFA's oracle: everyone at the largest budget"),
    "weiavg": StrategyEntry("strategies.pfa:WeiAvg", keys.DP_SGD, None, "WeiAvg: FedAvg weighted by the budgets"),
    "pfa": StrategyEntry("strategies.pfa:PFA", keys.DP_SGD, "pfa",
                         "PFA: private updates projected on the public clients' subspace"),
    "pfa-plus": StrategyEntry("strategies.pfa:PFAPlus", keys.DP_SGD, "pfa", "PFA+: PFA with k-coordinate uploads"),
    "fedceo": StrategyEntry("strategies.fedceo:FedCEO", keys.DP_UPDATE, "fedceo",
                            "FedCEO: tensor low-rank smoothing of the clients' models"),
    "ppsgd": StrategyEntry("strategies.personalized:PPSGD", keys.DP_UPDATE, None,
                           "PPSGD: a shared and a personal model per client", takes_local_steps=False),
    "centaur": StrategyEntry("strategies.personalized:CENTAUR", keys.DP_UPDATE, None,
                             "CENTAUR: shared body, personal head", takes_local_steps=False),
    "dp-fedavg": _gdpfed("DPFedAvg", "GDPFed's DP-FedAvg: one group at the strictest budget, plain mean"),
    "gdpfed": _gdpfed("GDPFed", "GDPFed: budget groups, per-group sigma_m, reweighted group sums"),
    "gdpfed-op": _gdpfed("GDPFedOp", "GDPFed with the optimal per-group sampling rates (Problem 1)"),
    "gdpfed-plus": _gdpfed("GDPFedPlus", "GDPFed+: optimal sampling and top-k sparsified group sums"),
    "idp-fedavg-scale": _gdpfed("IDPFedAvgScale", "IDP-FedAvg (Scale): per-group clip, one common noise std"),
    "idp-fedavg-sample": _gdpfed("IDPFedAvgSample", "IDP-FedAvg (Sample): per-group sampling, one common sigma"),
    "pfa-groups": _gdpfed("PFAGroups", "PFA on GDPFed's budget groups (group sums only)"),
    "dpfedc": StrategyEntry("strategies.dpfedc:DPFedC", keys.DP_UPDATE, "dpfedc",
                            "DP-FedC: private federated clustering", params="strategies.dpfedc:strategy_params",
                            takes_local_steps=False),
}

#: the strategies that compose with secure aggregation
SUM_ONLY_STRATEGIES: Final = tuple(name for name, entry in CATALOGUE.items() if entry.sums_only)

#: the GDPFed family (paper 003), whose config section is ``gdpfed``
GDPFED_FAMILY: Final = tuple(name for name, entry in CATALOGUE.items() if entry.section == "gdpfed")


def catalogue_help() -> str:
    """The strategies as the CLI's help lists them: ``name  one line (dp-mode …)``."""
    width = max(map(len, CATALOGUE))
    return "\n".join(f"  {name:<{width}}  {entry.summary} (dp-mode {entry.dp_mode})"
                     for name, entry in CATALOGUE.items())
