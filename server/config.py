"""The run configuration, validated at the edge with pydantic.

Flower hands the ServerApp a flat ``run_config`` (``[tool.flwr.app.config]`` of
``pyproject.toml`` plus ``--run-config`` overrides; nested tables arrive as dotted keys such
as ``fedceo.lambda``). ``RunConfig.from_flower`` turns it into one frozen, typed object or
raises ``ConfigError`` with a message that names the key and the allowed values. Nothing
deeper in the server reads the raw dictionary.
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from privacy.accountants import ACCOUNTANTS
from privacy.calibration import CALIBRATIONS
from privacy.budgets import BUDGET_DISTRIBUTIONS, GDPFED_FMNIST_GROUPS, MIXTURE_COMPONENTS
from privacy.randomness import NOISE_SOURCES
from protocol import keys
from protocol.dpfedc import DPFedCConfig  # DP-FedC (issue 14)
from strategies.catalogue import CATALOGUE, SUM_ONLY_STRATEGIES
from strategies.fedceo import FedCEOConfig
from strategies.gdpfed import GDPFED_STRATEGIES, GDPFedConfig
from strategies.pfa import PFAConfig
from strategies.secure_sum import SECURE_AGGREGATION, SecureAggregation
from protocol.config import kebab, numbers, one_of
from tasks.datasets import EVALUATION_SPLITS
from tasks.models import GRAD_SAMPLE_MODES, MODELS, resolve_grad_sample_mode
from tasks.partition import PARTITIONERS

STRATEGIES = tuple(CATALOGUE)  # strategies/catalogue.py: every strategy, once
DP_MODES = keys.DP_MODES


#: field -> allowed values, for every key that names a choice
CHOICES: dict[str, tuple[str, ...]] = {
    "strategy": STRATEGIES,
    "partitioner": PARTITIONERS,
    "model": MODELS,
    "dp_mode": ("auto", *DP_MODES),
    "accountant": ACCOUNTANTS,
    "grad_sample_mode": GRAD_SAMPLE_MODES,
    "budget_distribution": ("none", *BUDGET_DISTRIBUTIONS),
    "budget_components": MIXTURE_COMPONENTS,
    "evaluation_split": EVALUATION_SPLITS,
    "calibration": CALIBRATIONS,
    "noise_source": NOISE_SOURCES,
    "client_evaluation": ("off", "on"),
    "secure_aggregation": SECURE_AGGREGATION,
}


class ConfigError(ValueError):
    """An invalid run configuration; the message names the key and what is allowed."""


class RunConfig(BaseModel):
    """Every key of ``[tool.flwr.app.config]``; see the README's configuration table."""

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    strategy: str = "fedavg-hdp"
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
    dp_mode: str = "auto"
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
    # What simulated clients honour (a deployed client takes these from its node config):
    noise_source: str = "csprng"
    client_evaluation: str = "off"
    report_train_metrics: bool = False
    ledger_dir: str = ""
    secure_aggregation: str = "none"
    secagg: SecureAggregation = SecureAggregation()
    pfa: PFAConfig = PFAConfig()
    fedceo: FedCEOConfig = FedCEOConfig()
    gdpfed: GDPFedConfig = GDPFedConfig()
    dpfedc: DPFedCConfig = DPFedCConfig()  # DP-FedC (issue 14)

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
    def _cross(self) -> "RunConfig":
        if len(self.budget_group_ratio) != len(self.budget_groups):
            raise ValueError(f"'budget-group-ratio' must give one size per entry of 'budget-groups' "
                             f"({len(self.budget_groups)}); found {list(self.budget_group_ratio)}")
        if self.epsilon_min > self.epsilon_max:
            raise ValueError(
                f"'epsilon-min' ({self.epsilon_min}) must not exceed 'epsilon-max' ({self.epsilon_max})"
            )
        if self.resolved_dp_mode == "none" and self.budget_distribution != "none" and self.dp_mode == "auto":
            raise ValueError(
                f"'strategy' = '{self.strategy}' trains without privacy (dp-mode none), which clients "
                f"with a finite budget refuse: also set 'budget-distribution' = 'none' "
                f"(--set budget-distribution=none), or choose a private strategy such as 'fedavg-hdp'"
            )
        if self.resolved_dp_mode == "none" and self.budget_distribution != "none":
            raise ValueError(
                "'dp-mode' = 'none' trains without privacy, which clients with a finite budget "
                "refuse: also set 'budget-distribution' = 'none'"
            )
        if self.local_steps and not CATALOGUE[self.strategy].takes_local_steps:
            raise ValueError(f"'local-steps' must be 0 for '{self.strategy}' (its clients' local work is set by "
                             f"'local-epochs' or its own section); found {self.local_steps}")
        if self.calibration != "accountant" and (self.resolved_dp_mode != "dpsgd" or self.noise_multiplier > 0):
            raise ValueError(f"'calibration' = '{self.calibration}' is PFA's formula for DP-SGD clients that calibrate "
                             "their own sigma: it needs 'dp-mode' = 'dpsgd' and 'noise-multiplier' = 0")
        if self.evaluation_split != "test" and self.strategy == "dpfedc":
            raise ValueError("'evaluation-split' applies to trained models; DP-FedC scores its clustering on "
                             "'dpfedc.eval-samples' (leave 'evaluation-split' = 'test')")
        resolve_grad_sample_mode(self.grad_sample_mode, self.model)  # 'linear' only for Linear-only models
        late = [r for r in self.checkpoint_rounds if r > self.num_server_rounds]
        if late:
            raise ValueError(f"'checkpoint-rounds' {late} lie beyond 'num-server-rounds' = {self.num_server_rounds}")
        paper_dpfedc = self.strategy == "dpfedc" and self.dpfedc.calibration == "paper"  # noise from eps-bar
        if self.strategy == "dpfedc":  # DP-FedC (issue 14)
            if (self.dpfedc.calibration == "none") != (self.resolved_dp_mode == "none"):
                raise ValueError("'dpfedc.calibration' = 'none' goes with 'dp-mode' = 'none' (and "
                                 "'budget-distribution' = 'none'); a private run needs 'rigorous' or 'paper'")
            if paper_dpfedc and not self.dpfedc.grad_clip > 0:
                raise ValueError("'dpfedc.calibration' = 'paper' needs 'dpfedc.grad-clip' (G) > 0: eq. (29) "
                                 "assumes every minibatch gradient is bounded by G")
        if self.resolved_dp_mode != "none" and self.budget_distribution == "none" and self.noise_multiplier == 0 \
                and not paper_dpfedc:
            raise ValueError(
                "'budget-distribution' = 'none' gives clients no budget to calibrate noise from: "
                "set 'noise-multiplier' > 0 or choose a budget distribution"
            )
        self._check_gdpfed()
        self._check_secure_aggregation()
        return self

    def _check_secure_aggregation(self) -> None:
        """Secure sums need update mode, a sum-only aggregation rule and a common σ."""
        if self.secure_aggregation == "none":
            return
        if self.strategy not in SUM_ONLY_STRATEGIES:
            raise ValueError(f"'secure-aggregation' = '{self.secure_aggregation}' needs a strategy that aggregates "
                             f"sums only, one of {list(SUM_ONLY_STRATEGIES)}; found '{self.strategy}'")
        if self.resolved_dp_mode != "update":
            raise ValueError(f"'secure-aggregation' = '{self.secure_aggregation}' needs 'dp-mode' = 'update' (the "
                             f"noise is split among the clients of a sum); found '{self.resolved_dp_mode}'")
        if self.strategy in GDPFED_STRATEGIES:
            return
        if self.noise_multiplier <= 0:
            raise ValueError(f"'secure-aggregation' = '{self.secure_aggregation}' needs a common 'noise-multiplier' "
                             "> 0: every client of a sum must add the same share of the noise")
        per_round = min(self.num_clients, max(self.min_train_clients, int(self.fraction_train * self.num_clients)))
        r_min = self.secagg.min_survivors or self.noise_shares
        if r_min > per_round:
            raise ValueError(f"'secagg.min-survivors' (0 means 'noise-shares') = {r_min} is above the {per_round} "
                             "clients sampled per round, so no sum could be released")

    def _check_gdpfed(self) -> None:
        """GDPFed family in simulation: plan the groups from the simulated budgets now, so an
        empty group, q_m|G_m| < 1 or an unreachable ε fails at start naming its key."""
        if self.strategy not in GDPFED_STRATEGIES or self.budget_distribution == "none":
            return
        if self.resolved_dp_mode != "update":
            raise ValueError(f"'dp-mode' must be 'update' (or auto) for '{self.strategy}'")
        from privacy.budgets import budgets_for
        from strategies.gdpfed import plan_groups

        budgets = budgets_for(self.budget_distribution, self.num_clients, **self.budget_params)
        cls = GDPFED_STRATEGIES[self.strategy]
        if not cls.variant.single_group and min(budgets) < self.gdpfed.group_epsilons[0] * (1 - 1e-9):
            raise ValueError(f"'gdpfed.group-epsilons': the first threshold {self.gdpfed.group_epsilons[0]:g} is "
                             f"above the smallest simulated budget {min(budgets):g}; those clients would be refused")
        plan_groups(cls.variant, self.gdpfed, [(e, self.delta) for e in budgets], self.num_server_rounds,
                    self.clip, lr=self.learning_rate, local_steps=self.local_steps or self.local_epochs,
                    accountant=self.accountant)

    @property
    def budget_params(self) -> dict[str, Any]:
        """Keyword arguments of :func:`privacy.budgets.budget_for` for this run's distribution."""
        return {"seed": self.seed, "epsilon": self.epsilon, "epsilon_min": self.epsilon_min,
                "epsilon_max": self.epsilon_max, "groups": self.budget_groups,
                "group_ratio": self.budget_group_ratio, "components": self.budget_components}

    @property
    def resolved_dp_mode(self) -> str:
        """``dp-mode``, with "auto" replaced by the strategy's own mode."""
        return CATALOGUE[self.strategy].dp_mode if self.dp_mode == "auto" else self.dp_mode

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Validate Flower's run config; raise ``ConfigError`` naming the bad key.

        Dotted keys (``pfa.k``, from a ``[tool.flwr.app.config.pfa]`` table) become the
        fields of that method's section model.
        """
        try:
            return cls.model_validate(nest(run_config))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc)) from None


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



def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``key: what is wrong``."""
    lines = []
    for err in exc.errors():
        key = ".".join(kebab(str(p)) for p in err["loc"]) or "(config)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            model: type[BaseModel] = RunConfig
            prefix = ""
            if len(err["loc"]) == 2:  # an unknown key inside a method's section (pfa.*, fedceo.*)
                section = RunConfig.model_fields.get(str(err["loc"][0]))
                if section is not None and isinstance(section.annotation, type) \
                        and issubclass(section.annotation, BaseModel):
                    model, prefix = section.annotation, f"{err['loc'][0]}."
            allowed = ", ".join(sorted(prefix + (f.alias or kebab(n)) for n, f in model.model_fields.items()))
            msg = f"unknown key; allowed keys: {allowed}"
        elif "input" in err and err["type"] not in ("value_error",):
            msg = f"{msg} (found {err['input']!r})"
        lines.append(f"invalid run config: '{key}': {msg}" if err["loc"] else f"invalid run config: {msg}")
    return "\n".join(lines)
