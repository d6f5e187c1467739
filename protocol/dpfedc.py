"""DP-FedC's run-config section (``[tool.flwr.app.config.dpfedc]``), read by both sides.

The server validates it at start (:mod:`server.config`); a client reads the same typed
section to load its data (:func:`client.dpfedc.load_client_data`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from privacy.centroid_noise import CALIBRATIONS
from protocol.config import kebab, one_of
from tasks.clustering import CLUSTERING_DATASETS, H_STEPS, SPLITS


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
    def from_run_config(cls, run_config: dict) -> DPFedCConfig:
        """The section from Flower's flat run config (``dpfedc.*`` keys; absent = defaults)."""
        return cls.model_validate({k.split(".", 1)[1]: v for k, v in run_config.items() if k.startswith("dpfedc.")})

    @field_validator("dataset", "split", "h_step", "calibration")
    @classmethod
    def _choice(cls, v: str, info: ValidationInfo) -> str:
        allowed = {"dataset": CLUSTERING_DATASETS, "split": SPLITS, "h_step": H_STEPS, "calibration": CALIBRATIONS}
        name = str(info.field_name)
        return one_of(f"dpfedc.{kebab(name)}", v, allowed[name])
