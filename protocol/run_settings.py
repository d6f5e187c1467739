"""The run's settings, typed once for both sides: what the server validates and every client reads.

Flower hands the ServerApp and every ClientApp the same flat ``run_config`` (``[tool.flwr.app.config]``
of ``pyproject.toml`` plus ``--run-config`` overrides; nested tables arrive as dotted keys such as
``dpfedc.k``). :class:`RunSettings` holds the keys that are not one method's own: the task, the
data and its partition, local training, privacy and the simulated clients' options. The server's
:class:`server.config.RunConfig` extends it with the strategy and the methods' sections and
forbids unknown keys; a client reads it with :meth:`RunSettings.of`, which ignores the sections it
has no use for, so a client never reads a raw key or keeps a default of its own.

Importing this module loads neither torch nor Flower: a config error is reported in a second.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from privacy.accountants import ACCOUNTANTS
from privacy.budgets import BUDGET_DISTRIBUTIONS, GDPFED_FMNIST_GROUPS, MIXTURE_COMPONENTS
from privacy.calibration import CALIBRATIONS
from privacy.randomness import NOISE_SOURCES
from protocol.config import kebab, numbers, one_of
from protocol.dpfedc import DPFedCConfig
from protocol.site import SiteFloors
from tasks.model_names import GRAD_SAMPLE_MODES, MODELS, resolve_grad_sample_mode
from tasks.partition import PARTITIONERS
from tasks.validation_split import EVALUATION_SPLITS

__all__ = ["CHOICES", "RunSettings", "nest"]

#: field -> allowed values, for every general key that names a choice
CHOICES: dict[str, tuple[str, ...]] = {
    "partitioner": PARTITIONERS,
    "model": MODELS,
    "accountant": ACCOUNTANTS,
    "grad_sample_mode": GRAD_SAMPLE_MODES,
    "budget_distribution": ("none", *BUDGET_DISTRIBUTIONS),
    "budget_components": MIXTURE_COMPONENTS,
    "evaluation_split": EVALUATION_SPLITS,
    "calibration": CALIBRATIONS,
    "noise_source": NOISE_SOURCES,
    "client_evaluation": ("off", "on"),
}


class RunSettings(BaseModel):
    """Every general key of ``[tool.flwr.app.config]``; see the README's configuration keys."""

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="ignore", frozen=True)

    num_server_rounds: int = Field(3, ge=1, le=100_000)
    num_clients: int = Field(10, ge=1)
    fraction_train: float = Field(1.0, gt=0.0, le=1.0)
    min_train_clients: int = Field(2, ge=1)
    min_accepted_clients: int = Field(1, ge=1)
    seed: int = 42
    dataset: str = "fashion-mnist"
    evaluation_split: str = "test"
    data_dir: str = ""
    partitioner: str = "iid"
    dirichlet_alpha: float = Field(0.5, gt=0.0)
    shards_per_client: int = Field(2, ge=1)
    max_examples_per_client: int = Field(0, ge=0)
    max_epsilon_ratio: float = Field(1000.0, ge=0.0)
    model: str = "cnn"
    local_epochs: int = Field(1, ge=1)
    local_steps: int = Field(0, ge=0)
    batch_size: int = Field(64, ge=1)
    learning_rate: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    accountant: str = "prv"
    clip: float = Field(1.0, gt=0.0)
    noise_multiplier: float = Field(0.0, ge=0.0)
    calibration: str = "accountant"
    noise_shares: int = Field(1, ge=1)
    grad_sample_mode: str = "auto"
    budget_distribution: str = "uniform"
    epsilon: float = Field(3.0, gt=0.0)
    epsilon_min: float = Field(1.0, gt=0.0)
    epsilon_max: float = Field(10.0, gt=0.0)
    budget_groups: tuple[float, ...] = GDPFED_FMNIST_GROUPS
    budget_group_ratio: tuple[int, ...] = (1, 1, 1)
    budget_components: str = "drawn"
    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    run_epsilon: float = Field(0.0, ge=0.0)
    out_dir: str = ""
    checkpoint_rounds: tuple[int, ...] = ()
    round_timeout: float = Field(3600.0, gt=0.0)
    # What simulated clients honour (a deployed client takes these from its own node config):
    noise_source: str = "csprng"
    client_evaluation: str = "off"
    report_train_metrics: bool = False
    ledger_dir: str = ""
    roster: str = ""
    site: SiteFloors = SiteFloors()
    dpfedc: DPFedCConfig = DPFedCConfig()

    @field_validator(*CHOICES)
    @classmethod
    def _choice(cls, v: str, info: ValidationInfo) -> str:
        name = str(info.field_name)
        return one_of(kebab(name), v, CHOICES[name])

    @field_validator("budget_groups", mode="before")
    @classmethod
    def _group_budgets(cls, v: Any) -> Any:
        v = numbers("budget-groups", v) if isinstance(v, str) else v
        if not v or not all(isinstance(e, (int, float)) and 0 < e < float("inf") for e in v):
            raise ValueError(f"'budget-groups' must be finite budgets > 0, one per group, e.g. \"0.5, 1.5, 3\"; "
                             f"found {v!r}")
        return v

    @field_validator("budget_group_ratio", mode="before")
    @classmethod
    def _group_ratio(cls, v: Any) -> Any:
        v = numbers("budget-group-ratio", v) if isinstance(v, str) else v
        if not v or not all(isinstance(r, (int, float)) and float(r).is_integer() and r >= 1 for r in v):
            raise ValueError(f"'budget-group-ratio' must be whole numbers >= 1 (relative group sizes, e.g. "
                             f"\"1, 4, 1\"); found {v!r}")
        return tuple(int(r) for r in v)

    @field_validator("checkpoint_rounds", mode="before")
    @classmethod
    def _checkpoint_rounds(cls, v: Any) -> Any:
        v = (numbers("checkpoint-rounds", v) if v.strip() else ()) if isinstance(v, str) else v
        if not all(isinstance(r, (int, float)) and float(r).is_integer() and r >= 0 for r in v):
            raise ValueError(f"'checkpoint-rounds' must be round numbers >= 0, e.g. \"10, 50\" (\"\": none); "
                             f"found {v!r}")
        return tuple(sorted({int(r) for r in v}))

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        from tasks.datasets import source

        source(v)  # the loader's own name check: DATASETS, emnist-<split>, hf:<name>
        return v

    @model_validator(mode="after")
    def _general(self) -> RunSettings:
        if len(self.budget_group_ratio) != len(self.budget_groups):
            raise ValueError(f"'budget-group-ratio' must give one size per entry of 'budget-groups' "
                             f"({len(self.budget_groups)}); found {list(self.budget_group_ratio)}")
        if self.epsilon_min > self.epsilon_max:
            raise ValueError(f"'epsilon-min' ({self.epsilon_min}) must not exceed 'epsilon-max' ({self.epsilon_max})")
        resolve_grad_sample_mode(self.grad_sample_mode, self.model)  # 'linear' only for Linear-only models
        late = [r for r in self.checkpoint_rounds if r > self.num_server_rounds]
        if late:
            raise ValueError(f"'checkpoint-rounds' {late} lie beyond 'num-server-rounds' = {self.num_server_rounds}")
        return self

    @property
    def budget_params(self) -> dict[str, Any]:
        """Keyword arguments of :func:`privacy.budgets.budget_for` for this run's distribution."""
        return {"seed": self.seed, "epsilon": self.epsilon, "epsilon_min": self.epsilon_min,
                "epsilon_max": self.epsilon_max, "groups": self.budget_groups,
                "group_ratio": self.budget_group_ratio, "components": self.budget_components}

    @classmethod
    def of(cls, run_config: Mapping[str, Any]) -> RunSettings:
        """The settings a client reads from Flower's run config (validated once per distinct config).

        Raises
        ------
        ValueError
            Naming the key, as the server would have refused it.
        """
        return _settings(tuple(sorted(run_config.items())))


@functools.lru_cache(maxsize=32)
def _settings(items: tuple[tuple[str, Any], ...]) -> RunSettings:
    from pydantic import ValidationError

    try:
        return RunSettings.model_validate(nest(dict(items)))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(kebab(str(p)) for p in first["loc"]) or "(config)"
        raise ValueError(f"run config '{key}': {first['msg'].removeprefix('Value error, ')}") from None


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"pfa.k": 1}`` -> ``{"pfa": {"k": 1}}`` (Flower flattens nested tables with dots)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return nested
