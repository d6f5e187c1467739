"""``privet audit``'s ``ddg-sum`` game: the distributed discrete Gaussian secure sum, client level, as decoded.

``secure-aggregation = "secagg+ddg"`` (:class:`privacy.mechanisms.SecureDiscreteGaussianShare`,
:mod:`privacy.distributed_discrete_gaussian`): each member of a sum clips its update to C, scales
it by s, rotates it with the randomised Hadamard transform, rounds it conditionally to integers of
norm <= B, adds N_Z(0, σ²) drawn exactly from its own noise source and hands (x̃ + z) mod 2^b to the
secure sum. The server learns only Σ_i (x̃_i + z_i) mod 2^b over the r survivors, and decodes it
(:func:`~privacy.distributed_discrete_gaussian.decode`: lift to [−2^{b−1}, 2^{b−1}), rotate back,
divide by s).

The game: sums of r_min canary clients (the fewest a released sum holds, so the least noise the
charge allows), each canary's update S·2C·u (u orthonormal random directions of a stand-in update
of :data:`privet.audit_games.STAND_IN_DIM` coordinates, S = ±1 its secret). The sum's parameters are
the ones the server builds for a sum of that many members (:func:`~privacy.distributed_discrete_gaussian.ddg_parameters`
from the run's ``secagg.*`` section, as :meth:`strategies.secure_rounds.SecureRounds.parameters`
does), the rotation seed is one the members would agree on (the white-box adversary knows it, as
the server does). Each member runs the client's own steps (:func:`client.release.client_release`:
the plan against a fresh ledger of its budget, the mechanism's ``run`` with the client's noise
source, the charge of σ_eq through RDP); SecAgg+'s masking is not run (its output is the sum mod
2^b, which is what is summed here). A sum with fewer than r_min members that released is not
released. The server asks for ``extension`` times the T rounds it declared.

The attack scores each canary by ⟨decoded sum, u⟩ / C summed over rounds: the rotation, the
rounding and the discrete noise are all in what it reads, as the server reads it. As in every game,
a server that knows the run seed regenerates ``seeded`` members' shares (:func:`replayed_share`),
subtracts them from the sum mod 2^b, and keeps the result where it explains the sum.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import numpy as np

from client.release import client_release
from privacy.auditing import canary_cosines
from privacy.discrete_gaussian import discrete_gaussian
from privacy.distributed_discrete_gaussian import DDGParameters, ddg_parameters, decode
from privacy.ledger import PrivacyLedger
from privacy.mechanism_audit import Observation
from privacy.mechanisms import DDGSum, Mechanism
from privacy.randomness import NoiseSource
from privet.audit_games import CANARY_NORM, STAND_IN_DIM, CanaryWork, Game, explained, most_charged, unit_rows
from privet.audit_setup import (
    RUN_ID,
    AuditConfigError,
    AuditSetup,
    MechanismHook,
    client_noise,
    fresh_ledger,
    server_replay,
)

__all__ = ["DDG_OBSERVES", "DDG_SUM", "ddg_game", "ddg_sum_parameters", "replayed_share"]

#: What the ``ddg-sum`` game's adversary sees.
DDG_OBSERVES: Final = ("only the decoded sum of r_min canary clients' discrete Gaussian inputs mod 2^b per round "
                       "(lifted, rotated back and unscaled, as the server decodes it)")


def ddg_sum_parameters(setup: AuditSetup, members: int, dim: int) -> DDGParameters:
    """The parameters the server builds for a ``secagg+ddg`` sum of ``members`` inputs of ``dim`` coordinates.

    Raises
    ------
    AuditConfigError
        Where ``secagg.bits`` cannot hold such a sum (the message names the knob).
    """
    section = setup.strategy.secure_aggregation
    train = setup.train
    try:
        return ddg_parameters(clip=train.clip, dim=dim, bits=section.bits, noise_multiplier=train.noise_multiplier,
                              noise_shares=train.noise_shares, max_members=max(members, 2), beta=section.beta,
                              wrap_probability_target=section.wrap_probability)
    except ValueError as exc:
        raise AuditConfigError(f"secagg.bits = {section.bits}: {exc}") from None


def replayed_share(replay: NoiseSource, params: DDGParameters) -> np.ndarray:
    """A seeded member's discrete Gaussian share as a server that knows the run seed regenerates it.

    :func:`~privacy.distributed_discrete_gaussian.encode` draws d' uniforms for the rounding, again
    on each retry, then the noise: the replay assumes one try (the usual case), and is kept only where
    it explains the sum (a member that retried makes the replay wrong, and the raw sum is used).
    """
    replay.uniform(params.padded_dim)
    return np.asarray(discrete_gaussian(params.padded_dim, params.local_sigma_sq, replay), dtype=np.int64)


def ddg_game(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
             hook: MechanismHook | None = None) -> tuple[Observation, dict[str, Any]]:
    """Sums of r_min canary clients through the distributed discrete Gaussian share (module docstring).

    Parameters
    ----------
    setup : privet.audit_setup.AuditSetup
        The audited run config (``secure-aggregation = "secagg+ddg"``).
    canaries : int
        Canary clients (rounded up to whole sums of r_min).
    extension : int
        The server asks for ``extension`` × T rounds.
    rng : numpy.random.Generator
        The auditor's own randomness (secrets, directions, rotation seeds); never the clients' noise.
    hook : callable, optional
        **Tests only**: wraps the mechanism of every client round.
    """
    per_sum = int(setup.secure_floor or 1)
    if per_sum > STAND_IN_DIM:
        raise AuditConfigError(f"a sum of {per_sum} canaries needs more than {STAND_IN_DIM} coordinates")
    params = ddg_sum_parameters(setup, per_sum, STAND_IN_DIM)
    sums = -(-canaries // per_sum)
    total = sums * per_sum
    rounds = setup.train.num_rounds * extension
    clip = float(setup.train.clip)
    template = fresh_ledger(setup)
    secrets = rng.choice(np.array([-1, 1]), size=total)
    directions = np.zeros((total, STAND_IN_DIM))
    observed = np.zeros((total, STAND_IN_DIM))
    received = [np.zeros(STAND_IN_DIM, dtype=np.float64)]
    ledgers: list[PrivacyLedger] = []
    releases = made_most = 0
    kind = ""
    for j in range(sums):
        members = range(j * per_sum, (j + 1) * per_sum)
        directions[members.start:members.stop] = unit_rows(rng, per_sum, STAND_IN_DIM)
        seed = rng.bytes(32)  # the members' agreed rotation seed (the server knows it)
        own = {i: copy.deepcopy(template) for i in members}
        released = np.zeros(STAND_IN_DIM)
        for t in range(1, rounds + 1):
            total_sum = np.zeros(params.padded_dim, dtype=np.int64)
            replayed = np.zeros(params.padded_dim, dtype=np.int64)
            shares = 0
            for i in members:
                mechanism: Mechanism = setup.train.mechanism(num_examples=1, delta=setup.profile.delta,
                                                             secure_floor=setup.secure_floor,
                                                             ddg=DDGSum(params, seed))
                if hook is not None:
                    mechanism = hook(mechanism)
                kind = mechanism.kind
                work = CanaryWork(received, [CANARY_NORM * clip * secrets[i] * directions[i]])
                done = client_release(mechanism, own[i], run_id=RUN_ID, server_round=t, work=work,
                                      noise=client_noise(setup, i, t))
                if done is None:
                    continue
                upload, _ = done
                total_sum = np.mod(total_sum + np.asarray(upload.arrays[0], np.int64), params.modulus)
                replayed += replayed_share(server_replay(setup, i, t), params)
                shares += 1
            if shares < per_sum:
                continue  # fewer than r_min survivors: the secure sum releases nothing
            seen = decode(total_sum, params, seed)
            residual = decode(np.mod(total_sum - replayed, params.modulus), params, seed)
            released += explained(seen, seen - residual)
            releases += 1
        made_most = max([made_most, *(o.releases_in_run(RUN_ID) for o in own.values())])
        observed[members.start:members.stop] = released
        ledgers += own.values()
    scores = np.einsum("ij,ij->i", observed, directions) / clip
    charged = most_charged(ledgers)
    obs = Observation(secrets, scores, canary_cosines(observed, directions), tuple(charged.charges()), "replace-one",
                      releases)
    sigma_eq = charged.history[0][0] if charged.history else float("nan")
    extras = {"noise_multiplier": float(setup.train.noise_multiplier), "charged_multiplier": float(sigma_eq), "sample_rate": 1.0, "clip": clip, "steps": 1,
              "rounds_requested": rounds, "releases_per_canary": made_most, "mechanism": kind,
              "accountant": charged.conversion(), "local_sigma_sq": float(params.local_sigma_sq),
              "norm_bound_sq": int(params.norm_bound_sq), "scale": float(params.scale), "bits": int(params.bits)}
    return obs, extras


#: The registered game (:data:`privet.audit_games.GAMES`).
DDG_SUM: Final = Game("ddg-sum", "secure-ddg", "client", DDG_OBSERVES, ddg_game)
