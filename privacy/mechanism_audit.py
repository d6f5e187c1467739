"""Audits of privet's privacy mechanisms on synthetic canaries: the empirical ε beside the charged ε.

Each **game** runs one of privet's mechanisms (the functions its clients run:
:func:`privacy.mechanisms.privatize_update`, :func:`~privacy.mechanisms.gaussian_noise_like`,
noise from a :class:`privacy.randomness.NoiseSource`) many times on canaries whose sign is a
secret bit S ∈ {−1, +1}, attacks what the adversary of the threat model sees, and hands a
score per canary to the statistics of :mod:`privacy.auditing`. The charge is everything a ledger
records for one canary (:meth:`privacy.ledger.PrivacyLedger.charges`: ``(σ, q, steps)`` entries,
and steps that carry their own RDP curve such as GDPFed+'s discrete Gaussian group sum,
:class:`privacy.poisson_rdp.DDGPoissonStep`, all under replace-one), and its ε comes from
privet's own accountant (:func:`privacy.accountants.epsilon_of`) under the ledger's conversion;
the statistics never use it.

Games (all white-box: the attacker knows the canary directions and every public parameter):

``update``
    A client's whole-update Gaussian release, client level (``update`` mode): the canary
    client's update is S·B·u for a random unit direction u and B = 2C (so clipping acts); it
    uploads ``privatize_update`` with σ and m noise shares in each of T rounds. Neighbours:
    +u against −u, replace-one, sensitivity 2C. The server sees every upload; its score is
    Σ_rounds ⟨upload, u⟩/C. Charged (σ/√m, 1, T) (:func:`privacy.mechanisms.local_noise_multiplier`).
``secure-sum``
    The released total of a secure sum: r_min surviving clients, each adding its 1/m share of
    the noise, all of them canaries with orthonormal random directions. The server sees only
    the sum; scores ⟨sum, u_j⟩/C. Charged σ·√(r_min/m) per release
    (:func:`privacy.secure_sum.charged_multiplier`).
``dpsgd``
    DP-SGD on a linear least-squares model, record level: n records of which one is a
    gradient canary (feature e_d on a coordinate no other record uses, label −S·B, so its
    clipped gradient is S·C·e_d while the model stays small); each step samples records with
    probability q = 1/⌈n/B⌉ (Poisson), clips every per-example gradient to C and adds
    N(0, σ²C²) to their sum (:func:`~privacy.mechanisms.gaussian_noise_like`). The attacker
    sees every step's noisy sum and scores the canary by the likelihood ratio of the
    subsampled Gaussian at the declared σ. **This DP-SGD is numpy written here for the audit**
    (vectorised over independent runs, one canary each), not privet's Opacus path in
    :mod:`client.training`, which ``privet audit`` (:mod:`privet.audit_cmd`) runs on canary
    records in a client's shard. Charged (σ, q, steps).

**Defects** (:class:`Defect`, test-only departures from the charged mechanism): noise at half
σ, the charge computed for add/remove (sensitivity C) where replace-one (2C) holds, noise
from a seed the server knows (``seeded`` sources, the attacker regenerating and subtracting
the noise), and a run released for 4T rounds (or steps) with T charged.

**The flag** (:attr:`AuditResult.flagged`): an empirical lower bound above what was charged.
Three tests are run, each at significance (1 − confidence)/3 so that together a false flag
has probability at most 1 − confidence: Steinke et al.'s one-run bound at the ledger's δ, and
Nasr et al.'s threshold test twice, its threshold chosen on a pilot share of the canaries
once for the largest bound at δ and once for the largest excess over the charged curve. The
threshold tests' error-rate bounds give a lower bound at every δ' at once, set against the
accountant's ε at each δ' of :data:`PROFILE_DELTAS`: the ledger's history is a claim for
every δ', and testing it where the attack is strongest is what catches a mechanism that is
only twice too weak. The one-shot estimate of Andrew et
al. (cosines of the canaries with the observed model delta) is reported beside them; it is
an estimate, and never flags. :func:`assess` is that statistics for any game's
:class:`Observation`: ``privet audit`` (:mod:`privet.audit_cmd`) hands it what its games
observe on privet's client mechanisms, calibration and ledger for a run config.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from privacy.accountants import ADD_REMOVE, DEFAULT_ACCOUNTANT, RELATIONS, REPLACE_ONE, Charge, CurveStep, epsilon_of
from privacy.auditing import (
    DEFAULT_CONFIDENCE,
    canary_cosines,
    one_run_audit,
    one_shot_epsilon,
    threshold_audit,
)
from privacy.calibration import noise_multiplier_for
from privacy.mechanisms import (
    dpsgd_expected_batch,
    dpsgd_sample_rate,
    dpsgd_steps_per_round,
    gaussian_noise_like,
    local_noise_multiplier,
    privatize_update,
)
from privacy.randomness import NoiseSource, SecureNoise, SeededNoise
from privacy.secure_sum import charged_multiplier

__all__ = [
    "ADD_REMOVE_CHARGE",
    "AuditResult",
    "DEFECTS",
    "Defect",
    "EXTENDED_RUN",
    "GAMES",
    "HALF_SIGMA",
    "HONEST",
    "KNOWN_SEED",
    "Observation",
    "PROFILE_DELTAS",
    "assess",
    "audit",
    "charges_json",
    "describe_charges",
    "dpsgd_game",
    "secure_sum_game",
    "update_game",
]

#: δ' (besides the ledger's δ) at which the empirical privacy curve is set against the charged one.
PROFILE_DELTAS: Final[tuple[float, ...]] = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.3)

#: A canary's norm before clipping, in units of C: clipping must act for the audit to see it.
CANARY_NORM = 2.0

#: The known seed of the ``KNOWN_SEED`` defect (any number the server can learn).
SERVER_KNOWN_SEED = 20240611


@dataclass(frozen=True)
class Defect:
    """A test-only departure of the mechanism from what is charged (the defaults: none).

    Attributes
    ----------
    name : str
        How reports name it.
    noise_scale : float
        The noise actually added is ``noise_scale`` times the calibrated σ.
    charged_relation : str
        The relation the charge is computed under: ``"add-remove"`` charges sensitivity C
        for a mechanism whose replace-one sensitivity is 2C.
    known_seed : int or None
        Noise drawn from ``SeededNoise(known_seed + i)`` for canary i (DP-SGD: one source
        for the run), a seed the attacker knows and replays.
    release_factor : int
        Rounds (DP-SGD: steps) released per round charged.
    """

    name: str = "honest"
    noise_scale: float = 1.0
    charged_relation: str = REPLACE_ONE
    known_seed: int | None = None
    release_factor: int = 1

    def __post_init__(self) -> None:
        if not self.noise_scale > 0:
            raise ValueError(f"noise_scale must be > 0; found {self.noise_scale!r}")
        if self.charged_relation not in RELATIONS:
            raise ValueError(f"charged_relation must be one of {', '.join(RELATIONS)}; found {self.charged_relation!r}")
        if self.release_factor < 1:
            raise ValueError(f"release_factor must be >= 1; found {self.release_factor!r}")


HONEST: Final = Defect()
HALF_SIGMA: Final = Defect("noise at half sigma", noise_scale=0.5)
ADD_REMOVE_CHARGE: Final = Defect("sensitivity C charged where 2C holds", charged_relation=ADD_REMOVE)
KNOWN_SEED: Final = Defect("noise from a server-known seed", known_seed=SERVER_KNOWN_SEED)
EXTENDED_RUN: Final = Defect("4T released, T charged", release_factor=4)

#: The defects by their command-line names.
DEFECTS: Final[dict[str, Defect]] = {"honest": HONEST, "half-sigma": HALF_SIGMA,
                                     "add-remove-charge": ADD_REMOVE_CHARGE, "known-seed": KNOWN_SEED,
                                     "extended-run": EXTENDED_RUN}


@dataclass(frozen=True)
class Observation:
    """What a game hands to the statistics.

    Attributes
    ----------
    secrets : ndarray of int
        S_i ∈ {−1, +1} per canary, uniform and independent.
    scores : ndarray of float
        The white-box attack's score per canary (higher: S = +1).
    cosines : ndarray of float
        cos(observed model delta, canary direction) per canary (the one-shot statistic).
    history : tuple of Charge
        Everything the ledger charges for one canary's unit (client or record):
        :meth:`privacy.ledger.PrivacyLedger.charges`, its ``(σ, q, steps)`` history and its
        curve steps (:class:`privacy.accountants.CurveStep`).
    relation : str
        The relation the charge is computed under.
    releases : int
        Mechanism releases the game ran (uploads, sums, DP-SGD steps).
    """

    secrets: np.ndarray
    scores: np.ndarray
    cosines: np.ndarray
    history: tuple[Charge, ...]
    relation: str
    releases: int


def describe_charges(charges: tuple[Charge, ...]) -> str:
    """What was charged, in words: ``sigma=…, q=…, steps=…`` per Gaussian entry, a curve step's own
    :meth:`~privacy.accountants.CurveStep.describe`; ``nothing`` for an empty history.
    """
    parts = [c.describe() if isinstance(c, CurveStep) else f"Gaussian (sigma={c[0]:.4g}, q={c[1]:.4g}, steps={c[2]})"
             for c in charges]
    return "; ".join(parts) or "nothing"


def charges_json(charges: tuple[Charge, ...]) -> list[Any]:
    """JSON-safe form of a history of charges: ``[σ, q, steps]`` per Gaussian entry, a curve step's
    :meth:`~privacy.accountants.CurveStep.to_dict` (with its ``kind``), as a ledger file holds them.
    """
    return [c.to_dict() if isinstance(c, CurveStep) else [float(c[0]), float(c[1]), int(c[2])] for c in charges]


#: A noise source for the honest games: ``"csprng"`` (privet's default), or an int seeding a
#: numpy generator that the attacker does not use (reproducible tests).
NoiseSpec = str | int


def _source(spec: NoiseSpec) -> NoiseSource | np.random.Generator:
    if isinstance(spec, int) and not isinstance(spec, bool):
        return np.random.default_rng(spec)
    if spec == "csprng":
        return SecureNoise()
    raise ValueError(f"noise must be 'csprng' or an int seed; found {spec!r}")


@functools.lru_cache(maxsize=256)
def _calibrate(target_epsilon: float, delta: float, rate: float, steps: int, relation: str, accountant: str) -> float:
    """σ charged for ``steps`` releases at rate q to meet ``target_epsilon`` (under the charged relation).

    Cached: a pure function of its arguments, and the PLD search for DP-SGD takes seconds.
    """
    return noise_multiplier_for(target_epsilon, delta, rate, steps, accountant=accountant, relation=relation)


def _unit_rows(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    rows = rng.standard_normal((count, dim))
    return np.asarray(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=np.float64)


def _layers(flat: np.ndarray, shapes: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
    out, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append(flat[start:start + size].reshape(shape).astype(np.float32))
        start += size
    return out


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


# --------------------------------------------------------------------------- games
def update_game(target_epsilon: float, *, delta: float, canaries: int, defect: Defect = HONEST,
                noise: NoiseSpec = "csprng", rng: np.random.Generator, accountant: str = DEFAULT_ACCOUNTANT,
                clip: float = 1.0, noise_shares: int = 1, rounds: int = 1,
                layer_shapes: tuple[tuple[int, ...], ...] = ((16, 8), (64,))) -> Observation:
    """The whole-update Gaussian release of ``update`` mode, one canary client per canary (module docstring)."""
    charged_sigma = _calibrate(target_epsilon, delta, 1.0, rounds, defect.charged_relation, accountant)
    sigma_sent = charged_sigma * math.sqrt(noise_shares)  # what the server sends; one upload carries σ/√m
    history = ((local_noise_multiplier(sigma_sent, noise_shares), 1.0, rounds),)
    public_std = sigma_sent * clip / math.sqrt(noise_shares)  # what the attacker replays with
    dim = sum(int(np.prod(s)) for s in layer_shapes)
    secrets = rng.choice(np.array([-1, 1]), size=canaries)
    directions = _unit_rows(rng, canaries, dim)
    private = _source(noise)
    scores, observed = np.zeros(canaries), np.zeros((canaries, dim))
    for i in range(canaries):
        update = _layers(CANARY_NORM * clip * secrets[i] * directions[i], layer_shapes)
        source = private if defect.known_seed is None else SeededNoise(defect.known_seed + i)
        replay = None if defect.known_seed is None else SeededNoise(defect.known_seed + i)
        for _ in range(rounds * defect.release_factor):
            upload, _ = privatize_update(update, clip=clip, noise_multiplier=sigma_sent * defect.noise_scale,
                                         noise_shares=noise_shares, rng=source)
            seen = _flat(upload)
            if replay is not None:  # the server regenerates the client's noise and removes it
                seen -= _flat(gaussian_noise_like(upload, public_std, replay))
            observed[i] += seen
        scores[i] = observed[i] @ directions[i] / clip
    return Observation(secrets, scores, canary_cosines(observed, directions), history, defect.charged_relation,
                       canaries * rounds * defect.release_factor)


def secure_sum_game(target_epsilon: float, *, delta: float, canaries: int, defect: Defect = HONEST,
                    noise: NoiseSpec = "csprng", rng: np.random.Generator, accountant: str = DEFAULT_ACCOUNTANT,
                    clip: float = 1.0, noise_shares: int = 8, min_survivors: int = 4, rounds: int = 1,
                    dim: int = 256) -> Observation:
    """A secure sum's released total with exactly r_min survivors, every member a canary (module docstring)."""
    if not 1 <= min_survivors <= noise_shares or min_survivors > dim:
        raise ValueError(f"need 1 <= min_survivors <= noise_shares and <= dim; found {min_survivors}, {noise_shares}")
    charged_sigma = _calibrate(target_epsilon, delta, 1.0, rounds, defect.charged_relation, accountant)
    sigma_sent = charged_sigma / math.sqrt(min_survivors / noise_shares)
    history = ((charged_multiplier(sigma_sent, noise_shares, min_survivors), 1.0, rounds),)
    public_std = sigma_sent * clip / math.sqrt(noise_shares)
    sums = -(-canaries // min_survivors)
    total = sums * min_survivors
    secrets = rng.choice(np.array([-1, 1]), size=total)
    directions = np.zeros((total, dim))
    private = _source(noise)
    scores, observed = np.zeros(total), np.zeros((total, dim))
    for j in range(sums):
        members = range(j * min_survivors, (j + 1) * min_survivors)
        basis, _ = np.linalg.qr(rng.standard_normal((dim, min_survivors)))  # orthonormal random directions
        directions[members.start:members.stop] = basis.T
        sources: dict[int, NoiseSource | np.random.Generator] = {
            i: private if defect.known_seed is None else SeededNoise(defect.known_seed + i) for i in members}
        replays = {i: SeededNoise(defect.known_seed + i) for i in members} if defect.known_seed is not None else {}
        released = np.zeros(dim)
        for _ in range(rounds * defect.release_factor):
            total_sum = np.zeros(dim)
            for i in members:
                update = [(CANARY_NORM * clip * secrets[i] * directions[i]).astype(np.float32)]
                upload, _ = privatize_update(update, clip=clip, noise_multiplier=sigma_sent * defect.noise_scale,
                                             noise_shares=noise_shares, rng=sources[i])
                total_sum += _flat(upload)
                if i in replays:  # every member's noise regenerated by the server
                    total_sum -= _flat(gaussian_noise_like(upload, public_std, replays[i]))
            released += total_sum
        observed[members.start:members.stop] = released
        scores[members.start:members.stop] = directions[members.start:members.stop] @ released / clip
    return Observation(secrets, scores, canary_cosines(observed, directions), history, defect.charged_relation,
                       sums * rounds * defect.release_factor)


def _mixture_log_ratio(z: np.ndarray, rate: float, sigma: float) -> np.ndarray:
    """Log of [(1−q)N(0,σ²) + qN(1,σ²)] / [(1−q)N(0,σ²) + qN(−1,σ²)] at z: one step's replace-one likelihood ratio."""
    base = np.log1p(-rate) - 0.5 * (z / sigma) ** 2 if rate < 1 else np.full_like(z, -np.inf)
    up = math.log(rate) - 0.5 * ((z - 1.0) / sigma) ** 2
    down = math.log(rate) - 0.5 * ((z + 1.0) / sigma) ** 2
    return np.asarray(np.logaddexp(base, up) - np.logaddexp(base, down), dtype=np.float64)


def dpsgd_game(target_epsilon: float, *, delta: float, canaries: int, defect: Defect = HONEST,
               noise: NoiseSpec = "csprng", rng: np.random.Generator, accountant: str = DEFAULT_ACCOUNTANT,
               clip: float = 1.0, num_examples: int = 32, batch_size: int = 8, epochs: int = 1, local_steps: int = 0,
               features: int = 8, learning_rate: float = 0.5) -> Observation:
    """DP-SGD on a linear model with one gradient canary per run, runs vectorised (module docstring).

    The run takes E·⌈n/B⌉ steps, or τ = ``local_steps`` when > 0 (one step: ``local_steps=1``).
    """
    rate = dpsgd_sample_rate(num_examples, batch_size)
    steps = dpsgd_steps_per_round(num_examples, batch_size, epochs, local_steps)
    sigma = _calibrate(target_epsilon, delta, rate, steps, defect.charged_relation, accountant)
    history = ((sigma, rate, steps),)
    runs, n, d = canaries, num_examples, features
    secrets = rng.choice(np.array([-1, 1]), size=runs)
    x = np.zeros((runs, n, d))
    x[:, 1:, :d - 1] = rng.standard_normal((runs, n - 1, d - 1))
    truth = rng.standard_normal(d - 1)
    y = x[:, :, :d - 1] @ truth + 0.1 * rng.standard_normal((runs, n))
    x[:, 0, d - 1] = 1.0  # the canary record: a coordinate of its own
    y[:, 0] = -secrets * CANARY_NORM * 1e3 * clip  # gradient (w_d − y)e_d = S·(huge)·e_d, clipped to S·C·e_d
    source = _source(noise) if defect.known_seed is None else SeededNoise(defect.known_seed)
    replay = SeededNoise(defect.known_seed) if defect.known_seed is not None else None
    norms_x = np.linalg.norm(x, axis=2)
    w, model_delta = np.zeros((runs, d)), np.zeros((runs, d))
    scores = np.zeros(runs)
    batch = dpsgd_expected_batch(n, batch_size)
    released = steps * defect.release_factor
    for _ in range(released):
        if isinstance(source, np.random.Generator):
            sampled = source.random((runs, n)) < rate
        else:
            sampled = source.uniform(runs * n).reshape(runs, n) < rate
        residual = np.einsum("rnd,rd->rn", x, w) - y
        with np.errstate(divide="ignore"):
            factor = np.minimum(1.0, clip / (np.abs(residual) * norms_x))  # per-example clipping to C
        weights = np.where(sampled, residual * np.nan_to_num(factor, posinf=1.0), 0.0)
        clipped_sum = np.einsum("rn,rnd->rd", weights, x)
        (noise_draw,) = gaussian_noise_like([clipped_sum], sigma * defect.noise_scale * clip, source)
        noisy = clipped_sum + noise_draw
        seen = noisy
        if replay is not None:  # the attacker replays the sampling and the noise of the known seed
            replay.uniform(runs * n)
            (replayed,) = gaussian_noise_like([clipped_sum], sigma * clip, replay)
            seen = noisy - replayed
        scores += _mixture_log_ratio(seen[:, d - 1] / clip, rate, sigma)
        w -= learning_rate * noisy / batch
        model_delta -= learning_rate * seen / batch  # the final model's change, as far as the attacker can clean it
    canary_axis = np.zeros((runs, d))
    canary_axis[:, d - 1] = 1.0
    return Observation(secrets, scores, canary_cosines(model_delta, canary_axis), history, defect.charged_relation,
                       runs * released)


Game = Callable[..., Observation]

#: Mechanism name -> game.
GAMES: Final[dict[str, Game]] = {"update": update_game, "secure-sum": secure_sum_game, "dpsgd": dpsgd_game}


# --------------------------------------------------------------------------- the audit
@dataclass(frozen=True)
class AuditResult:
    """The empirical privacy of one mechanism beside its charge.

    Attributes
    ----------
    mechanism, defect : str
        What was audited.
    canaries, releases : int
        Canaries (each with a random bit) and mechanism releases run.
    delta, confidence : float
        The ledger's δ; the confidence of the lower bounds and of the flag.
    charged_epsilon : float
        ε of everything the ledger charged at δ from privet's accountant (the ledger's conversion).
    one_run_bound, threshold_bound : float
        Steinke et al.'s and the threshold tests' lower bounds at δ (each test at significance
        (1 − confidence)/3).
    one_shot_epsilon : float
        Andrew et al.'s estimate at δ (not a bound).
    violation : tuple of (δ', empirical ε, charged ε) or None
        The δ' where the empirical curve exceeds the charged one by the most, if anywhere.
    history, relation : tuple of Charge, str
        What the ledger charged for one canary's unit (Gaussian ``(σ, q, steps)`` entries and curve
        steps: :meth:`charged_history`, :meth:`describe_charges`), and under which relation.
    seconds : float
        Wall time of the game and the statistics.
    profile : tuple of (δ', empirical ε, charged ε)
        The two curves at δ and every δ' of :data:`PROFILE_DELTAS` above it.
    """

    mechanism: str
    defect: str
    canaries: int
    releases: int
    delta: float
    confidence: float
    charged_epsilon: float
    one_run_bound: float
    threshold_bound: float
    one_shot_epsilon: float
    violation: tuple[float, float, float] | None
    history: tuple[Charge, ...]
    relation: str
    seconds: float
    profile: tuple[tuple[float, float, float], ...] = field(default=(), repr=False)

    @property
    def lower_bound(self) -> float:
        """The empirical ε at δ: the larger of the two bounds, a lower bound at ``confidence``."""
        return max(self.one_run_bound, self.threshold_bound)

    @property
    def flagged(self) -> bool:
        """An empirical lower bound above the charged ε (at δ, or at a δ' of the profile)."""
        return self.one_run_bound > self.charged_epsilon or self.violation is not None

    def charged_history(self) -> list[Any]:
        """:attr:`history`, JSON-safe (:func:`charges_json`)."""
        return charges_json(self.history)

    def describe_charges(self) -> str:
        """:attr:`history` in words (:func:`describe_charges`)."""
        return describe_charges(self.history)

    def line(self) -> str:
        """One line naming the mechanism and both figures."""
        name = self.mechanism if self.defect == HONEST.name else f"{self.mechanism} [{self.defect}]"
        head = (f"{'FLAGGED' if self.flagged else 'ok'} {name}: empirical eps >= {self.lower_bound:.3f} at "
                f"delta={self.delta:g} ({self.confidence:.0%} lower bound, {self.canaries} canaries), "
                f"charged eps = {self.charged_epsilon:.3f}")
        if self.violation is not None and self.violation[0] != self.delta:
            d, emp, ch = self.violation
            head += f"; at delta'={d:g}: empirical eps >= {emp:.3f} > charged {ch:.3f}"
        return head + f"; one-shot estimate {self.one_shot_epsilon:.3f}"


def _profile_deltas(delta: float) -> Iterator[float]:
    yield delta
    yield from (d for d in PROFILE_DELTAS if d > delta)


def audit(mechanism: str, target_epsilon: float, *, canaries: int, defect: Defect = HONEST, delta: float = 1e-5,
          confidence: float = DEFAULT_CONFIDENCE, accountant: str = DEFAULT_ACCOUNTANT, noise: NoiseSpec = "csprng",
          seed: int | None = None, **options: object) -> AuditResult:
    """Run ``mechanism``'s game calibrated to ``target_epsilon`` and set its empirical ε against the charge.

    Parameters
    ----------
    mechanism : {"update", "secure-sum", "dpsgd"}
        The game (:data:`GAMES`).
    target_epsilon : float
        ε the mechanism is calibrated to (the charge is what the accountant then says).
    canaries : int
        Canaries to insert (the secure sum rounds up to whole sums).
    defect : Defect
        A test-only departure from the charged mechanism (:data:`DEFECTS`).
    delta, confidence : float
        The ledger's δ; the confidence of the bounds and the flag.
    accountant : {"rdp", "prv"}
        privet's accountant for the charge and the calibration.
    noise : "csprng" or int
        The honest noise source (an int: a numpy generator only the mechanism uses).
    seed : int, optional
        Seeds the auditor's own randomness (secrets, directions, data).
    **options
        Passed to the game (e.g. ``rounds``, ``noise_shares``, ``min_survivors``).

    Raises
    ------
    ValueError
        If the mechanism is unknown.
    """
    if mechanism not in GAMES:
        raise ValueError(f"mechanism must be one of {', '.join(GAMES)}; found {mechanism!r}")
    start = time.perf_counter()
    obs = GAMES[mechanism](target_epsilon, delta=delta, canaries=canaries, defect=defect, noise=noise,
                           rng=np.random.default_rng(seed), accountant=accountant, **options)
    return assess(obs, mechanism, defect.name, delta=delta, confidence=confidence, accountant=accountant,
                  started=start)


def assess(obs: Observation, mechanism: str, defect: str = HONEST.name, *, delta: float,
           confidence: float = DEFAULT_CONFIDENCE, accountant: str = DEFAULT_ACCOUNTANT,
           started: float | None = None) -> AuditResult:
    """The statistics of one game's observation set against its charge (module docstring, "The flag").

    Parameters
    ----------
    obs : Observation
        What a game saw (any game: this module's, or one run on privet's client mechanisms).
    mechanism, defect : str
        How the result names what was audited.
    delta, confidence : float
        The ledger's δ; the confidence of the bounds and the flag.
    accountant : str
        The accountant the charge converts with (the ledger's conversion).
    started : float, optional
        ``time.perf_counter()`` when the game began (the result's ``seconds`` count from it).
    """
    start = time.perf_counter() if started is None else started
    third = 1.0 - (1.0 - confidence) / 3.0  # three tests, each at a third of the significance
    one_run = one_run_audit(obs.scores, obs.secrets, delta, third)
    claim = [(d, epsilon_of(obs.history, d, accountant, obs.relation)) for d in _profile_deltas(delta)]
    at_delta = threshold_audit(obs.scores, obs.secrets, delta, third)
    at_claim = threshold_audit(obs.scores, obs.secrets, delta, third, against=claim)
    profile = tuple((d, max(at_delta.epsilon(d), at_claim.epsilon(d)), c) for d, c in claim)
    charged = profile[0][2]
    over = [p for p in profile if p[1] > p[2]]
    violation = max(over, key=lambda p: p[1] - p[2]) if over else None
    cos = obs.cosines
    estimate = one_shot_epsilon(cos[obs.secrets == 1], cos[obs.secrets == -1], delta).epsilon
    return AuditResult(mechanism, defect, int(obs.secrets.size), obs.releases, delta, confidence, charged,
                       one_run, profile[0][1], estimate, violation, obs.history, obs.relation,
                       time.perf_counter() - start, profile)
