"""The server's run configuration, validated at the edge with pydantic.

:class:`RunConfig` is the run's general settings (:class:`protocol.run_settings.RunSettings`, what
clients read too) plus the strategy, the methods' sections and every cross-check, each method's
own beside its catalogue entry (:mod:`strategies.catalogue`). ``RunConfig.from_flower`` turns
Flower's flat ``run_config`` into one frozen, typed object or raises ``ConfigError`` with one line
per problem naming the key and the allowed values (with "did you mean" for a misspelt key).
Nothing deeper in the server reads the raw dictionary, and importing this module loads neither
torch nor Flower.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from protocol import keys
from protocol.config import kebab, one_of
from protocol.run_settings import CHOICES as GENERAL_CHOICES
from protocol.run_settings import RunSettings, nest
from strategies.catalogue import CATALOGUE
from strategies.fedceo_config import FedCEOConfig
from strategies.gdpfed_config import GDPFedConfig
from strategies.pfa_config import PFAConfig
from strategies.secagg_config import SECURE_AGGREGATION, SecureAggregation
from strategies.secagg_config import check as check_secure_aggregation

STRATEGIES = tuple(CATALOGUE)  # strategies/catalogue.py: every strategy, once
DP_MODES = keys.DP_MODES

#: field -> allowed values, for every key that names a choice
CHOICES: dict[str, tuple[str, ...]] = {
    **GENERAL_CHOICES,
    "strategy": STRATEGIES,
    "dp_mode": ("auto", *DP_MODES),
    "secure_aggregation": SECURE_AGGREGATION,
}
_OWN_CHOICES = ("strategy", "dp_mode", "secure_aggregation")


class ConfigError(ValueError):
    """An invalid run configuration; the message names the key and what is allowed."""


class RunConfig(RunSettings):
    """Every key of ``[tool.flwr.app.config]``; see the README's configuration keys."""

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    strategy: str = "fedavg-hdp"
    dp_mode: str = "auto"
    secure_aggregation: str = "none"
    secagg: SecureAggregation = SecureAggregation()
    pfa: PFAConfig = PFAConfig()
    fedceo: FedCEOConfig = FedCEOConfig()
    gdpfed: GDPFedConfig = GDPFedConfig()

    @field_validator(*_OWN_CHOICES)
    @classmethod
    def _own_choice(cls, v: str, info: ValidationInfo) -> str:
        name = str(info.field_name)
        return one_of(kebab(name), v, CHOICES[name])

    @model_validator(mode="after")
    def _cross(self) -> RunConfig:
        entry = CATALOGUE[self.strategy]
        mode = self.resolved_dp_mode
        if mode == keys.DP_NONE and self.budget_distribution != "none":
            raise ValueError(
                f"'strategy' = '{self.strategy}' trains without privacy (dp-mode none), which clients with a finite "
                "budget refuse: also set 'budget-distribution' = 'none' (--set budget-distribution=none), or choose "
                "a private strategy such as 'fedavg-hdp'" if self.dp_mode == "auto" else
                "'dp-mode' = 'none' trains without privacy, which clients with a finite budget refuse: also set "
                "'budget-distribution' = 'none'")
        if self.local_steps and not entry.takes_local_steps:
            raise ValueError(f"'local-steps' must be 0 for '{self.strategy}' (its clients' local work is set by "
                             f"'local-epochs' or its own section); found {self.local_steps}")
        if self.calibration != "accountant" and (mode != keys.DP_SGD or self.noise_multiplier > 0):
            raise ValueError(f"'calibration' = '{self.calibration}' is PFA's formula for DP-SGD clients that "
                             "calibrate their own sigma: it needs 'dp-mode' = 'dpsgd' and 'noise-multiplier' = 0")
        if mode != keys.DP_NONE and self.budget_distribution == "none" and self.noise_multiplier == 0 \
                and not entry.calibrates_without_budget(self):
            raise ValueError("'budget-distribution' = 'none' gives clients no budget to calibrate noise from: "
                             "set 'noise-multiplier' > 0 or choose a budget distribution")
        if entry.task != keys.TASK_CLUSTERING and self.evaluation_split not in ("test", "validation"):
            raise ValueError(f"'evaluation-split' must be 'test' or 'validation'; found {self.evaluation_split!r}")
        if self.roster:
            from protocol.roster import Roster

            try:
                Roster.load(self.roster)
            except ValueError as exc:
                raise ValueError(f"'roster': {exc}") from None
        if entry.check is not None:
            entry.check(self)
        check_secure_aggregation(self, entry.sums_only, entry.group_sums)
        return self

    @property
    def resolved_dp_mode(self) -> str:
        """``dp-mode``, with "auto" replaced by the strategy's own mode."""
        return CATALOGUE[self.strategy].dp_mode if self.dp_mode == "auto" else self.dp_mode

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Validate Flower's run config; raise ``ConfigError`` naming the bad key.

        Dotted keys (``pfa.k``, from a ``[tool.flwr.app.config.pfa]`` table) become the fields of
        that method's section model.
        """
        try:
            return cls.model_validate(nest(run_config))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc)) from None


def _allowed_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    return sorted(prefix + (f.alias or kebab(n)) for n, f in model.model_fields.items())


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``key: what is wrong`` (an unknown key: the closest known ones)."""
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
            allowed = _allowed_keys(model, prefix)
            close = difflib.get_close_matches(key, allowed, n=3, cutoff=0.6)
            msg = (f"unknown key; did you mean {' or '.join(repr(c) for c in close)}?" if close else
                   "unknown key" + (f"; the keys of its section: {', '.join(allowed)}" if prefix else
                                    "; `privet run --help` lists the keys"))
        elif "input" in err and err["type"] not in ("value_error",):
            msg = f"{msg} (found {err['input']!r})"
        lines.append(f"invalid run config: '{key}': {msg}" if err["loc"] else f"invalid run config: {msg}")
    return "\n".join(lines)
