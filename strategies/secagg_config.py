"""The secure-sum section of the run config (``[tool.flwr.app.config.secagg]``), validated at the edge.

Importable without Flower or torch (:mod:`strategies.secure_sum` runs the stages).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from privacy.distributed_discrete_gaussian import MAX_BITS as DDG_MAX_BITS
from privacy.distributed_discrete_gaussian import WRAP_PROBABILITY
from privacy.secure_sum import MAX_BITS
from protocol.config import kebab, one_of
from protocol.secure_sum import DDG, GAUSSIAN, SUM_MODES

#: Values of the run config's ``secure-aggregation``: none, quantised Gaussian shares, or
#: distributed discrete Gaussian shares (:mod:`privacy.mechanisms.ddg`).
SECURE_AGGREGATION = ("none", *SUM_MODES)

#: Conditional rounding's β by default: TFF's ``DistributedDpSumFactory`` default, e^{−1/2}.
DEFAULT_BETA = math.exp(-0.5)


class SecureAggregation(BaseModel):
    """The ``[tool.flwr.app.config.secagg]`` section (keys ``secagg.*``): how secure sums run.

    Attributes
    ----------
    threshold : float
        t as a fraction of a sum's members (Shamir threshold; at least 2): the server and
        fewer than t members together learn nothing about one member's input.
    min_survivors : int
        r_min: the fewest inputs a released sum may hold; 0 means ``noise-shares`` (m).
        Each member charges σ·√(r_min/m).
    bits : int
        Bits per coordinate. ``secagg+``: quantisation bits b (L = 2^b − 1 levels per coordinate),
        8 to 30; the masked input travels in log₂ M ≈ b + log₂ K bits (M > K·L: the sum must fit).
        ``secagg+ddg``: the sum is taken mod 2^b, 8 to 32, and travels in b bits per coordinate;
        the scale is the largest for which wrap-around has probability <= ``wrap_probability``.
    clip_probability : float
        ``secagg+``: bound on the probability that the quantiser clips any coordinate (eq. 1 of
        :mod:`privacy.secure_sum`).
    beta : float
        ``secagg+ddg``: conditional rounding's β in [0, 1) (0: plain randomised rounding, whose
        norm bound ‖x‖ + √d' inflates the sensitivity more; default e^{−1/2}, as TFF).
    wrap_probability : float
        ``secagg+ddg``: bound on the probability that any coordinate of a sum wraps around mod 2^b
        (eq. 3 of :mod:`privacy.distributed_discrete_gaussian`; stated in the run's summary).
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    threshold: float = Field(0.5, gt=0.0, le=1.0)
    min_survivors: int = Field(0, ge=0)
    bits: int = Field(24, ge=8, le=DDG_MAX_BITS)
    clip_probability: float = Field(1e-9, gt=0.0, lt=1.0)
    beta: float = Field(DEFAULT_BETA, ge=0.0, lt=1.0)
    wrap_probability: float = Field(WRAP_PROBABILITY, gt=0.0, lt=1.0)
    _mode: str = PrivateAttr(GAUSSIAN)

    @property
    def mode(self) -> str:
        """The run's ``secure-aggregation`` (:meth:`for_mode`; ``secagg+`` unless set)."""
        return self._mode

    @property
    def ddg(self) -> bool:
        """Whether sums carry distributed discrete Gaussian shares."""
        return self._mode == DDG

    def for_mode(self, mode: str) -> SecureAggregation:
        """This section for a run whose ``secure-aggregation`` is ``mode`` (one of :data:`SUM_MODES`)."""
        out = self.model_copy()
        out._mode = one_of("secure-aggregation", mode, SUM_MODES)
        return out

    def shamir_threshold(self, members: int) -> int:
        """T for a sum of ``members`` clients: ⌈fraction·members⌉, at least 2, at most members."""
        return min(members, max(2, math.ceil(self.threshold * members)))


def check(cfg: Any, sums_only: bool, group_sums: bool) -> None:
    """Secure sums need update mode, a sum-only aggregation rule and a common σ (``cfg``: a RunConfig).

    ``sums_only``: the strategy aggregates sums only; ``group_sums``: its sums are GDPFed's groups
    (each with its own σ_m, released only with all r_m members).
    """
    from protocol import keys

    if cfg.secure_aggregation == "none":
        return
    if cfg.secure_aggregation == GAUSSIAN and cfg.secagg.bits > MAX_BITS:
        raise ValueError(f"'secagg.bits' must be an integer in [8, {MAX_BITS}] for 'secure-aggregation' = "
                         f"'{GAUSSIAN}' (Flower's quantiser holds 30 bits); found {cfg.secagg.bits}")
    if cfg.secure_aggregation == DDG:
        if cfg.accountant != "rdp":
            raise ValueError(f"'secure-aggregation' = '{DDG}' needs 'accountant' = 'rdp': the distributed discrete "
                             "Gaussian's guarantee is a Renyi-DP bound (Kairouz, Liu & Steinke 2021), which clients' "
                             f"ledgers convert through RDP; found '{cfg.accountant}'")
    if not sums_only:
        raise ValueError(f"'secure-aggregation' = '{cfg.secure_aggregation}' needs a strategy that aggregates sums "
                         f"only; '{cfg.strategy}' does not (see `privet run --help` for the strategies)")
    if cfg.resolved_dp_mode != keys.DP_UPDATE:
        raise ValueError(f"'secure-aggregation' = '{cfg.secure_aggregation}' needs 'dp-mode' = 'update' (the noise "
                         f"is split among the clients of a sum); found '{cfg.resolved_dp_mode}'")
    if group_sums:
        return
    if cfg.noise_multiplier <= 0:
        raise ValueError(f"'secure-aggregation' = '{cfg.secure_aggregation}' needs a common 'noise-multiplier' > 0: "
                         "every client of a sum must add the same share of the noise")
    per_round = min(cfg.num_clients, max(cfg.min_train_clients, int(cfg.fraction_train * cfg.num_clients)))
    r_min = max(cfg.secagg.min_survivors or cfg.noise_shares, cfg.site.min_sum_size)
    if r_min > per_round:
        raise ValueError(f"'secagg.min-survivors' (0 means 'noise-shares', at least 'site.min-sum-size') = {r_min} "
                         f"is above the {per_round} clients sampled per round, so no sum could be released")
