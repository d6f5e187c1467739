"""What a privacy mechanism of one client round is, for the client that runs it and the server that checks it.

A :class:`Mechanism` is built from the round's decoded request (:mod:`protocol.train_config`). It

* **plans** the round against the client's ledger before any data is touched
  (:meth:`Mechanism.plan`): σ sent (fixed by the server, or calibrated by the client once per
  run and kept in the ledger with the run's cap), and what this release charges;
* **runs** (:meth:`Mechanism.run`): the local work the client supplies (:class:`LocalWork`),
  then clipping and noise drawn from the client's own :class:`~privacy.randomness.NoiseSource`;
* says what it **charges per release** (:attr:`Release.charges`, ``(σ, q, steps)`` entries of
  :mod:`privacy.accountants`), a function of what the client itself releases: a number the
  server declares (rounds, sum size, σ) is either what the client runs or bounded by it;
* says what **release the server must expect** (:meth:`Mechanism.expected`), so the server can
  reject a reply whose figures it can derive itself and contradict it;
* states its **guarantee** (:meth:`Mechanism.guarantee`): the neighbouring relation is
  replace-one throughout (:mod:`privacy.accountants`), and the sentence says what one ε
  protects (a record or the client's whole dataset) and against whom.

Every number reaching a mechanism has been validated at the edge (the request decoder, the
ledger loader); mechanisms trust their inputs, as dp-accounting's do.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np

from privacy.accountants import Charge
from privacy.calibration import noise_multiplier_for, pfa_closed_form_sigma
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import UNIT_CLIENT, PrivacyLedger, RunPlan
from privacy.policy import MIN_USABLE_FRACTION, is_spent
from privacy.randomness import NoiseSource

__all__ = ["Calibration", "ExpectedRelease", "LocalWork", "Mechanism", "Privatizer", "Release", "Upload"]


@dataclass(frozen=True)
class Release:
    """One release of a mechanism, decided before the client's data is touched.

    Attributes
    ----------
    noise_multiplier : float
        σ the mechanism adds, in units of its clip (what the reply reports).
    sample_rate, steps : float, int
        q and the step count the reply reports (DP-SGD's; 1, 1 for one Gaussian release;
        GDPFed's q_m and T).
    charges : tuple of (σ, q, steps) or CurveStep
        What the ledger records for this release; empty where an earlier release of the run
        already paid for it (GDPFed's pre-charge).
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    charges: tuple[Charge, ...]


@dataclass(frozen=True)
class ExpectedRelease:
    """What the server can derive about one train reply before it arrives.

    Attributes
    ----------
    num_examples : int
        The example count the reply must claim (the handshake's, or its training split).
    noise_multiplier : float or None
        σ the server fixed (None: the client calibrates its own).
    sample_rate, steps : float/int or None
        The mechanism's q and step count where the server can derive them from public figures.
    """

    num_examples: int
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    steps: int | None = None


@dataclass(frozen=True)
class Calibration:
    """How a client sets σ itself when the server sends none (``noise-multiplier = 0``).

    Attributes
    ----------
    rounds : int
        T, the rounds the run plans: σ is calibrated for T releases of this mechanism.
    target_epsilon : float
        ε this run may spend at most (0: all that remains of the budget). With the ε spent
        before the run it makes the run's **cap**, kept in the ledger and enforced on every
        release of the run.
    rule : str
        ``"accountant"`` (the smallest σ the ledger's accountant accepts) or
        ``"pfa-closed-form"`` (the PFA authors' formula, never below the accountant's).
    """

    rounds: int
    target_epsilon: float = 0.0
    rule: str = "accountant"


@dataclass
class Upload:
    """What a round sends: the model arrays (one per layer) and the local work's diagnostics."""

    arrays: list[np.ndarray]
    metrics: dict[str, float] = field(default_factory=dict)


#: ``privatize(received, trained) -> (upload, diagnostics)``: a mechanism's privatisation of what
#: local work produced from the received arrays (the shared part of a personalized model).
Privatizer = Callable[[list[np.ndarray], list[np.ndarray]], tuple[list[np.ndarray], dict[str, float]]]


class LocalWork(Protocol):
    """The client's local training, as a mechanism runs it (supplied by the client app).

    The work knows what is released (a personalized client: its shared part only) and how an
    upload is assembled from it; the mechanism knows how to privatise it.
    """

    def train(self, privatize: Privatizer | None) -> Upload:
        """Non-private local training, then ``privatize`` on what is released (None: as trained)."""

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """DP-SGD local training: every step clips per example and adds N(0, σ²C²) from ``noise``."""


class Mechanism(ABC):
    """A privacy mechanism of one client round (module docstring).

    Subclasses set :attr:`kind` (the registry name), :attr:`unit` and :attr:`ledger_mode`,
    and implement :attr:`workload`, :meth:`run` and :meth:`guarantee`; the charge of a
    release is ``(charged(σ), q, steps)`` unless :meth:`release` says otherwise.

    Attributes
    ----------
    clip : float
        C, the sensitivity unit (per example or per update).
    noise_multiplier : float
        σ the server fixed, or 0: the client calibrates (:attr:`calibration`).
    calibration : Calibration or None
        How σ is calibrated when it is not fixed.
    """

    kind: ClassVar[str]
    #: what one ε protects: "client" (its whole dataset) or "record"
    unit: ClassVar[str] = UNIT_CLIENT
    #: the ledger's record of the release's mode (what :meth:`PrivacyLedger.unit` reads)
    ledger_mode: ClassVar[str] = "update"
    private: ClassVar[bool] = True

    def __init__(self, clip: float, noise_multiplier: float, calibration: Calibration | None = None) -> None:
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.calibration = calibration

    # ------------------------------------------------------------------ the release
    @property
    @abstractmethod
    def workload(self) -> tuple[float, int]:
        """(q, steps) of one release, from public figures only."""

    def charged(self, sigma: float) -> float:
        """σ the ledger charges for σ sent (σ; σ/√m per upload seen alone; σ√(r_min/m) inside a secure sum)."""
        return sigma

    @property
    def scale(self) -> float:
        """σ charged per unit of σ sent: a calibrated (charged) σ is sent as σ / scale."""
        return self.charged(1.0)

    def release(self, sigma: float, index: int = 0) -> Release:
        """The ``index``-th release of the run (0-based) with σ sent: charged ``(charged(σ), q, steps)``.

        Raises
        ------
        PrivacyBudgetExhausted
            Where the mechanism allows no more releases in this run (GDPFed beyond T).
        """
        rate, steps = self.workload
        return Release(sigma, rate, steps, ((self.charged(sigma), rate, steps),))

    def plan(self, ledger: PrivacyLedger, run_id: int) -> Release:
        """The round's release, planned against the client's ledger.

        σ fixed by the server is taken as is (the charge follows from it). Otherwise σ is
        calibrated once per run: the smallest σ for which the ledger's history before the run
        composed with T releases stays within the run's cap ``min(budget, spent before +
        target ε)``; the cap and σ are kept in the ledger under the run id
        (:meth:`PrivacyLedger.open_run`), so a restarted client continues the run under the
        same cap instead of re-basing it on a ledger that already holds the run's rounds.
        Planning for every round of the run is conservative where the client is not sampled
        in all of them.

        Raises
        ------
        PrivacyBudgetExhausted
            If less than ``MIN_USABLE_FRACTION`` of the budget remains to calibrate from.
        ValueError
            If no σ reaches the remainder.
        """
        index = ledger.releases_in_run(run_id)
        if self.noise_multiplier > 0 or not self.private:
            return self.release(self.noise_multiplier, index)
        run = ledger.run(run_id)
        if run is None:
            run = self._calibrate(ledger)
            ledger.open_run(run_id, run)
        return self.release(run.noise_multiplier / self.scale, index)

    def _calibrate(self, ledger: PrivacyLedger) -> RunPlan:
        assert self.calibration is not None, f"{self.kind}: no noise multiplier and no calibration"
        before = ledger.spent()
        if is_spent(before, ledger.epsilon_budget):
            raise PrivacyBudgetExhausted(
                f"spent eps={before:.4f} of {ledger.epsilon_budget:g}: less than "
                f"{MIN_USABLE_FRACTION:.0%} remains, too little for a useful round")
        target = self.calibration.target_epsilon
        cap = ledger.epsilon_budget if target <= 0 else min(ledger.epsilon_budget, before + target)
        rate, steps = self.workload
        total = steps * self.calibration.rounds
        charged = noise_multiplier_for(cap, ledger.delta, rate, total, accountant=ledger.conversion(self.ledger_mode),
                                       prior_history=ledger.charges())
        if self.calibration.rule == "pfa-closed-form":  # the PFA authors' σ, never below the budget's
            charged = max(charged, pfa_closed_form_sigma(cap - before, ledger.delta, rate, total) * self.scale)
        return RunPlan(cap=cap if target > 0 else math.inf, noise_multiplier=charged, kind=self.kind,
                       rounds=self.calibration.rounds)

    def expected(self, num_examples: int) -> ExpectedRelease:
        """What the server can derive about the reply: the σ it fixed, q and the steps."""
        rate, steps = self.workload
        sigma = self.noise_multiplier if self.noise_multiplier > 0 else None
        return ExpectedRelease(num_examples, sigma, rate, steps)

    # ------------------------------------------------------------------ running
    def settle(self, release: Release, upload: Upload) -> Release:
        """The release as it happened (default: as planned; DP-SGD charges the steps its work took)."""
        return release

    @abstractmethod
    def run(self, work: LocalWork, release: Release, noise: NoiseSource) -> Upload:
        """Do the round's local work and privatise what it releases, with noise from ``noise``."""

    @abstractmethod
    def guarantee(self) -> str:
        """The "via …" part of the client's guarantee sentence."""
