"""Every strategy privet offers, once: name → class, section, cross-checks, default DP mode, task, one line.

Config validation reads the allowed names, what ``dp-mode = "auto"`` means, which strategies
compose with secure aggregation and each method's own cross-checks (:mod:`server.config`);
construction reads the class and its run-config section (:mod:`server.registry`); the server body
reads the task (:mod:`server.evaluation`); ``privet run --help`` prints the lines. Each class is
imported by a small loader only when a run builds one, so validating a config or printing help
imports neither Flower nor torch; the loaders are typed, so mypy and the architecture test see
every class. A new method is one loader and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from protocol import keys

if TYPE_CHECKING:
    from strategies.base import PrivacyAwareFedAvg

StrategyClass = type["PrivacyAwareFedAvg"]


@dataclass(frozen=True)
class StrategyEntry:
    """One registered strategy.

    Attributes
    ----------
    load : callable
        Imports and returns the strategy class (a :class:`~strategies.base.PrivacyAwareFedAvg`).
    dp_mode : str
        What its clients run when ``dp-mode = "auto"``.
    section : str or None
        The run-config section holding its own parameters (``[tool.flwr.app.config.<section>]``),
        passed to the class as ``params``; None: it has none.
    summary : str
        One line for the CLI's help.
    params : callable or None
        Builds the class's own keyword arguments from the validated run config where they are more
        than its section (DP-FedC).
    check : callable or None
        The method's cross-checks on the validated run config (ValueError naming the key).
    sums_only : bool
        Its aggregation needs only sums of the clients' updates, so it composes with secure
        aggregation; ``group_sums``: those sums are GDPFed's groups, each with its own σ_m.
    takes_local_steps : bool
        Its clients' local work can be τ = ``local-steps`` mini-batch steps.
    task : str
        What the global "model" is: ``"model"`` or ``"clustering"`` (DP-FedC's centroids).
    calibrates_without_budget : callable
        Whether, for this config, its clients' noise comes from the method's own rule rather
        than from a budget (DP-FedC's paper calibration).
    """

    load: Callable[[], StrategyClass]
    dp_mode: str
    section: str | None
    summary: str
    params: Callable[[Any], dict[str, Any]] | None = None
    check: Callable[[Any], None] | None = None
    sums_only: bool = False
    group_sums: bool = False
    takes_local_steps: bool = True
    task: str = keys.TASK_MODEL
    calibrates_without_budget: Callable[[Any], bool] = lambda cfg: False

    @property
    def cls(self) -> StrategyClass:
        """The strategy class (imported now)."""
        return self.load()

    def kwargs(self, cfg: Any) -> dict[str, Any]:
        """The class's own keyword arguments from a validated run config."""
        if self.params is not None:
            return self.params(cfg)
        return {} if self.section is None else {"params": getattr(cfg, self.section)}


# ---------------------------------------------------------------- loaders
def _fedavg_hdp() -> StrategyClass:
    from strategies.baselines import FedAvgHDP
    return FedAvgHDP


def _udp_fedavg() -> StrategyClass:
    from strategies.baselines import UDPFedAvg
    return UDPFedAvg


def _minimum() -> StrategyClass:
    from strategies.baselines import MinimumBudget
    return MinimumBudget


def _maximum() -> StrategyClass:
    from strategies.baselines import MaximumBudget
    return MaximumBudget


def _weiavg() -> StrategyClass:
    from strategies.pfa import WeiAvg
    return WeiAvg


def _pfa() -> StrategyClass:
    from strategies.pfa import PFA
    return PFA


def _pfa_plus() -> StrategyClass:
    from strategies.pfa import PFAPlus
    return PFAPlus


def _fedceo() -> StrategyClass:
    from strategies.fedceo import FedCEO
    return FedCEO


def _ppsgd() -> StrategyClass:
    from strategies.personalized import PPSGD
    return PPSGD


def _centaur() -> StrategyClass:
    from strategies.personalized import CENTAUR
    return CENTAUR


def _dpfedc() -> StrategyClass:
    from strategies.dpfedc import DPFedC
    return DPFedC


def _dpfedc_params(cfg: Any) -> dict[str, Any]:
    from strategies.dpfedc import strategy_params
    return strategy_params(cfg)


# the methods' cross-checks, imported when a config is validated (the help needs none of them)
def _dpfedc_check(cfg: Any) -> None:
    from strategies.dpfedc_config import check
    check(cfg)


def _dpfedc_nominal(cfg: Any) -> bool:
    from strategies.dpfedc_config import calibrates_without_budget
    return calibrates_without_budget(cfg)


def _gdpfed_check(cfg: Any) -> None:
    from strategies.gdpfed_config import check
    from strategies.gdpfed_plan import check_plan
    check(cfg)
    check_plan(cfg)


def _gdpfed(variant: str, summary: str) -> StrategyEntry:
    def load() -> StrategyClass:
        from strategies.gdpfed import GDPFED_STRATEGIES
        return GDPFED_STRATEGIES[variant]

    return StrategyEntry(load, keys.DP_UPDATE, "gdpfed", summary, check=_gdpfed_check, sums_only=True,
                         group_sums=True)


#: name -> entry, in the order the CLI lists them.
CATALOGUE: Final[dict[str, StrategyEntry]] = {
    "fedavg-hdp": StrategyEntry(_fedavg_hdp, keys.DP_SGD, None, "FedAvg over heterogeneous DP-SGD clients (the default)"),
    "fedavg": StrategyEntry(_fedavg_hdp, keys.DP_NONE, None, "FedAvg without privacy", sums_only=True),
    "udp-fedavg": StrategyEntry(_udp_fedavg, keys.DP_UPDATE, None, "FedAvg over clipped, noised client updates",
                                sums_only=True),
    "minimum": StrategyEntry(_minimum, keys.DP_SGD, None, "PFA's reference: everyone at the smallest budget"),
    "maximum": StrategyEntry(_maximum, keys.DP_SGD, None, "PFA's oracle: everyone at the largest budget"),
    "weiavg": StrategyEntry(_weiavg, keys.DP_SGD, None, "WeiAvg: FedAvg weighted by the budgets"),
    "pfa": StrategyEntry(_pfa, keys.DP_SGD, "pfa", "PFA: private updates projected on the public clients' subspace"),
    "pfa-plus": StrategyEntry(_pfa_plus, keys.DP_SGD, "pfa", "PFA+: PFA with k-coordinate uploads"),
    "fedceo": StrategyEntry(_fedceo, keys.DP_UPDATE, "fedceo", "FedCEO: tensor low-rank smoothing of the clients' models"),
    "ppsgd": StrategyEntry(_ppsgd, keys.DP_UPDATE, None, "PPSGD: a shared and a personal model per client",
                           takes_local_steps=False),
    "centaur": StrategyEntry(_centaur, keys.DP_UPDATE, None, "CENTAUR: shared body, personal head",
                             takes_local_steps=False),
    "dp-fedavg": _gdpfed("dp-fedavg", "GDPFed's DP-FedAvg: one group at the strictest budget, plain mean"),
    "gdpfed": _gdpfed("gdpfed", "GDPFed: budget groups, per-group sigma_m, reweighted group sums"),
    "gdpfed-op": _gdpfed("gdpfed-op", "GDPFed with the optimal per-group sampling rates (Problem 1)"),
    "gdpfed-plus": _gdpfed("gdpfed-plus", "GDPFed+: optimal sampling and top-k sparsified group sums"),
    "idp-fedavg-scale": _gdpfed("idp-fedavg-scale", "IDP-FedAvg (Scale): per-group clip, one common noise std"),
    "idp-fedavg-sample": _gdpfed("idp-fedavg-sample", "IDP-FedAvg (Sample): per-group sampling, one common sigma"),
    "pfa-groups": _gdpfed("pfa-groups", "PFA on GDPFed's budget groups (group sums only)"),
    "dpfedc": StrategyEntry(_dpfedc, keys.DP_UPDATE, "dpfedc", "DP-FedC: private federated clustering",
                            params=_dpfedc_params, check=_dpfedc_check, takes_local_steps=False,
                            task=keys.TASK_CLUSTERING, calibrates_without_budget=_dpfedc_nominal),
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
