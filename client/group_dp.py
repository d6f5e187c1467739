"""Client side of GDPFed / GDPFed+ (paper 003, Algorithm 1 lines 7-11).

A sampled client of group m runs τ local SGD iterations, clips its update Δ to L2 norm C,
adds its share N(0, C²σ_m²/r_m · I) of the group's noise, drawn from the client's own
:class:`privacy.randomness.NoiseSource`, and uploads θ^t + Δ̃. The r_m shares of a group add
up to one Gaussian mechanism with multiplier σ_m on the group's sum, whose clients are each
sampled with probability q_m per round, for T rounds.

**What the ledger charges.** The group's whole-run mechanism (σ_m, q_m, T), once per run,
at the client's first participation (before its first upload leaves): its data is not
touched before, and this triple already accounts for every round of the run, sampled or
not, so later rounds of the same run charge nothing more. σ_m was calibrated by the server
to ε_m = min ε of the group, so ε(σ_m, q_m, T) <= ε_m <= the client's own ε; the client
checks it against its own ledger (``would_exceed``) before training, and refuses otherwise.

**Assumptions of this charge (declared in every result):** the server sees only the
group's *sum* (secure aggregation, or a trusted aggregator) and the set of sampled clients
is not known to the adversary (amplification by subsampling). Against a server that sees
individual uploads, one upload carries only multiplier σ_m/√r_m.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from client.training import LocalTrainingConfig, local_sgd
from privacy.accountants import Step
from privacy.ledger import PrivacyLedger
from privacy.mechanisms import privatize_update
from privacy.randomness import NoiseSource
from protocol import keys
from protocol.train_config import TrainConfig
from tasks.datasets import ArrayDataset
from tasks.models import get_weights, set_weights

#: The ledger mode of a GDPFed release (client-level: the whole update is clipped).
GROUP_LEDGER_MODE = keys.DP_UPDATE


@dataclass(frozen=True)
class GroupMechanism:
    """The group's whole-run mechanism as the server sent it.

    Attributes: σ_m (multiplier of the group sum), q_m, T, r_m (noise shares), C, m.
    """

    noise_multiplier: float
    sample_rate: float
    rounds: int
    shares: int
    clip: float
    group: int

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> GroupMechanism:
        """The mechanism of a group round (``cfg.group_round``); ValueError naming the key if unusable."""
        if not cfg.noise_multiplier > 0:
            raise ValueError(f"'{keys.NOISE_MULTIPLIER}' must be > 0 for a group round; found {cfg.noise_multiplier}")
        return cls(cfg.noise_multiplier, cfg.group_sample_rate, cfg.num_rounds, cfg.noise_shares, cfg.clip,
                   cfg.group_index)

    @property
    def step(self) -> Step:
        """(σ_m, q_m, T): what the ledger charges for the run."""
        return (self.noise_multiplier, self.sample_rate, self.rounds)


def charge_for_run(ledger: PrivacyLedger, mechanism: GroupMechanism, run_id: int) -> list[Step]:
    """``[(σ_m, q_m, T)]`` if this run has not been charged to the ledger yet, else ``[]``."""
    already = any(r == run_id and m == GROUP_LEDGER_MODE for r, m in zip(ledger.run_ids, ledger.modes))
    return [] if already else [mechanism.step]


def train_group_update(
    model: nn.Module,
    data: ArrayDataset,
    local: LocalTrainingConfig,
    mechanism: GroupMechanism,
    noise: NoiseSource,
) -> dict[str, float]:
    """τ local iterations, clip to C, add N(0, C²σ_m²/r_m) from ``noise``; ``model`` ends at θ^t + Δ̃.

    Returns the (uncovered) training diagnostics; the ledger charge is :func:`charge_for_run`'s.
    """
    start = [w.copy() for w in get_weights(model)]
    metrics = local_sgd(model, data, local)
    update = [w - w0 for w, w0 in zip(get_weights(model), start)]
    noisy, diag = privatize_update(update, clip=mechanism.clip, noise_multiplier=mechanism.noise_multiplier,
                                   noise_shares=mechanism.shares, rng=noise)
    set_weights(model, [w0 + u for w0, u in zip(start, noisy)])
    return {**metrics, **diag}
