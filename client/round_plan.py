"""The mechanism of one round, decided before training so that it can be checked.

:func:`plan_round` turns the server's train config and the client's ledger into σ sent,
σ charged, q and steps; :func:`client_seed` and :func:`noise_for` give the round's
non-DP seed and its DP randomness.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

import numpy as np
from flwr.app import ConfigRecord, Context

from client.personalization import dpsgd_workload
from client.profile import ClientProfile
from privacy.calibration import noise_multiplier_for, pfa_closed_form_sigma
from privacy.dp_modes import dp_mode
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger
from privacy.policy import MIN_USABLE_FRACTION, is_spent
from privacy.randomness import NoiseSource, noise_source
from protocol.train_config import TrainConfig

log = logging.getLogger("privet.client")

#: ``context.state`` record holding the σ calibrated for the current run
CALIBRATION_KEY = "privet.calibration"


def client_seed(run_seed: int, partition_id: int, server_round: int) -> int:
    """Per-(client, round) seed derived from the run's root seed.

    Seeds only what is *not* DP randomness (weight init, shuffling and dropout of plain
    local SGD), and the noise of ``noise-source = "seeded"``, which the reports declare
    void against whoever knows the run seed.
    """
    return int(np.random.SeedSequence([run_seed, partition_id, server_round]).generate_state(1)[0])


def noise_for(profile: ClientProfile, seed: int) -> NoiseSource:
    """The client's DP randomness for one round (:mod:`privacy.randomness`)."""
    return noise_source(profile.noise_source, seed if profile.noise_source == "seeded" else None)


@dataclass(frozen=True)
class RoundPlan:
    """The mechanism one round will run, known before training so it can be checked."""

    noise_multiplier: float  # σ sent to the mechanism
    charged_multiplier: float  # σ the ledger charges (update mode: σ/√m, or σ·√(r_min/m) in a secure sum)
    sample_rate: float
    steps: int


def plan_round(
    cfg: TrainConfig,
    ledger: PrivacyLedger,
    context: Context,
    num_examples: int,
    min_survivors: int | None = None,
) -> RoundPlan:
    """Decide σ for this round: fixed from the server, or calibrated once per run.

    The mode's :class:`~privacy.dp_modes.DPMode` gives q, the steps and the charge: in
    ``update`` mode σ/√m for an upload the server sees on its own, and σ·√(r_min/m) for one
    that leaves only inside a secure sum of at least ``min_survivors`` = r_min inputs; a
    calibrated σ is the charged one scaled back to what the mechanism adds.

    Calibration (when the server sends ``noise-multiplier = 0``) finds the smallest σ for
    which the ledger's history *before this run* composed with ``num-rounds`` rounds of
    this client's mechanism stays within ``min(budget, spent_before + target-epsilon)``.
    Planning for every round of the run is conservative when the client is not sampled in
    all of them. Under ``calibration = "pfa-closed-form"`` σ is raised to the PFA authors'
    formula for the ε this run may spend (never lowered: the ledger charges the true ε). The
    result is cached in ``context.state`` for the rest of the run.
    """
    mode = dp_mode(cfg.dp_mode)
    if not mode.private:
        return RoundPlan(0.0, 0.0, 1.0, 1)
    num_examples, epochs = dpsgd_workload(cfg, num_examples)  # what DP-SGD trains on (personalization)
    rate, steps = mode.release(num_examples, cfg.batch_size, epochs, cfg.local_steps)
    # charged = scale · sent (privacy.dp_modes: 1, 1/√m per upload, √(r_min/m) in a secure sum)
    scale = mode.charged(1.0, cfg.noise_shares, min_survivors)
    fixed = cfg.noise_multiplier
    if fixed > 0:
        return RoundPlan(fixed, fixed * scale, rate, steps)

    run_key = f"{context.run_id}"
    cached = context.state.get(CALIBRATION_KEY)
    if isinstance(cached, ConfigRecord) and cached.get("run-id") == run_key:
        charged = float(cast(float, cached["sigma"]))
    else:
        target = cfg.target_epsilon
        before = ledger.spent()
        if is_spent(before, ledger.epsilon_budget):
            raise PrivacyBudgetExhausted(
                f"spent eps={before:.4f} of {ledger.epsilon_budget:g}: less than "
                f"{MIN_USABLE_FRACTION:.0%} remains, too little for a useful round"
            )
        cap = ledger.epsilon_budget if target <= 0 else min(ledger.epsilon_budget, before + target)
        charged = noise_multiplier_for(
            cap,
            ledger.delta,
            rate,
            steps * cfg.num_rounds,
            accountant=ledger.accountant,
            prior_history=list(ledger.history),
        )
        if cfg.calibration == "pfa-closed-form":  # the PFA authors' σ, never below what the budget needs
            closed = pfa_closed_form_sigma(cap - before, ledger.delta, rate, steps * cfg.num_rounds) * scale
            log.info("pfa-closed-form sigma=%.4f (charged), the accountant's %.4f", closed, charged)
            charged = max(charged, closed)
        context.state[CALIBRATION_KEY] = ConfigRecord({"run-id": run_key, "sigma": charged})
        log.info("calibrated sigma=%.4f for cap eps=%.3f (q=%.4f, %d steps/round)", charged, cap, rate, steps)
    return RoundPlan(charged / scale, charged, rate, steps)
