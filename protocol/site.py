"""A site's own floors: what its client refuses whatever the server asks.

Every number a client's guarantee depends on is charged as the client itself releases it
(:mod:`privacy.mechanisms`), so no server can make a client overspend its ledger. The floors are
the operator's further say over *how* its budget is spent, checked before any data is touched:

``min-sum-size``
    The fewest members of a secure sum this site's update may leave in: the client enforces
    r_min = max(server's r_min, this) before it trains and again before it helps unmask, and
    charges for it. Default 2: a sum of one member hides nothing.
``min-noise-multiplier``
    The smallest noise multiplier a release may be charged at (0: none).
``max-epsilon-per-release``
    The most ε one release may cost on its own (0: none): a server cannot spend the budget in
    one shot.
``max-releases-per-run``
    The most releases this site makes in one run (0: none).

A deployed site sets them in its SuperNode's ``--node-config`` (validated at start, the key named;
``privet site check`` prints them); in simulation, where the experimenter operates every client,
the run config's ``[tool.flwr.app.config.site]`` section sets them for all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol import keys
from protocol.config import kebab

__all__ = ["FLOOR_KEYS", "SiteFloors"]

#: field -> its node-config key (protocol.keys, where every wire key lives)
FLOOR_KEYS = {"min_sum_size": keys.NODE_MIN_SUM_SIZE, "min_noise_multiplier": keys.NODE_MIN_NOISE_MULTIPLIER,
              "max_epsilon_per_release": keys.NODE_MAX_EPSILON_PER_RELEASE,
              "max_releases_per_run": keys.NODE_MAX_RELEASES_PER_RUN}


class SiteFloors(BaseModel):
    """The floors (module docstring)."""

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, extra="forbid", frozen=True)

    min_sum_size: int = Field(2, ge=1)
    min_noise_multiplier: float = Field(0.0, ge=0.0)
    max_epsilon_per_release: float = Field(0.0, ge=0.0)
    max_releases_per_run: int = Field(0, ge=0)

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> SiteFloors:
        """A deployed site's floors from its node config (absent keys: the defaults).

        Raises
        ------
        ValueError
            Naming the node-config key and what it must be.
        """
        values = {name: node_config[key] for name, key in FLOOR_KEYS.items() if key in node_config}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = kebab(str(err["loc"][0])) if err["loc"] else "(site)"
            raise ValueError(f"node-config '{key}': {err['msg'].lower()}; found {err.get('input')!r}") from None

    def refusal(self, *, charged_sigma: float, release_epsilon: float, releases_in_run: int) -> str | None:
        """Why a release breaks a floor (None: it does not); r_min is enforced by the secure sum."""
        if self.max_releases_per_run and releases_in_run >= self.max_releases_per_run:
            return (f"this site makes at most {self.max_releases_per_run} releases per run (max-releases-per-run) "
                    f"and has made {releases_in_run}")
        if self.min_noise_multiplier and charged_sigma < self.min_noise_multiplier:
            return (f"the release would carry noise multiplier {charged_sigma:.4g}, below this site's "
                    f"min-noise-multiplier {self.min_noise_multiplier:g}")
        if self.max_epsilon_per_release and release_epsilon > self.max_epsilon_per_release:
            return (f"the release alone would cost eps={release_epsilon:.4g}, above this site's "
                    f"max-epsilon-per-release {self.max_epsilon_per_release:g}")
        return None
