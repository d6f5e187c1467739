"""PFA's run-config section (``[tool.flwr.app.config.pfa]``), validated at the edge.

Beside its catalogue entry (:mod:`strategies.catalogue`) and importable without Flower or torch,
so that a config error is reported before anything heavy loads.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from protocol.config import kebab, one_of
from strategies.pfa_projection import NO_PUBLIC_POLICIES
from strategies.pfa_split import SPLIT_METHODS
from strategies.pfa_subspace import SUBSPACE_METHODS

_CHOICES = {"split": SPLIT_METHODS, "subspace_method": SUBSPACE_METHODS, "no_public": NO_PUBLIC_POLICIES}


class PFAConfig(BaseModel):
    """The run config's ``pfa.*`` section (``[tool.flwr.app.config.pfa]``).

    Attributes
    ----------
    k : int
        Projection dimension per layer (Remark 3 recommends 1). Clipped per round to
        the rank of the public updates (≤ n_pub − 1 when centred).
    public_fraction : float
        ``public-fraction``: share of clients taken as public by ``top-fraction``.
    split : str
        ``"top-fraction"`` (authors' code: the ⌈fraction·M⌉ largest ε, ties included)
        or ``"two-cluster"`` (Remark 2: exact 1-D 2-means on ε).
    center : bool
        Centre the public updates and project affinely around their mean (authors'
        code, default) or use the paper's uncentred linear projection (Appendix D.2).
    subspace_method : str
        ``subspace-method``: ``"exact"`` thin SVD or ``"randomized"`` range finder.
    no_public : str
        ``no-public``: a round without a public reply falls back to ``"weiavg"``
        (default), or the sample is redrawn until it holds a public client (``"redraw"``,
        the authors' code; a round whose public clients then fail to reply still falls
        back to WeiAvg), or the run stops (``"error"``).
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    k: int = Field(1, ge=1)
    public_fraction: float = Field(0.1, gt=0.0, le=1.0)
    split: str = "top-fraction"
    center: bool = True
    subspace_method: str = "exact"
    no_public: str = "weiavg"

    @field_validator(*_CHOICES)
    @classmethod
    def _choice(cls, v: str, info: ValidationInfo) -> str:
        name = str(info.field_name)
        return one_of(f"pfa.{kebab(name)}", v, _CHOICES[name])
