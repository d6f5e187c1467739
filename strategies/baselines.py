"""The baselines the papers compare with, all on ``PrivacyAwareFedAvg``.

=============  ==========  =====================================================  ==============
name           dp-mode     aggregation / budgets                                   paper
=============  ==========  =====================================================  ==============
fedavg         none        Σ n_k w_k / Σ n_k; no guarantee                         all
udp-fedavg     update      FedAvg over clipped+noised local updates (user-level)   FedCEO
fedavg-hdp     dpsgd       FedAvg over DP-SGD clients, each at its own ε           PFA
minimum        dpsgd       every client calibrated to the smallest ε               PFA
maximum        dpsgd       every client at the largest ε (oracle reference)        PFA
=============  ==========  =====================================================  ==============

``fedavg``, ``udp-fedavg`` and ``fedavg-hdp`` share the FedAvg rule; they differ only in what
clients run, which the server app sets in the train config. ``minimum`` sends every client a
target ε equal to the smallest declared budget (clients then spend less than they may).
``maximum`` asks every client to spend the largest budget: a client whose own budget is
smaller refuses, so this reference only runs where every client's budget *is* the largest
(in simulation the budget query and every train message say so, ``keys.BUDGET_REFERENCE``, and
each simulated client then holds the distribution's largest budget; see
``client.profile.simulated_budget``; a deployed client ignores it).
"""

from __future__ import annotations

import math
from dataclasses import replace

from flwr.app import ConfigRecord
from typing_extensions import override

from protocol import keys
from protocol.budget_query import BudgetQuery
from strategies.base import ClientAccount, PrivacyAwareFedAvg


class FedAvgHDP(PrivacyAwareFedAvg):
    """FedAvg over heterogeneous DP-SGD clients (PFA's "FedAvg-HDP" baseline)."""


class UDPFedAvg(PrivacyAwareFedAvg):
    """UDP-FedAvg: FedAvg over user-level locally privatised updates (FedCEO's baseline).

    Each client clips its whole update to C and adds N(0, σ²C²/m) before upload
    (``dp_mode="update"``); the server averages.
    """

    default_dp_mode = keys.DP_UPDATE


class _HomogeneousBudget(PrivacyAwareFedAvg):
    """Everyone calibrated to one ε chosen from the declared budgets."""

    #: What every simulated client's budget is (``keys.BUDGET_REFERENCE``).
    reference = ""

    def target_epsilon(self) -> float:
        raise NotImplementedError

    def budget_query(self) -> BudgetQuery:
        """Simulated clients declare the distribution's reference budget, not their own."""
        return replace(super().budget_query(), budget_reference=self.reference)

    def refuse_declaration(self, account: ClientAccount) -> str | None:
        if math.isfinite(account.epsilon_budget):
            return None
        return (f"declared eps={account.epsilon_budget}: {type(self).__name__} sets every client's budget "
                f"from the declared ones, which must be finite")

    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        cfg = ConfigRecord(dict(config))
        cfg[keys.TARGET_EPSILON] = float(self.target_epsilon())
        cfg[keys.BUDGET_REFERENCE] = self.reference
        return cfg


class MinimumBudget(_HomogeneousBudget):
    """PFA's "Minimum": every client spends only the smallest declared budget."""

    reference = "minimum"

    @override
    def target_epsilon(self) -> float:
        return min(a.epsilon_budget for a in self.accounts.values())


class MaximumBudget(_HomogeneousBudget):
    """PFA's "Maximum": every client at the largest declared budget (oracle reference)."""

    reference = "maximum"

    @override
    def target_epsilon(self) -> float:
        return max(a.epsilon_budget for a in self.accounts.values())
