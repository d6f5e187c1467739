"""DP-FedC's run-config section (``[tool.flwr.app.config.dpfedc]``) and its train-config keys.

The server validates the section at start (:mod:`server.config`); a client reads the same
typed section to load its data (:func:`client.dpfedc.load_client_data`). Each clustering
round's instructions travel as :class:`DPFedCRound` (``keys.DPFEDC_*``), beside the common
:class:`protocol.train_config.TrainConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from privacy.centroid_noise import CALIBRATIONS
from protocol import keys
from protocol.config import decode_fields, kebab, one_of
from tasks.clustering import CLUSTERING_DATASETS, H_STEPS, SPLITS, ClusteringParams


class DPFedCConfig(BaseModel):
    """The run config's ``dpfedc.*`` section (``[tool.flwr.app.config.dpfedc]``).

    Defaults are Table I's MNIST setting (K comes from ``fraction-train`` = K/N, b from
    ``batch-size``). ``rho``/``mu-h`` = 0 mean the paper's 10⁻⁷/10⁻¹⁰ × ‖X‖²_F/N computed
    by the server from the evaluation data's per-sample mean (a public constant).
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    dataset: str = "mnist"
    data_dir: str = ""
    num_samples: int = Field(10_000, ge=1)
    split: str = "iid"
    k: int = Field(10, ge=1)
    q1: int = Field(10, ge=1)
    q2: int = Field(5, ge=0)
    q_hat: int = Field(10, ge=0)
    h_step: str = "safe"
    alpha2: float = Field(5.0, gt=0.0)
    rho: float = Field(0.0, ge=0.0)
    mu_h: float = Field(0.0, ge=0.0)
    calibration: str = "rigorous"
    epsilon_bar: float = Field(20.0, gt=0.0)
    grad_clip: float = Field(0.0, ge=0.0)
    eval_samples: int = Field(2000, ge=10)
    planned_rounds: int = Field(0, ge=0)

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> DPFedCConfig:
        """The section from Flower's flat run config (``dpfedc.*`` keys; absent = defaults)."""
        return cls.model_validate({k.split(".", 1)[1]: v for k, v in run_config.items() if k.startswith("dpfedc.")})

    @field_validator("dataset", "split", "h_step", "calibration")
    @classmethod
    def _choice(cls, v: str, info: ValidationInfo) -> str:
        allowed = {"dataset": CLUSTERING_DATASETS, "split": SPLITS, "h_step": H_STEPS, "calibration": CALIBRATIONS}
        name = str(info.field_name)
        return one_of(f"dpfedc.{kebab(name)}", v, allowed[name])


@dataclass(frozen=True)
class DPFedCRound:
    """DP-FedC's keys of a clustering round's train config (``keys.DPFEDC_*``), typed.

    Attributes
    ----------
    k, rho, mu_h, q1, q2, q_hat, h_step, alpha2 : the round's clustering parameters
        (:class:`tasks.clustering.ClusteringParams`; b is the train config's ``batch-size``).
    calibration : str
        ``"rigorous"``, ``"paper"`` or ``"none"`` (:mod:`privacy.centroid_noise`).
    epsilon_bar : float
        The paper's nominal total ε (its calibration only).
    grad_clip : float
        G, the per-minibatch gradient bound (0: none).
    client_rate : float
        p = K/N of the paper's (32).
    planned_rounds : int
        Rounds a rigorous client plans its noise for (0: all of the run's).
    """

    k: int
    rho: float
    mu_h: float
    q1: int
    q2: int
    q_hat: int = 10
    h_step: str = "safe"
    alpha2: float = 5.0
    calibration: str = "rigorous"
    epsilon_bar: float = 0.0
    grad_clip: float = 0.0
    client_rate: float = 1.0
    planned_rounds: int = 0

    def __post_init__(self) -> None:
        one_of(_key("calibration"), self.calibration, CALIBRATIONS)
        one_of(_key("h_step"), self.h_step, H_STEPS)
        for name in ("rho", "mu_h", "epsilon_bar", "grad_clip"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise ValueError(f"'{_key(name)}' must be a finite number >= 0; found {getattr(self, name)}")
        if not 0 < self.client_rate <= 1 or not 0 < self.alpha2 < float("inf"):
            raise ValueError(f"'{_key('client_rate')}' must be in (0, 1] and '{_key('alpha2')}' > 0; found "
                             f"{self.client_rate}, {self.alpha2}")
        if self.planned_rounds < 0:
            raise ValueError(f"'{_key('planned_rounds')}' must be >= 0; found {self.planned_rounds}")

    def params(self, batch: int) -> ClusteringParams:
        """The client round's :class:`ClusteringParams` (its own checks apply: k, Q₁, Q₂ ...)."""
        return ClusteringParams(k=self.k, rho=self.rho, mu_h=self.mu_h, mu_w=0.0, q1=self.q1, q2=self.q2,
                                q_hat=self.q_hat, batch=batch, h_step=self.h_step, alpha2=self.alpha2)

    def encode(self) -> dict[str, Any]:
        """The train-config entries (merged into the round's ``ConfigRecord`` by the strategy)."""
        return {_key(name): value for name, value in asdict(self).items()}

    @classmethod
    def decode(cls, record: Mapping[str, Any]) -> DPFedCRound:
        """Read the section from a train config; ``ValueError`` naming a missing or bad key."""
        return decode_fields(cls, record, _key, ("k", "rho", "mu_h", "q1", "q2"))


_KEYS = {"k": keys.DPFEDC_K, "rho": keys.DPFEDC_RHO, "mu_h": keys.DPFEDC_MU_H, "q1": keys.DPFEDC_Q1,
         "q2": keys.DPFEDC_Q2, "q_hat": keys.DPFEDC_Q_HAT, "h_step": keys.DPFEDC_H_STEP, "alpha2": keys.DPFEDC_ALPHA2,
         "calibration": keys.DPFEDC_CALIBRATION, "epsilon_bar": keys.DPFEDC_EPSILON_BAR,
         "grad_clip": keys.DPFEDC_GRAD_CLIP, "client_rate": keys.DPFEDC_CLIENT_RATE,
         "planned_rounds": keys.DPFEDC_PLANNED_ROUNDS}


def _key(name: str) -> str:
    return _KEYS[name]
