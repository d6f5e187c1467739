"""``privet audit``'s ``group-ddg-sum`` game: a GDPFed group as one distributed discrete Gaussian secure sum.

GDPFed / GDPFed+ with ``secure-aggregation = "secagg+ddg"``
(:class:`privacy.mechanisms.GroupDiscreteGaussianShare`, kind ``group-ddg``): each round the server
samples r_m of group m's members (each with probability q_m, the charge's Poisson model), every
sampled member clips its update to C, scales, rotates and rounds it to integers of norm <= B, adds
its discrete Gaussian share N_Z(0, σ²) (σ² = ⌈σ_m²C²s²/r_m⌉) and hands (x̃ + z) mod 2^b to the group's
secure sum, released only with all of its members. Each member charges its group's whole run once, at
its first release: the curve step :class:`privacy.poisson_rdp.DDGPoissonStep` (KLS's RDP bound at the
sum's parameters and the client's floor n_min, amplified by Poisson sampling at q_m, T releases), and
refuses any release beyond those T.

**The game**, the ``group-sum`` game's (:mod:`privet.audit_games`) on ``ddg-sum``'s decoding
(:mod:`privet.audit_ddg`). Each group sum holds n = r_min members (the client's floor,
max(r_m, ``min-sum-size``): the fewest a released group sum holds, where the charge is evaluated), and n
canary clients may take part in it, with orthonormal random directions u_i of a stand-in update of
:data:`~privet.audit_games.STAND_IN_DIM` coordinates and updates S_i·2C·u_i (S_i = ±1 the secret): the
guarantee of each holds whatever the others' updates are. In each of the ``extension`` × T rounds the
server asks for:

- each canary is sampled with probability q_m, by a coin of the auditor's that the server does not see
  (the charge's amplification assumes it is hidden); if sampled it runs the client's own steps
  (:func:`client.release.client_release`: the plan against its ledger, which pays the curve step at the
  first release and refuses after T; the mechanism's ``run`` with the client's noise source);
- the sum always holds n shares: the members not filled by sampled canaries are clients with zero updates,
  each adding its own discrete Gaussian share through the same mechanism;
- the sum's parameters are the server's for a sum of n members
  (:func:`privet.audit_ddg.ddg_sum_parameters`), the rotation seed one the members would agree on
  (the white-box adversary knows it); SecAgg+'s masking is not run (its output is the sum mod 2^b);
- the server decodes the sum (:func:`~privacy.distributed_discrete_gaussian.decode`). Where q_m < 1 it
  cannot tell which sums hold which canaries and reads every one; where q_m = 1 (no amplification
  charged) it knows, and reads only the sums that hold canaries (every member of a sum is then a canary,
  as in ``ddg-sum``).

**The attack**: per released sum, z = ⟨decoded sum, u⟩/C is, to the rounding, a mixture
(1 − q_m)·N(0, τ²) + q_m·N(S, τ²) with τ = √(n·σ²)/(s·C) (the rotation is orthogonal, so the
projection of n shares of N_Z(0, σ²) has variance n·σ² in integer units); a canary's score is the sum
over rounds of the mixture's log-likelihood ratio of S = +1 against S = −1
(:func:`privet.audit_dpsgd_steps.mixture_log_ratio`), the optimal per-round test (at q_m = 1 a
multiple of ⟨Σ_rounds decoded, u⟩). As in every game, a server that knows the run seed regenerates
``seeded`` members' shares (:func:`privet.audit_ddg.replayed_share`), subtracts them mod 2^b and keeps
the result where it explains the sum.

**The charge** is everything the canary's ledger holds (:meth:`privacy.ledger.PrivacyLedger.charges`:
the curve step), converted as the ledger converts it (through RDP).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Final

import numpy as np

from client.release import client_release
from privacy.auditing import canary_cosines
from privacy.distributed_discrete_gaussian import decode
from privacy.ledger import PrivacyLedger
from privacy.mechanism_audit import Observation, describe_charges
from privacy.mechanisms import DDGSum, GroupDiscreteGaussianShare, Mechanism
from privet.audit_ddg import ddg_sum_parameters, replayed_share
from privet.audit_dpsgd_steps import mixture_log_ratio
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

__all__ = ["GROUP_DDG_OBSERVES", "GROUP_DDG_SUM", "group_ddg_game"]

#: What the ``group-ddg-sum`` game's adversary sees.
GROUP_DDG_OBSERVES: Final = (
    "only the decoded group sum of r_m discrete Gaussian inputs mod 2^b per round (lifted, rotated back and "
    "unscaled), each of its canaries in it with probability q_m (the server does not see who was sampled; at "
    "q_m = 1 it knows which sums hold a canary)")


def group_ddg_game(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
                   hook: MechanismHook | None = None) -> tuple[Observation, dict[str, Any]]:
    """Canaries in GDPFed group sums of discrete Gaussian shares, each sampled at q_m unseen (module docstring).

    Parameters
    ----------
    setup : privet.audit_setup.AuditSetup
        The audited run config (a GDPFed-family strategy with ``secure-aggregation = "secagg+ddg"``).
    canaries : int
        Canary clients (rounded up to whole group sums of r_min members).
    extension : int
        The server asks for ``extension`` × T rounds.
    rng : numpy.random.Generator
        The auditor's own randomness (secrets, directions, sampling coins, rotation seeds); never the
        clients' noise.
    hook : callable, optional
        **Tests only**: wraps the mechanism of every client round (the canary's and the other members').

    Raises
    ------
    AuditConfigError
        Where the config is not a GDPFed group on ``secagg+ddg``, or ``secagg.bits`` cannot hold the sum.
    """
    train = setup.train
    if not (setup.group and train.group_round and setup.secure_floor):
        raise AuditConfigError("the group-ddg-sum game audits a GDPFed-family strategy with "
                               "secure-aggregation = 'secagg+ddg' ('strategy', 'secure-aggregation')")
    per_sum = int(setup.secure_floor)  # max(r_m, the client's min-sum-size): the fewest a released sum holds
    if per_sum > STAND_IN_DIM:
        raise AuditConfigError(f"a group sum of {per_sum} members needs more than {STAND_IN_DIM} coordinates")
    params = ddg_sum_parameters(setup, per_sum, STAND_IN_DIM)
    rate = float(train.group_sample_rate)
    rounds = train.num_rounds * extension
    clip = float(train.clip)
    tau = math.sqrt(per_sum * float(params.local_sigma_sq)) / (float(params.scale) * clip)  # the attack's model
    sums = -(-canaries // per_sum)
    total = sums * per_sum
    template = fresh_ledger(setup)
    secrets = rng.choice(np.array([-1, 1]), size=total)
    directions = np.zeros((total, STAND_IN_DIM))
    observed = np.zeros((total, STAND_IN_DIM))
    scores = np.zeros(total)
    received = [np.zeros(STAND_IN_DIM, dtype=np.float64)]
    zero = [np.zeros(STAND_IN_DIM, dtype=np.float64)]
    ledgers: list[PrivacyLedger] = []
    releases = made_most = 0
    kind = GroupDiscreteGaussianShare.kind

    def mechanism_of(seed: bytes) -> Mechanism:
        nonlocal kind
        built = train.mechanism(num_examples=1, delta=setup.profile.delta, secure_floor=setup.secure_floor,
                                ddg=DDGSum(params, seed))
        mechanism = hook(built) if hook is not None else built
        kind = mechanism.kind
        return mechanism

    for j in range(sums):
        members = range(j * per_sum, (j + 1) * per_sum)  # canary clients whose sums these are (partition ids)
        directions[members.start:members.stop] = unit_rows(rng, per_sum, STAND_IN_DIM)
        own = {i: copy.deepcopy(template) for i in members}  # each canary client's own ledger
        for t in range(1, rounds + 1):
            seed = rng.bytes(32)  # this round's sum: its members' agreed rotation seed (the server knows it)
            total_sum = np.zeros(params.padded_dim, dtype=np.int64)
            replayed = np.zeros(params.padded_dim, dtype=np.int64)
            shares = 0
            for i in members:
                if rng.random() >= rate:
                    continue  # not sampled this round (a coin the server does not see)
                work = CanaryWork(received, [CANARY_NORM * clip * secrets[i] * directions[i]])
                done = client_release(mechanism_of(seed), own[i], run_id=RUN_ID, server_round=t, work=work,
                                      noise=client_noise(setup, i, t))
                if done is None:
                    continue  # refused: nothing released
                total_sum = np.mod(total_sum + np.asarray(done[0].arrays[0], np.int64), params.modulus)
                replayed += replayed_share(server_replay(setup, i, t), params)
                shares += 1
            if shares == 0 and rate >= 1:
                continue  # no amplification is charged: the server may know no canary is in this sum
            for k in range(per_sum - shares):  # the group's other members: zero updates, their own shares
                pid = total + j * per_sum + k
                other = mechanism_of(seed)
                upload = other.run(CanaryWork(received, zero), other.release(other.noise_multiplier),
                                   client_noise(setup, pid, t))
                total_sum = np.mod(total_sum + np.asarray(upload.arrays[0], np.int64), params.modulus)
                replayed += replayed_share(server_replay(setup, pid, t), params)
            seen = decode(total_sum, params, seed)
            residual = decode(np.mod(total_sum - replayed, params.modulus), params, seed)
            read = explained(seen, seen - residual)
            observed[members.start:members.stop] += read
            z = directions[members.start:members.stop] @ read / clip
            scores[members.start:members.stop] += mixture_log_ratio(z, rate, tau, np.ones_like(z), -np.ones_like(z))
            releases += 1
        made_most = max([made_most, *(o.releases_in_run(RUN_ID) for o in own.values())])
        ledgers += own.values()
    charged = most_charged(ledgers)
    charges = tuple(charged.charges())
    obs = Observation(secrets, scores, canary_cosines(observed, directions), charges, "replace-one", releases)
    extras = {"noise_multiplier": float(train.noise_multiplier), "sample_rate": rate, "clip": clip,
              "steps": int(train.num_rounds), "rounds_requested": rounds, "releases_per_canary": made_most,
              "mechanism": kind, "accountant": charged.conversion(), "charged": describe_charges(charges),
              "members_per_sum": per_sum, "local_sigma_sq": float(params.local_sigma_sq),
              "norm_bound_sq": int(params.norm_bound_sq), "scale": float(params.scale), "bits": int(params.bits)}
    return obs, extras


#: The registered game (:data:`privet.audit_games.GAMES`), the default for ``group-ddg``.
GROUP_DDG_SUM: Final = Game("group-ddg-sum", GroupDiscreteGaussianShare.kind, "client", GROUP_DDG_OBSERVES,
                            group_ddg_game)
