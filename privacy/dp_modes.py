"""The DP modes, one object each: what a round releases, what is charged, how it is stated.

A client's round under mode M releases one mechanism, a q-subsampled Gaussian run for some
number of steps; both sides derive it from public figures only (the example count n is
public under replace-one):

========  ===============================================  ==============  ===========================
mode      mechanism of one round                           q, steps        σ charged for σ sent
========  ===============================================  ==============  ===========================
dpsgd     DP-SGD on the client's records (Opacus)           1/⌈n/B⌉,        σ
                                                            E·⌈n/B⌉
update    the whole update clipped to C, N(0, σ²C²/m)       1, 1            σ/√m per upload seen alone;
          added by each of m noise shares                                   σ·√(r_min/m) inside a secure
                                                                            sum of ≥ r_min uploads
none      nothing private                                   1, 1            0 (ε = ∞)
========  ===============================================  ==============  ===========================

The client plans and charges with these objects (:mod:`client.round_plan`), the server
derives what it expects and recomputes what it books with the same ones
(:mod:`strategies.base`), and the report states the guarantee with :meth:`DPMode.mechanism`
(:mod:`server.results`). Modes to come (clustering, distributed discrete Gaussian) add one
object here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from privacy.mechanisms import dpsgd_sample_rate, dpsgd_steps_per_round
from privacy.secure_sum import charged_multiplier

__all__ = ["DP_MODES", "DPMode", "dp_mode"]


@dataclass(frozen=True)
class DPMode:
    """One DP mode: its release per round, its charge and its sentence in the report.

    Attributes
    ----------
    name : str
        The run-config value (``dp-mode``).
    private : bool
        Whether anything is charged (``none`` is not).
    per_record : bool
        DP-SGD's mechanism depends on the client's workload (n, batch, epochs); the others
        release one Gaussian mechanism per round whatever the workload.
    unit : str
        What one ε protects: ``"record"`` or ``"client"`` (its whole dataset).
    """

    name: str
    private: bool
    per_record: bool
    unit: str

    @property
    def whole_update(self) -> bool:
        """The client clips and noises its whole update once per round (client-level DP)."""
        return self.private and not self.per_record

    def release(self, num_examples: int, batch_size: int, epochs: int, local_steps: int = 0) -> tuple[float, int]:
        """(q, steps) of one round: DP-SGD's 1/⌈n/B⌉ and E·⌈n/B⌉ (or τ), otherwise (1, 1).

        τ = ``local_steps`` replaces E·⌈n/B⌉ when it is > 0.
        """
        if not self.per_record:
            return 1.0, 1
        return (dpsgd_sample_rate(num_examples, batch_size),
                dpsgd_steps_per_round(num_examples, batch_size, epochs, local_steps))

    def charged(self, sigma: float, noise_shares: int = 1, min_survivors: int | None = None) -> float:
        """The noise multiplier the ledger charges for σ sent (table above).

        In ``update`` mode each of m = ``noise_shares`` uploads carries σ/√m; a sum of r of
        them carries σ·√(r/m). Seen alone (no secure aggregation) an upload is charged
        σ/√m; released only inside a secure sum of at least r_min = ``min_survivors``
        inputs, σ·√(r_min/m) (:func:`privacy.secure_sum.charged_multiplier`).
        """
        if not self.private:
            return 0.0
        if self.per_record:
            return sigma
        if min_survivors:
            return charged_multiplier(sigma, noise_shares, min_survivors)
        return sigma / math.sqrt(noise_shares)

    def mechanism(self, noise_shares: int = 1, secure_floor: int = 0) -> str:
        """The guarantee sentence's "via …" part for this mode."""
        if not self.private:
            return "no noise (non-private)"
        if self.per_record:
            return "DP-SGD with Poisson sampling"
        share = "local Gaussian noise" if noise_shares == 1 else f"a 1/{noise_shares} share of the Gaussian noise"
        if not secure_floor:
            return f"its clipped update with {share}, charged per upload (no secure aggregation)"
        return (f"its clipped update with {share}, released only inside a secure sum (SecAgg+) of at least "
                f"{secure_floor} clients' updates and charged as noise multiplier sigma*sqrt({secure_floor}/"
                f"{noise_shares}); the quantisation before the sum (stochastic rounding, clipping with "
                "probability <= secagg.clip-probability) is outside the accounting")


#: ``dp-mode`` value -> its mode; the values are :data:`protocol.keys.DP_MODES`' strings.
DP_MODES: Final[dict[str, DPMode]] = {
    "dpsgd": DPMode("dpsgd", private=True, per_record=True, unit="record"),
    "update": DPMode("update", private=True, per_record=False, unit="client"),
    "none": DPMode("none", private=False, per_record=False, unit="client"),
}


def dp_mode(name: str) -> DPMode:
    """The mode called ``name``; a ValueError naming ``dp-mode`` and the allowed values otherwise."""
    if name not in DP_MODES:
        raise ValueError(f"'dp-mode' must be one of {', '.join(DP_MODES)}; found {name!r}")
    return DP_MODES[name]
