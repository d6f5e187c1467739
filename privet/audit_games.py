"""``privet audit``'s canary games, and the registry that maps a game's name to it.

A **game** (:class:`Game`) audits one kind of client mechanism
(:attr:`privacy.mechanisms.Mechanism.kind`): it runs that mechanism on canaries through the
audited client's setup (:mod:`privet.audit_setup`) and the client round's own privacy steps
(:func:`client.release.client_release`), attacks what the threat model's adversary sees, and
hands :func:`privacy.mechanism_audit.assess` an :class:`~privacy.mechanism_audit.Observation`
(in a :class:`Played`). The adversary is white-box: it knows the canary directions, every
public parameter, the run seed and every client's partition id, and deviates by asking for
``extension`` times the T rounds the run declared.

``update`` (client level)
    Each canary is a client whose update is S·2C·u (u a random unit direction in a stand-in
    update of ``STAND_IN_DIM`` coordinates, S = ±1 secret); it uploads what
    :class:`~privacy.mechanisms.WholeUpdate` releases. The server sees every upload.
``secure-sum`` (client level)
    r_min canary clients (orthonormal directions) per sum, each uploading its
    :class:`~privacy.mechanisms.SecureSumShare`; the server sees only the sum (SecAgg+'s
    unmasking is not run: its output is that sum).
``group-sum`` (client level, GDPFed family)
    One canary of group m per sum, sampled with probability q_m each round (a coin the server
    does not see: the charge's amplification assumes it), beside r_m − 1 members with zero
    updates; every member adds its :class:`~privacy.mechanisms.GroupShare` of the noise. The
    server sees the group sum. The extended run is refused by the canary after the T releases
    it paid for. Where q_m = 1 (no amplification charged) the server also knows which sums the
    canary is in, and scores those only.
``dpsgd``, ``dpsgd-final`` (record level)
    One client's DP-SGD run on a shard holding canary records: :mod:`privet.audit_dpsgd`.

In every game the server also tries to **regenerate the noise** as a server that knows the run
seed can where ``noise-source = "seeded"`` (:func:`client.seeds.client_seed`): it replays each
client's seeded source, and uses the replay where it explains the upload (the residual is
smaller than the upload). With privet's default ``csprng`` the replay explains nothing.

**Adding a game.** Write it in its own module (e.g. ``privet/audit_centroids.py``): a function
with :class:`Play`'s signature returning a :class:`Played`, and a module-level ``Game`` naming
the mechanism kind it audits; then add one line to :data:`GAMES` (``"name": "module:ATTRIBUTE"``).
The registry is read lazily, so your module may import this one. The first game registered for a
kind is that kind's **default**: :func:`select` picks it for every run config whose client
mechanism has that kind. A later game of the same kind (a stronger, white-box view such as
``dpsgd-steps``) runs when named: ``privet audit --game NAME`` (``audit(..., games=[NAME])``).
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Protocol

import numpy as np

from client.release import client_release
from privacy.auditing import canary_cosines
from privacy.ledger import PrivacyLedger
from privacy.mechanism_audit import Observation
from privacy.mechanisms import Mechanism, Privatizer, Upload, gaussian_noise_like
from privacy.randomness import NoiseSource
from privet.audit_setup import (
    RUN_ID,
    AuditConfigError,
    AuditSetup,
    MechanismHook,
    client_noise,
    fresh_ledger,
    mechanism_kind,
    round_mechanism,
    server_replay,
)

__all__ = ["CANARY_NORM", "GAMES", "STAND_IN_DIM", "CanaryWork", "Game", "Play", "Played",
           "explained", "game", "game_for", "games", "most_charged", "select", "unit_rows"]

#: Coordinates of the stand-in update of the client-level games (the projection of isotropic
#: Gaussian noise on a canary's direction does not depend on it; the one-shot cosines do).
STAND_IN_DIM: Final = 256
#: The canary's update norm before clipping, in units of C (clipping must act).
CANARY_NORM: Final = 2.0


# --------------------------------------------------------------------------- what a game is
@dataclass(frozen=True)
class Played:
    """What one game ran and observed.

    Attributes
    ----------
    observation : Observation
        Secrets, scores, cosines and the charged history of one canary (for :func:`assess`).
    mechanism : str
        The kind of the mechanism the client rounds ran (after any test hook).
    accountant : str
        The charge's conversion (:meth:`PrivacyLedger.conversion`).
    noise_multiplier, sample_rate, clip : float
        σ sent, q of one release, C.
    steps, rounds_requested, releases_per_canary : int
        Steps per release, the rounds the server asked for, the most releases one canary made.
    details : dict
        A game's own figures for ``audit.json`` (JSON-safe; empty for this module's games).
    """

    observation: Observation
    mechanism: str
    accountant: str
    noise_multiplier: float
    sample_rate: float
    clip: float
    steps: int
    rounds_requested: int
    releases_per_canary: int
    details: dict[str, Any] = field(default_factory=dict)

    #: The keys of :meth:`of`'s ``figures`` that are fields (the others go to ``details``).
    FIELDS: ClassVar[tuple[str, ...]] = ("mechanism", "accountant", "noise_multiplier", "sample_rate", "clip",
                                         "steps", "rounds_requested", "releases_per_canary")

    @classmethod
    def of(cls, observation: Observation, figures: dict[str, Any]) -> Played:
        """From an observation and a dict of figures: :attr:`FIELDS` by name, any other key into ``details``.

        Raises
        ------
        KeyError
            Naming the fields ``figures`` lacks.
        """
        missing = [k for k in cls.FIELDS if k not in figures]
        if missing:
            raise KeyError(f"a game's figures lack {', '.join(missing)}")
        return cls(observation, str(figures["mechanism"]), str(figures["accountant"]),
                   float(figures["noise_multiplier"]), float(figures["sample_rate"]), float(figures["clip"]),
                   int(figures["steps"]), int(figures["rounds_requested"]), int(figures["releases_per_canary"]),
                   {k: v for k, v in figures.items() if k not in cls.FIELDS})


class Play(Protocol):
    """A game's run: canaries through the audited client's mechanism, and what the adversary saw.

    It returns a :class:`Played`, or an observation and a dict of figures (:meth:`Played.of`).
    """

    def __call__(self, setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
                 hook: MechanismHook | None) -> Played | tuple[Observation, dict[str, Any]]:
        """``canaries`` canaries, ``extension`` × T rounds asked for, the auditor's ``rng``; ``hook``: tests only."""
        ...


@dataclass(frozen=True)
class Game:
    """One canary game.

    Attributes
    ----------
    name : str
        Its name (the key in :data:`GAMES`, the ``game`` of ``audit.json``).
    mechanism : str
        The :attr:`~privacy.mechanisms.Mechanism.kind` it audits (:func:`privet.audit_setup.mechanism_kind`).
    level : str
        ``client`` or ``record``: what one canary is.
    observes : str
        What its adversary sees (one line for the report).
    play : Play
        Runs it.
    """

    name: str
    mechanism: str
    level: str
    observes: str
    play: Play

    def run(self, setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
            hook: MechanismHook | None = None) -> Played:
        """:attr:`play`, its result as a :class:`Played`."""
        played = self.play(setup, canaries=canaries, extension=extension, rng=rng, hook=hook)
        return played if isinstance(played, Played) else Played.of(*played)


# --------------------------------------------------------------------------- the client-level games
@dataclass
class CanaryWork:
    """A client's local work whose trained model is the received one plus a fixed update (the canary)."""

    received: list[np.ndarray]
    update: list[np.ndarray]

    def train(self, privatize: Privatizer | None) -> Upload:
        """"Training" adds the canary update; ``privatize`` is the mechanism's."""
        trained = [r + u for r, u in zip(self.received, self.update, strict=True)]
        if privatize is None:
            return Upload(trained)
        upload, diagnostics = privatize(self.received, trained)
        return Upload(upload, diagnostics)

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """Not a DP-SGD work (the record-level game trains a real model)."""
        raise ValueError("a client-level canary has no DP-SGD work")


def explained(seen: np.ndarray, replayed: np.ndarray) -> np.ndarray:
    """What a server that regenerated a client's noise reads: ``seen − replayed`` where the replay explains
    ``seen`` (a smaller residual: the noise was seeded from what it knows), else ``seen`` itself.
    """
    residual = seen - replayed
    return residual if residual.shape == seen.shape and np.linalg.norm(residual) < np.linalg.norm(seen) else seen


def unit_rows(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    """``count`` orthonormal random directions in R^dim, as rows (count <= dim)."""
    basis, _ = np.linalg.qr(rng.standard_normal((dim, count)))
    return np.asarray(basis.T, dtype=np.float64)


def most_charged(ledgers: Sequence[PrivacyLedger]) -> PrivacyLedger:
    """The canary ledger that charged the most (one per distinct history: the canaries' agree but for refusals)."""
    distinct = {tuple(ledger.charges()): ledger for ledger in ledgers}
    return max(distinct.values(), key=lambda ledger: (ledger.spent(), len(ledger.charges())))


def _client_level(setup: AuditSetup, game: str, *, canaries: int, extension: int, rng: np.random.Generator,
                  hook: MechanismHook | None) -> Played:
    """Canary clients through the configured client-level mechanism (module docstring)."""
    train = setup.train
    shard = 1  # the client-level mechanisms' charge does not depend on n
    template = fresh_ledger(setup)
    probe = round_mechanism(setup, shard, hook)
    shares_per_sum = {"update": 1, "secure-sum": setup.secure_floor or 1, "group-sum": train.noise_shares}[game]
    per_sum = 1 if game == "group-sum" else shares_per_sum  # canaries in one sum
    if per_sum > STAND_IN_DIM:
        raise AuditConfigError(f"a sum of {per_sum} canaries needs more than {STAND_IN_DIM} coordinates")
    sums = -(-canaries // per_sum)
    total = sums * per_sum
    rounds = train.num_rounds * extension
    rate = train.group_sample_rate if game == "group-sum" else 1.0
    clip = probe.clip
    secrets = rng.choice(np.array([-1, 1]), size=total)
    directions = np.zeros((total, STAND_IN_DIM))
    observed = np.zeros((total, STAND_IN_DIM))
    ledgers: list[PrivacyLedger] = []
    sent: list[float] = []
    releases = made_most = 0
    received = [np.zeros(STAND_IN_DIM, dtype=np.float64)]
    zero = [np.zeros(STAND_IN_DIM, dtype=np.float64)]
    for j in range(sums):
        members = range(j * per_sum, (j + 1) * per_sum)
        directions[members.start:members.stop] = unit_rows(rng, per_sum, STAND_IN_DIM)
        own = {i: copy.deepcopy(template) for i in members}  # each canary client's own ledger
        released = np.zeros(STAND_IN_DIM)
        for t in range(1, rounds + 1):
            total_sum, replayed = np.zeros(STAND_IN_DIM), np.zeros(STAND_IN_DIM)
            shares = 0
            for i in members:  # partition id i: every client of the game has its own
                if game == "group-sum" and rng.random() >= rate:
                    continue  # not sampled this round (the server does not see this coin)
                mechanism = round_mechanism(setup, shard, hook)
                work = CanaryWork(received, [CANARY_NORM * clip * secrets[i] * directions[i]])
                done = client_release(mechanism, own[i], run_id=RUN_ID, server_round=t, work=work,
                                      noise=client_noise(setup, i, t))
                if done is None:
                    continue  # refused: nothing released
                upload, release = done
                sent.append(release.noise_multiplier)
                total_sum += upload.arrays[0] - received[0]
                replayed += _replayed_noise(setup, mechanism, release.noise_multiplier, i, t)
                shares += 1
            if game == "group-sum":  # the other members' shares: the sum always carries r_m of them
                for k in range(shares_per_sum - shares):
                    pid = total + j * shares_per_sum + k
                    mechanism = round_mechanism(setup, shard, hook)
                    sigma = mechanism.noise_multiplier
                    other = mechanism.run(CanaryWork(received, zero), mechanism.release(sigma), client_noise(setup, pid, t))
                    total_sum += other.arrays[0] - received[0]
                    replayed += _replayed_noise(setup, mechanism, sigma, pid, t)
                if shares == 0 and rate >= 1:
                    continue  # no amplification is charged: the server may know the canary was not in this sum
            elif shares == 0 or (game == "secure-sum" and shares < shares_per_sum):
                continue  # too few survivors: the secure sum releases nothing
            released += explained(total_sum, replayed)
            releases += 1
        made_most = max([made_most, *(o.releases_in_run(RUN_ID) for o in own.values())])
        observed[members.start:members.stop] = released
        ledgers += own.values()
    scores = np.einsum("ij,ij->i", observed, directions) / clip
    ledger = most_charged(ledgers)
    obs = Observation(secrets, scores, canary_cosines(observed, directions), tuple(ledger.charges()),
                      "replace-one", releases)
    return Played(obs, probe.kind, ledger.conversion(),
                  noise_multiplier=float(np.median(sent)) if sent else float(train.noise_multiplier),
                  sample_rate=rate, clip=clip, steps=train.num_rounds if game == "group-sum" else 1,
                  rounds_requested=rounds, releases_per_canary=made_most)


def _replayed_noise(setup: AuditSetup, mechanism: Mechanism, sigma: float, partition_id: int, server_round: int
                    ) -> np.ndarray:
    """The noise a client added, as a server that knows the run seed regenerates it (σ is public)."""
    shares = int(getattr(mechanism, "noise_shares", 1))
    std = sigma * mechanism.clip / math.sqrt(shares)
    (draw,) = gaussian_noise_like([np.zeros(STAND_IN_DIM)], std, server_replay(setup, partition_id, server_round))
    return np.asarray(draw, dtype=np.float64)


# --------------------------------------------------------------------------- the games and the registry
def _update(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
            hook: MechanismHook | None) -> Played:
    return _client_level(setup, "update", canaries=canaries, extension=extension, rng=rng, hook=hook)


def _secure_sum(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
                hook: MechanismHook | None) -> Played:
    return _client_level(setup, "secure-sum", canaries=canaries, extension=extension, rng=rng, hook=hook)


def _group_sum(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
               hook: MechanismHook | None) -> Played:
    return _client_level(setup, "group-sum", canaries=canaries, extension=extension, rng=rng, hook=hook)


UPDATE: Final = Game("update", "update", "client",
                     "every upload of each canary client (one Gaussian release per round, seen alone)", _update)
SECURE_SUM: Final = Game("secure-sum", "secure-share", "client",
                         "only the sum of r_min canary clients' uploads, per round (the secure sum's output)",
                         _secure_sum)
GROUP_SUM: Final = Game("group-sum", "group-share", "client",
                        "only the group's sum of r_m noise shares per round, the canary in it with probability q_m "
                        "(the server does not see who was sampled; at q_m = 1 it knows which sums hold the canary)",
                        _group_sum)
#: **The registry**: a game's name -> where its :class:`Game` lives, ``"module:ATTRIBUTE"``, imported on
#: first use (so a game's own module may import this one). The first game of a mechanism kind is its
#: default; later ones run when named (``--game``). To add a game, define it in its own module and add
#: its one line here (module docstring, "Adding a game").
GAMES: Final[dict[str, str]] = {
    "update": "privet.audit_games:UPDATE",
    "secure-sum": "privet.audit_games:SECURE_SUM",
    "group-sum": "privet.audit_games:GROUP_SUM",
    "dpsgd": "privet.audit_dpsgd:DPSGD",
    "dpsgd-steps": "privet.audit_dpsgd_steps:DPSGD_STEPS",
    "dpsgd-final": "privet.audit_dpsgd:DPSGD_FINAL",
    "centroids": "privet.audit_centroids:CENTROIDS",
    "ddg-sum": "privet.audit_ddg:DDG_SUM",
    "group-ddg-sum": "privet.audit_group_ddg:GROUP_DDG_SUM",
}


def game(name: str) -> Game:
    """The registered game ``name``.

    Raises
    ------
    KeyError
        For a name :data:`GAMES` does not list (the message names those it does).
    ValueError
        Where the registered object is not a :class:`Game` of that name.
    """
    if name not in GAMES:
        raise KeyError(f"no audit game {name!r}; one of {', '.join(GAMES)}")
    module, attribute = GAMES[name].split(":")
    found = getattr(importlib.import_module(module), attribute)
    if not isinstance(found, Game) or found.name != name:
        raise ValueError(f"GAMES[{name!r}] = {GAMES[name]!r} is not a Game named {name!r}")
    return found


def games() -> list[Game]:
    """Every registered game, in :data:`GAMES`' order."""
    return [game(name) for name in GAMES]


def game_for(kind: str) -> Game | None:
    """The default game for mechanisms of ``kind``: the first registered (None: none yet)."""
    return next((g for g in games() if g.mechanism == kind), None)


def select(setup: AuditSetup, names: Sequence[str] = ()) -> tuple[list[Game], list[str]]:
    """The games the config's mechanisms call for, and what is not audited (with why).

    The audited client's mechanism kind (:func:`privet.audit_setup.mechanism_kind`) picks its
    default game, or ``names`` picks registered games of that kind; the second list says why
    nothing (or part of the run) is not audited.

    Raises
    ------
    AuditConfigError
        For a name that is not registered, or a game of another mechanism kind (the line names
        the games that do apply).
    """
    cfg, train = setup.cfg, setup.train
    kind = mechanism_kind(setup)
    if names:
        fitting = [g.name for g in games() if g.mechanism == kind]
        chosen = []
        for name in dict.fromkeys(names):
            if name not in GAMES or game(name).mechanism != kind:
                raise AuditConfigError(f"--game {name!r} does not audit this config's client mechanism ({kind}); "
                                       f"one of: {', '.join(fitting) or 'none registered'}")
            chosen.append(game(name))
        return chosen, []
    found = game_for(kind)
    if found is None:
        from privacy.mechanisms import CentroidRelease, NoPrivacy, SecureDiscreteGaussianShare

        why = {CentroidRelease.kind: f"{cfg.strategy}: DP-FedC's centroid release (clustering task) has no canary "
                                     "game yet",
               SecureDiscreteGaussianShare.kind: "secagg+ddg: the distributed discrete Gaussian sum has no canary "
                                                 "game yet",
               NoPrivacy.kind: f"dp-mode '{train.dp_mode}': no private mechanism, nothing to audit (the ledger "
                               "charges eps = inf)"}
        return [], [why.get(kind, f"mechanism {kind}: no canary game yet")]
    skipped: list[str] = []
    if setup.group and cfg.secure_aggregation == "none":
        skipped.append("group-sum: without secure aggregation the server also sees each upload, which the "
                       "group's charge does not cover (declared in every GDPFed report)")
    if train.personalization:
        skipped.append(f"personalization '{train.personalization}': the personal part is not modelled")
    return [found], skipped


