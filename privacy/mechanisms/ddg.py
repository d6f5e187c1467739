"""The distributed discrete Gaussian share: a client's update as integers with exact noise, inside a secure sum.

``secure-aggregation = "secagg+ddg"`` (Kairouz, Liu & Steinke, ICML 2021; the arithmetic is
:mod:`privacy.distributed_discrete_gaussian`). A member of a sum of n clients

1. clips its update Δ to ‖Δ‖₂ <= C, scales it by s, rotates it with the randomised Hadamard
   transform R (signs from a seed all members derive from each other's signed keys, never from a
   number the server picks), and rounds it to integers, again until ‖x̃‖₂² <= B² (checked
   exactly, in integer arithmetic);
2. adds N_Z(0, σ²)^{d'} drawn exactly (:mod:`privacy.discrete_gaussian`: integer and rational
   arithmetic only) from its own noise source (its CSPRNG);
3. hands (x̃ + z) mod 2^b to the secure sum, which masks it (:mod:`client.secure_sum`).

The server learns Σ_i (x̃_i + z_i) mod 2^b over the r >= r_min survivors and nothing else, lifts
it to [−2^{b−1}, 2^{b−1}), rotates it back and divides by s. s, σ², B and b come from the sum's
parameters (:func:`privacy.distributed_discrete_gaussian.ddg_parameters`: σ² = ⌈z²C²s²/m⌉, so m
shares make the central noise of the continuous ``secure-share`` with multiplier z), which every
member recomputes and signs.

**What is charged.** The released integer sum is exactly the mechanism analysed: one member
replaced by another moves it by Δ ∈ Z^{d'} with ‖Δ‖₂ <= 2B (B enforced exactly, whatever the
float arithmetic before the rounding did), under the sum of at least r_min independent
N_Z(0, σ²)^{d'} shares (at most n: τ grows with the count). KLS's bound (their Theorem 1 /
eq. 17; :func:`~privacy.ddg_accounting.rdp_of_sum`) is a Rényi-DP curve; the
ledger charges the Gaussian step (σ_eq, 1, 1) whose curve lies on or above it at every order
the RDP accountant uses (:func:`~privacy.ddg_accounting.gaussian_equivalent_multiplier`),
with r_min = max(the server's, the site's ``min-sum-size``), and a ledger holding such a release
converts its whole history through RDP (:data:`privacy.ledger.RDP_ONLY_MODES`): RDP dominance
does not imply dominance of the privacy profile, so no PLD accountant ever sees the step. The
server recomputes the same step from the parameters it set, and the run's accountant must be
``rdp`` (config validation), so both sides convert alike.

**Not covered.** The wall time of the round: the rejection sampler and the rounding retries take
random time (the retries depend on the update's norm), visible to whoever times the client; and,
as for every secure sum, a malicious member can send any vector in [0, 2^b)^{d'} (only a gross one
fails the server's norm check). Wrap-around mod 2^b is a utility event (the released sum is a
function of the charged one whatever happens), with a probability the run's summary states.

**A GDPFed group as one distributed discrete Gaussian sum** (:class:`GroupDiscreteGaussianShare`, kind
``group-ddg``). GDPFed charges a group's whole run once, (mechanism, q_m, T), with amplification by the
server's sampling of r_m of the group's |G_m| members. A Gaussian step that dominates KLS's curve
unsampled does not dominate it once subsampled, so this share charges the curve itself: the ledger step
:class:`privacy.poisson_rdp.DDGPoissonStep` (KLS's bound at the sum's σ², B², d', n_min = the client's
floor, τ at n_max; Zhu & Wang's general Poisson-subsampling bound; replace-one through the zero-out
neighbour), T releases, paid at the run's first release as :class:`~privacy.mechanisms.GroupShare` pays
(σ_m, q_m, T). Every later release of the run must come from a sum whose parameters give the same step
(the client finds the step it paid for in its ledger, or refuses), and at most T releases are made.

**The float-noise paths (issue 39, item 3): kept, with the report's line.** DP-SGD (Opacus) and
``update`` mode without secure sums still add float Gaussian noise, and the report keeps "floating-
point attacks on the Gaussian sampler are not countered" for them. Snapping (Mironov, CCS 2012)
is proven for the Laplace mechanism: for the Gaussian it would need a new analysis of the rounded,
clamped output with its own δ, and for DP-SGD a fork of Opacus' optimizer, whose noise is added to
float32 gradients deep inside its step. The exact mechanism is offered where the noise is released
directly and the integer accounting is proven: this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from privacy.ddg_accounting import gaussian_equivalent_multiplier
from privacy.distributed_discrete_gaussian import DDGParameters, encode
from privacy.ledger import DDG_MODE, GROUP_DDG_MODE, PrivacyLedger
from privacy.mechanisms.base import LocalWork, Mechanism, Release, Upload
from privacy.mechanisms.gaussian import CLIPPED, NON_FINITE, UPDATE_NORM, finite_or_zero
from privacy.mechanisms.group_share import GroupRun
from privacy.poisson_rdp import DDGPoissonStep
from privacy.randomness import NoiseSource

__all__ = ["DDGSum", "GroupDiscreteGaussianShare", "SecureDiscreteGaussianShare"]


@dataclass(frozen=True)
class DDGSum:
    """What a member of one distributed-discrete-Gaussian sum runs with.

    Attributes
    ----------
    params : DDGParameters
        The sum's scale, noise, norm bound and modulus, as every member signed them.
    rotation_seed : bytes
        The rotation's seed, derived by every member from all members' signed keys
        (:func:`protocol.secure_sum.rotation_seed`); empty on the server's side, which never encodes.
    """

    params: DDGParameters
    rotation_seed: bytes = b""


class SecureDiscreteGaussianShare(Mechanism):
    """A member's integer input to a secure sum with a discrete Gaussian share (module docstring).

    Parameters
    ----------
    clip, noise_multiplier : float
        C and z, the central noise multiplier the sum's parameters were built from.
    noise_shares : int
        m: each share is N_Z(0, ⌈z²C²s²/m⌉).
    min_survivors : int
        r_min, the fewest shares a released sum holds.
    ddg : DDGSum
        The sum's parameters (and, on the client, the rotation seed).
    """

    kind: ClassVar[str] = "secure-ddg"
    ledger_mode: ClassVar[str] = DDG_MODE

    def __init__(self, clip: float, noise_multiplier: float, *, noise_shares: int, min_survivors: int,
                 ddg: DDGSum) -> None:
        super().__init__(clip, noise_multiplier, None)
        self.noise_shares, self.min_survivors, self.ddg = noise_shares, min_survivors, ddg
        params = ddg.params
        self._charged = gaussian_equivalent_multiplier(
            local_sigma_sq=params.local_sigma_sq, norm_bound_sq=params.norm_bound_sq, padded_dim=params.padded_dim,
            min_shares=min_survivors, max_shares=max(min_survivors, params.max_members))

    @property
    def workload(self) -> tuple[float, int]:
        """One release per round, q = 1: the server knows who took part."""
        return 1.0, 1

    def charged(self, sigma: float) -> float:
        """σ_eq of the sum's parameters (eq. 4 of :mod:`privacy.distributed_discrete_gaussian`).

        The parameters were built from the σ sent (z); what is charged is a function of what the
        client runs with them: its σ² per share, its norm bound B², d', r_min and n.
        """
        return self._charged

    def run(self, work: LocalWork, release: Release, noise: NoiseSource) -> Upload:
        """Plain local training; the update leaves as one integer vector (x̃ + z) mod 2^b of length d'."""
        return _run_share(self.ddg, work, noise)

    def guarantee(self) -> str:
        """Client level, exact integer noise inside a secure sum of at least r_min inputs."""
        p = self.ddg.params
        return (f"its clipped update, scaled, randomly rotated and rounded to integers of norm <= B exactly, with "
                f"a discrete Gaussian share N_Z(0, sigma^2 = {float(p.local_sigma_sq):.6g}) drawn exactly (integer "
                f"arithmetic, its own CSPRNG), released only inside a secure sum (SecAgg+) mod 2^{p.bits} of at least "
                f"{self.min_survivors} clients' inputs; the released integer sum is the mechanism accounted "
                f"(Kairouz, Liu & Steinke 2021, converted through RDP), charged as noise multiplier "
                f"{self._charged:.6g} (the Gaussian whose RDP curve dominates it); nothing before the sum is outside "
                "the accounting")


def _run_share(ddg: DDGSum, work: LocalWork, noise: NoiseSource) -> Upload:
    """Local training, then the update as (x̃ + z) mod 2^b of length d' (the module docstring's steps 1-3)."""
    if not ddg.rotation_seed:
        raise ValueError("a distributed discrete Gaussian share needs the rotation seed its sum's members agreed")

    def privatize(received: list[np.ndarray], trained: list[np.ndarray]) -> tuple[list[np.ndarray],
                                                                                      dict[str, float]]:
        layers, zeroed = finite_or_zero([np.asarray(t, np.float64) - np.asarray(r, np.float64)
                                         for t, r in zip(trained, received, strict=True)])
        encoded, diag = encode(np.concatenate([a.ravel() for a in layers]), ddg.params, ddg.rotation_seed, noise)
        return [encoded], {UPDATE_NORM: diag["norm"], CLIPPED: diag["clipped"], NON_FINITE: float(zeroed)}

    return work.train(privatize)


class GroupDiscreteGaussianShare(GroupRun, Mechanism):
    """A GDPFed group member's discrete Gaussian share; the run charged once by its RDP curve (module docstring).

    Parameters
    ----------
    clip, noise_multiplier : float
        C_m and σ_m, the central multiplier the sum's parameters were built from (what the reply reports).
    sample_rate : float
        q_m, each member's sampling probability per round.
    rounds : int
        T, the releases the run's charge covers.
    noise_shares : int
        r_m: each share is N_Z(0, ⌈σ_m²C²s²/r_m⌉).
    min_survivors : int
        The fewest shares a released group sum holds (the client's floor, r_m for a GDPFed group).
    ddg : DDGSum
        The round's sum parameters (and, on the client, the rotation seed).
    """

    kind: ClassVar[str] = "group-ddg"
    ledger_mode: ClassVar[str] = GROUP_DDG_MODE

    def __init__(self, clip: float, noise_multiplier: float, *, sample_rate: float, rounds: int, noise_shares: int,
                 min_survivors: int, ddg: DDGSum) -> None:
        super().__init__(clip, noise_multiplier, None)
        self.sample_rate, self.rounds, self.noise_shares, self.min_survivors = (sample_rate, rounds, noise_shares,
                                                                                min_survivors)
        self.ddg = ddg
        p = ddg.params
        self.step = DDGPoissonStep(float(p.local_sigma_sq), p.norm_bound_sq, p.padded_dim, min_survivors,
                                   max(min_survivors, p.max_members), sample_rate, rounds)

    def release(self, sigma: float, index: int = 0) -> Release:
        """Release ``index`` of the run: the curve step (T releases) at 0, nothing up to T − 1, refused after."""
        return self.run_release(sigma, index, (self.step,))

    def plan(self, ledger: PrivacyLedger, run_id: int) -> Release:
        """The group's release: the first of the run pays the curve step; later ones must be the step paid for.

        Raises
        ------
        PrivacyBudgetExhausted
            Beyond the T releases the run paid for.
        ValueError
            If the run was paid for with another (σ_m, q_m, T), or this round's sum parameters give another
            step than the one the ledger holds: the server changed the group's mechanism mid-run.
        """
        index = self.open_run(ledger, run_id)
        if index > 0 and not any(h.key == self.step.key for h in ledger.curves):
            raise ValueError(f"this round's sum gives the step {self.step.describe()}, which this run did not pay "
                             "for (the server changed the sum's parameters mid-run): refused")
        return self.release(self.noise_multiplier, index)

    def run(self, work: LocalWork, release: Release, noise: NoiseSource) -> Upload:
        """Plain local training; the update leaves as one integer vector (x̃ + z) mod 2^b of length d'."""
        return _run_share(self.ddg, work, noise)

    def guarantee(self) -> str:
        """Client level, exact integer noise inside its group's secure sum, the run charged once by its RDP curve."""
        p = self.ddg.params
        return (f"its clipped update, scaled, randomly rotated and rounded to integers of norm <= B exactly, with a "
                f"discrete Gaussian share N_Z(0, sigma^2 = {float(p.local_sigma_sq):.6g}) drawn exactly (its own "
                f"CSPRNG), released only inside its group's secure sum (SecAgg+) mod 2^{p.bits} of "
                f"{self.noise_shares} inputs; the group's run (q_m={self.sample_rate:g}, T={self.rounds}) is charged "
                "once by Kairouz, Liu & Steinke's RDP bound amplified by Poisson sampling (Zhu & Wang 2019, Thm. 6; "
                "replace-one through the zero-out neighbour), converted through RDP, and the client makes at most "
                f"{self.rounds} releases in it")
