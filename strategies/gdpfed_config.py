"""GDPFed's run-config section (``[tool.flwr.app.config.gdpfed]``), validated at the edge.

Beside its catalogue entry (:mod:`strategies.catalogue`) and importable without Flower or torch.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from protocol.config import kebab, numbers, one_of

WEIGHTINGS = ("paper", "normalised")


class GDPFedConfig(BaseModel):
    """The ``[tool.flwr.app.config.gdpfed]`` section (keys ``gdpfed.*``).

    Attributes
    ----------
    group_epsilons : list of float
        Lower budget thresholds of the groups, increasing; a client joins the highest group
        whose threshold is <= its ε (one below the first is refused). Paper FMNIST: 0.5, 1.5, 3.
    q : float
        Global sampling ratio q ∈ (0, 1] (Σ_m r_m = round(q·n)).
    sample_rates : list of float
        Explicit q_m per group (e.g. Table 1's 0.0069, 0.0189, 0.0342); empty: the variant's
        rule (q for gdpfed, Problem 1 for gdpfed-op / gdpfed-plus).
    sparsity : list of float
        k_m/d per group for gdpfed-plus, each in (0, 1] (one value: all groups).
    weighting : {"paper", "normalised"}
        ω_m of Appendix B.2 on the group sum, or the normalised variant (gdpfed_math).
    lr_decay : float
        Learning-rate decay per round, η_t = η·decay^(t−1) (paper 0.99; 1: none).
    server_step : float
        η_s in θ^{t+1} = θ^t + η_s·Σ_m ω_m ỹ_m (1: the paper's Algorithm 1). Post-processing of the
        released sums, so it changes no client's charge. For dp-fedavg (one group, ω = 1/r) it is the
        server learning rate of McMahan et al.'s DP-FedAvg; the paper does not state one.
    idp_clips : list of float
        Per-group clipping thresholds of idp-fedavg-scale (paper FMNIST 1.15, 1.51, 2.12); empty:
        IDP's own Scale rule on this run's σ_m, C_m = C·σ̄/σ_m with size-weighted mean C
        (:func:`strategies.gdpfed_math.idp_scale_clips`).
    idp_sample_rates : list of float
        Per-group q_m of idp-fedavg-sample (paper FMNIST 0.82 %, 2.80 %, 2.38 %).
    pfa_rank, pfa_history : int
        pfa-groups: rank of the public subspace, and how many past public sums span it.
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    group_epsilons: tuple[float, ...] = (0.5, 1.5, 3.0)
    q: float = Field(0.02, gt=0.0, le=1.0)
    sample_rates: tuple[float, ...] = ()
    sparsity: tuple[float, ...] = (0.7, 0.8, 0.9)
    weighting: str = "paper"
    lr_decay: float = Field(0.99, gt=0.0, le=1.0)
    server_step: float = Field(1.0, gt=0.0, le=10.0, allow_inf_nan=False)
    idp_clips: tuple[float, ...] = (1.15, 1.51, 2.12)
    idp_sample_rates: tuple[float, ...] = (0.0082, 0.0280, 0.0238)
    pfa_rank: int = Field(1, ge=1)
    pfa_history: int = Field(5, ge=1)

    @field_validator("group_epsilons", "sample_rates", "sparsity", "idp_clips", "idp_sample_rates", mode="before")
    @classmethod
    def _numbers(cls, v: Any, info: ValidationInfo) -> Any:
        """Flower's run config holds scalars only: a list is written "0.5, 1.5, 3" ("" = empty)."""
        return numbers(f"gdpfed.{kebab(str(info.field_name))}", v) if isinstance(v, str) else v

    @field_validator("weighting")
    @classmethod
    def _weighting(cls, v: str) -> str:
        return one_of("gdpfed.weighting", v, WEIGHTINGS)

    @field_validator("group_epsilons")
    @classmethod
    def _thresholds(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(not (math.isfinite(e) and e > 0) for e in v) or list(v) != sorted(set(v)):
            raise ValueError(f"'gdpfed.group-epsilons' must be increasing finite numbers > 0; found {list(v)}")
        return v

    @field_validator("sparsity")
    @classmethod
    def _sparsity(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(not (math.isfinite(a) and 0 < a <= 1) for a in v):
            raise ValueError(f"'gdpfed.sparsity': every k_m/d must be in (0, 1]; found {list(v)}")
        return v

    @field_validator("sample_rates", "idp_sample_rates")
    @classmethod
    def _rates(cls, v: tuple[float, ...], info: Any) -> tuple[float, ...]:
        if any(not (math.isfinite(q) and 0 < q <= 1) for q in v):
            raise ValueError(f"'gdpfed.{kebab(info.field_name)}': every q_m must be in (0, 1]; found {list(v)}")
        return v

    @field_validator("idp_clips")
    @classmethod
    def _clips(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (math.isfinite(c) and c > 0) for c in v):
            raise ValueError(f"'gdpfed.idp-clips' must be finite numbers > 0; found {list(v)}")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> GDPFedConfig:
        m = len(self.group_epsilons)
        if self.sample_rates and len(self.sample_rates) != m:
            raise ValueError(f"'gdpfed.sample-rates' needs one value per group ({m}); found {list(self.sample_rates)}")
        return self

    def per_group(self, name: str, groups: int) -> list[float]:
        """``name``'s values, one per group (a single value applies to all); ValueError naming the key."""
        v = list(getattr(self, name))
        if len(v) == 1:
            return v * groups
        if len(v) != groups:
            raise ValueError(f"'gdpfed.{kebab(name)}' needs one value per group ({groups}); found {v}")
        return v


def check(cfg: Any) -> None:
    """GDPFed family: the DP mode must be ``update`` (``cfg``: a validated RunConfig).

    The group plan is checked next, by :func:`strategies.gdpfed.check_plan` (it needs the variants
    and :func:`strategies.gdpfed.plan_groups`, which import this module).
    """
    from protocol import keys

    if cfg.resolved_dp_mode != keys.DP_UPDATE:
        raise ValueError(f"'dp-mode' must be 'update' (or auto) for '{cfg.strategy}'")
