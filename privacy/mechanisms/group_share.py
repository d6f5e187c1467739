"""GDPFed's group share (paper 003, Algorithm 1 lines 7-11): a run of T rounds, pre-charged once.

A sampled client of group m runs τ local SGD steps, clips its update Δ to C, adds its share
N(0, C²σ_m²/r_m) of the group's noise and uploads it. The r_m shares of a group add up to one
Gaussian mechanism with multiplier σ_m on the group's sum, whose members are each sampled with
probability q_m per round, for T rounds: the whole run is the mechanism (σ_m, q_m, T).

**What the ledger charges, and when.** (σ_m, q_m, T), once, before the client's first release
of the run: this triple accounts for every round of the run, sampled or not. Because it was
paid in advance, the client counts its own releases of the run (in its ledger) and refuses any
beyond the T it paid for, and any request of the same run whose (σ_m, q_m, T) differs from the
one it paid for: a server that declared T = 1 cannot collect four releases for the price of
one. No number the server declares can make the client release more than its ledger charged.

**Assumptions of the charge (declared in every result):** the adversary sees only the group's
*sum* (secure aggregation of all r_m shares, or a trusted aggregator) and not who was sampled
(amplification by subsampling). Against a server that chooses the sample, each release is a
Gaussian mechanism with multiplier σ_m on the sum, unamplified; against one that sees single
uploads (a trusted aggregator that is not trusted), σ_m/√r_m.
"""

from __future__ import annotations

from typing import ClassVar

from privacy.accountants import Charge
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger, RunPlan
from privacy.mechanisms.base import Release
from privacy.mechanisms.update import WholeUpdate

__all__ = ["GroupRun", "GroupShare"]


class GroupRun:
    """A GDPFed group's run, paid once (module docstring): the counting and the checks every group share makes.

    A group member's mechanism (:class:`GroupShare`, and the discrete Gaussian one of
    :mod:`privacy.mechanisms.ddg`) reports (q_m, T) as its workload, pays the run's charge at its
    first release, refuses a release beyond T, and refuses a request of the run whose
    (kind, σ_m, q_m, T) differs from what it paid for.
    """

    kind: ClassVar[str]
    noise_multiplier: float
    sample_rate: float
    rounds: int

    @property
    def workload(self) -> tuple[float, int]:
        """(q_m, T): what the reply reports as its sample rate and steps."""
        return self.sample_rate, self.rounds

    def run_release(self, sigma: float, index: int, charges: tuple[Charge, ...]) -> Release:
        """Release ``index`` of the run: ``charges`` at 0, nothing up to T − 1.

        Raises
        ------
        PrivacyBudgetExhausted
            From the (T+1)-th release on.
        """
        if index >= self.rounds:
            raise PrivacyBudgetExhausted(
                f"this run's group mechanism was charged for T={self.rounds} releases and this client has made "
                f"{index}; it refuses more (a run longer than the T it declared)")
        return Release(sigma, self.sample_rate, self.rounds, charges if index == 0 else ())

    def open_run(self, ledger: PrivacyLedger, run_id: int) -> int:
        """Open the run in the ledger with this (σ_m, q_m, T), or check it is the one paid for; the releases made.

        Raises
        ------
        ValueError
            If the run was paid for with another (kind, σ_m, q_m, T): the server changed the group's
            mechanism mid-run.
        """
        run = ledger.run(run_id)
        paid = RunPlan(cap=float("inf"), noise_multiplier=self.noise_multiplier, kind=self.kind,
                       rounds=self.rounds, sample_rate=self.sample_rate)
        if run is None:
            ledger.open_run(run_id, paid)
        elif (run.kind, run.noise_multiplier, run.sample_rate, run.rounds) != (
                paid.kind, paid.noise_multiplier, paid.sample_rate, paid.rounds):
            raise ValueError(
                f"this run's group mechanism was paid for as (sigma={run.noise_multiplier:g}, q={run.sample_rate:g}, "
                f"T={run.rounds}); the server now asks for (sigma={self.noise_multiplier:g}, q={self.sample_rate:g}, "
                f"T={self.rounds}): refused")
        return ledger.releases_in_run(run_id)


class GroupShare(GroupRun, WholeUpdate):
    """The share of group m's noise: σ_m of the sum, r_m shares, sampling q_m, T rounds.

    Parameters
    ----------
    clip : float
        C_m.
    noise_multiplier : float
        σ_m, the multiplier of the group's sum (> 0: the server calibrates the group).
    sample_rate : float
        q_m, each member's sampling probability per round.
    rounds : int
        T, the rounds the run's charge covers.
    noise_shares : int
        r_m: the client adds N(0, C²σ_m²/r_m).
    """

    kind: ClassVar[str] = "group-share"

    def __init__(self, clip: float, noise_multiplier: float, *, sample_rate: float, rounds: int,
                 noise_shares: int) -> None:
        super().__init__(clip, noise_multiplier, None, noise_shares=noise_shares)
        self.sample_rate = sample_rate
        self.rounds = rounds

    def release(self, sigma: float, index: int = 0) -> Release:
        """Release ``index`` of the run: the pre-charge (σ_m, q_m, T) at 0, nothing up to T − 1, refused after."""
        return self.run_release(sigma, index, ((sigma, self.sample_rate, self.rounds),))

    def plan(self, ledger: PrivacyLedger, run_id: int) -> Release:
        """The group's release: the first of the run opens it in the ledger with its (σ_m, q_m, T).

        Raises
        ------
        PrivacyBudgetExhausted
            Beyond the T releases the run paid for.
        ValueError
            If the run was paid for with another (σ_m, q_m, T): the server changed the group's
            mechanism mid-run.
        """
        return self.release(self.noise_multiplier, self.open_run(ledger, run_id))

    def guarantee(self) -> str:
        """Client level, its share of the group's noise, the run charged once."""
        return (f"its clipped update with a 1/{self.noise_shares} share of its group's Gaussian noise; the group's "
                f"run (sigma_m, q_m, T={self.rounds}) is charged once, and the client makes at most {self.rounds} "
                "releases in it")
