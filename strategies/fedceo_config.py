"""FedCEO's run-config section (``[tool.flwr.app.config.fedceo]``), validated at the edge.

Beside its catalogue entry (:mod:`strategies.catalogue`) and importable without Flower or torch.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from protocol.config import kebab, one_of

#: ``fedceo.restart``: where a client smoothed in round t starts round t+1
RESTARTS = ("own", "global")


def parse_layers(spec: str) -> tuple[int, ...] | None:
    """``"all"`` -> None (every floating parameter); ``"0,3"`` -> (0, 3)."""
    text = spec.strip().lower()
    if text == "all":
        return None
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"'fedceo.layers' must be 'all' or comma-separated parameter indices such as '2,3'; found {spec!r}"
        ) from None
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"'fedceo.layers' must list distinct indices >= 0; found {spec!r}")
    return indices


class FedCEOConfig(BaseModel):
    """The run config's ``fedceo.*`` section (``[tool.flwr.app.config.fedceo]``).

    Defaults are the paper's Table 2 values for CIFAR-10 / LeNet-5 at σ_g = 2.0 (also the
    example in the authors' ``train.sh``): λ = 0.6, ϑ = 1.04, I = 10.

    Attributes
    ----------
    lam : float
        ``lambda``: initial coefficient λ > 0 of Eq. (2); smaller λ, stronger smoothing.
    theta : float
        Common ratio ϑ >= 1 of the threshold ϑ^{t/I}/(2λ); ϑ = 1 is the paper's
        "FedCEO (ϑ=1)" ablation (a constant threshold).
    interval : int
        Smoothing interval I >= 1: rounds t with t % I == 0 smooth (Alg. 2, line 11).
    layers : str
        ``"all"`` or comma-separated indices of the model arrays to smooth (§3.3 suggests
        the last layers for large models); the others are averaged.
    half_spectrum : bool
        ``half-spectrum``: threshold only the ⌊K/2⌋+1 non-redundant Fourier slices
        (same result, fewer SVDs); false runs all K, like the authors' code.
    restart : str
        Where a client of S_t starts round t+1: ``"own"`` (Alg. 2 lines 5-6, its own
        smoothed ŵ_k(t); the paper and its code) or ``"global"`` (the global w'(t), an
        ablation: the smoothing then acts on the global model only).
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    lam: float = Field(0.6, alias="lambda")
    theta: float = 1.04
    interval: int = 10
    layers: str = "all"
    half_spectrum: bool = True
    restart: str = "own"

    @field_validator("restart")
    @classmethod
    def _restart(cls, v: str) -> str:
        return one_of("fedceo.restart", v, RESTARTS)

    @field_validator("lam", "theta", "interval", mode="before")
    @classmethod
    def _not_bool(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool):  # pydantic would read true as 1
            key = "lambda" if info.field_name == "lam" else info.field_name
            raise ValueError(f"'fedceo.{key}' must be a number; found {v!r}")
        return v

    @field_validator("lam")
    @classmethod
    def _lam(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"'fedceo.lambda' must be a finite number > 0; found {v}")
        return v

    @field_validator("theta")
    @classmethod
    def _theta(cls, v: float) -> float:
        if not (math.isfinite(v) and v >= 1):
            raise ValueError(f"'fedceo.theta' must be a finite number >= 1 (1 = constant threshold); found {v}")
        return v

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"'fedceo.interval' must be an integer >= 1; found {v}")
        return v

    @field_validator("layers", mode="before")
    @classmethod
    def _layers(cls, v: Any) -> str:
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)  # a single index written as a TOML integer
        if not isinstance(v, str):
            raise ValueError(f"'fedceo.layers' must be 'all' or a string of indices; found {v!r}")
        parse_layers(v)
        return v

    @property
    def layer_indices(self) -> tuple[int, ...] | None:
        """The parsed ``layers``: None for all floating parameters."""
        return parse_layers(self.layers)
