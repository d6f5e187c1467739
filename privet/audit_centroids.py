"""``privet audit``'s ``centroids`` game: DP-FedC's noisy centroids, client level, one upload at a time.

What a sampled DP-FedC client releases in round t is W̃_i = W^t + clip(W_i − W^t, C) + N(0, z²C²)
entrywise (paper 004, eq. 19; :class:`privacy.mechanisms.CentroidRelease`), and the server sees
every W̃_i (DP-FedC runs no secure sum). Each canary is a client whose local change of the
broadcast centroids is W_i − W^t = S·2C·U, U a random unit direction (Frobenius norm 1) of a
stand-in centroid matrix (:func:`centroid_shape`), S = ±1 its secret: clipping acts, and
replacing the canary's data by its opposite moves the release by 2C, the replace-one sensitivity
the charge assumes. Each canary round runs the client's own steps
(:func:`client.release.client_release`): the mechanism the train config makes
(:meth:`protocol.train_config.TrainConfig.mechanism` with DP-FedC's section, as
:class:`client.dpfedc.ClusteringTask` reads it: rigorous or the paper's calibration), the plan
against a fresh ledger of the client's budget, the mechanism's ``run`` with the client's noise
source, and the charge. The server asks for ``extension`` times the T rounds it declared.

The attack: S is guessed from Σ_t ⟨W̃_i^t − W^t, U⟩ / C, the Gaussian mechanism's sufficient
statistic; and, as in every game, a server that knows the run seed replays a ``seeded`` client's
noise (one draw of N(0, z²C²) of the centroids' shape, :func:`privacy.centroid_noise.privatize_centroids`)
and subtracts it where that explains the upload.

In the paper's calibration C is the W phase's bound Q₂ᵗG/η (:meth:`client.dpfedc.ClusteringWork.update_bound`);
a canary states its own (:data:`PAPER_UPDATE_BOUND`): the noise scales with it, so the game does
not depend on it. The charge is the ledger's ``(z, 1, 1)`` per upload, the rigorous ε of the
release (the paper's nominal ε̄ is not a guarantee and is not what is audited).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Final

import numpy as np

from client.release import client_release
from privacy.auditing import canary_cosines
from privacy.ledger import PrivacyLedger
from privacy.mechanism_audit import Observation
from privacy.mechanisms import Mechanism, Privatizer, Upload
from privacy.randomness import NoiseSource
from privet.audit_games import CANARY_NORM, STAND_IN_DIM, Game, explained, most_charged
from privet.audit_setup import (
    RUN_ID,
    AuditConfigError,
    AuditSetup,
    MechanismHook,
    client_noise,
    fresh_ledger,
    server_replay,
)

__all__ = ["CENTROIDS", "CENTROIDS_OBSERVES", "PAPER_UPDATE_BOUND", "CentroidCanaryWork", "centroid_game",
           "centroid_shape"]

#: What the ``centroids`` game's adversary sees.
CENTROIDS_OBSERVES: Final = ("every upload W~_i of each canary client (its clipped centroid update plus "
                             "N(0, z^2 C^2) per entry, seen alone: DP-FedC runs no secure sum)")

#: The W phase's bound Q₂G/η a canary states in the paper's calibration (the noise scales with it).
PAPER_UPDATE_BOUND: Final = 1.0


def centroid_shape(clusters: int, coordinates: int) -> tuple[int, int]:
    """The stand-in centroid matrix W (features × k): about ``coordinates`` entries, k columns."""
    return max(1, coordinates // clusters), clusters


@dataclass
class CentroidCanaryWork:
    """A DP-FedC client's local work whose local centroids are the broadcast ones plus a fixed change.

    Implements :class:`privacy.mechanisms.centroids.ClusteringWork` (``update_bound``).
    """

    received: np.ndarray
    update: np.ndarray
    bound: float = PAPER_UPDATE_BOUND

    def train(self, privatize: Privatizer | None) -> Upload:
        """W_i = W^t + the canary's change; ``privatize`` is the mechanism's (eq. 19)."""
        trained = self.received + self.update
        if privatize is None:
            return Upload([trained])
        upload, diagnostics = privatize([self.received], [trained])
        return Upload(upload, diagnostics)

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """DP-FedC has no DP-SGD."""
        raise ValueError("a DP-FedC canary has no DP-SGD work")

    def update_bound(self) -> float:
        """Q₂G/η as the canary states it (the paper's calibration clips to it)."""
        return self.bound


def _clustering(setup: AuditSetup) -> tuple[Any, Any]:
    """The audited client's train config and DP-FedC section, as the strategy sends them."""
    from protocol.dpfedc import DPFedCRound
    from protocol.train_config import TrainConfig
    from server.registry import train_config

    record = setup.strategy.node_config(1, SimpleNamespace(node_id=setup.profile.partition_id),
                                        train_config(setup.cfg))
    return TrainConfig.decode(record), DPFedCRound.decode(record)


def _num_examples(setup: AuditSetup, section: Any) -> int:
    """n_i: the paper's calibration depends on it through q = Q₂b/n_i (the rigorous one does not)."""
    if section.calibration != "paper":
        return 1
    from client.dpfedc import ClusteringTask
    from protocol.run_settings import RunSettings

    return ClusteringTask.count(RunSettings.of(setup.run_config), setup.profile)


def centroid_game(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
                  hook: MechanismHook | None = None) -> tuple[Observation, dict[str, Any]]:
    """Canary clients through DP-FedC's centroid release (module docstring).

    Parameters
    ----------
    setup : privet.audit_setup.AuditSetup
        The audited run config (a DP-FedC strategy).
    canaries : int
        Canary clients, one upload each per round.
    extension : int
        The server asks for ``extension`` × T rounds.
    rng : numpy.random.Generator
        The auditor's own randomness (secrets, directions); never the clients' noise.
    hook : callable, optional
        **Tests only**: wraps the mechanism of every client round.

    Returns
    -------
    Observation, dict
        What the statistics need, and the figures of the report (σ, q, C, the releases).
    """
    train, section = _clustering(setup)
    n = _num_examples(setup, section)

    def mechanism_of() -> Mechanism:
        mechanism = train.mechanism(num_examples=n, delta=setup.profile.delta, clustering=section)
        return hook(mechanism) if hook is not None else mechanism

    probe = mechanism_of()
    if not probe.private:
        raise AuditConfigError("dpfedc.calibration = 'none': nothing private to audit (the ledger charges eps = inf)")
    paper = bool(getattr(probe, "paper", False))
    clip = PAPER_UPDATE_BOUND if paper else probe.clip
    shape = centroid_shape(section.k, STAND_IN_DIM)
    dim = shape[0] * shape[1]
    rounds = train.num_rounds * extension
    template = fresh_ledger(setup)
    secrets = rng.choice(np.array([-1, 1]), size=canaries)
    directions = rng.standard_normal((canaries, dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    observed = np.zeros((canaries, dim))
    received = np.zeros(shape)
    ledgers: list[PrivacyLedger] = []
    sent: list[float] = []
    releases = made_most = 0
    for i in range(canaries):
        ledger = copy.deepcopy(template)
        change = (CANARY_NORM * clip * secrets[i] * directions[i]).reshape(shape)
        for t in range(1, rounds + 1):
            mechanism = mechanism_of()
            done = client_release(mechanism, ledger, run_id=RUN_ID, server_round=t,
                                  work=CentroidCanaryWork(received, change), noise=client_noise(setup, i, t))
            if done is None:
                continue  # refused: nothing released
            upload, release = done
            sent.append(release.noise_multiplier)
            seen = np.asarray(upload.arrays[0], np.float64).ravel() - received.ravel()
            replayed = server_replay(setup, i, t).normal(shape, release.noise_multiplier * clip).ravel()
            observed[i] += explained(seen, replayed)
            releases += 1
        made_most = max(made_most, ledger.releases_in_run(RUN_ID))
        ledgers.append(ledger)
    scores = np.einsum("ij,ij->i", observed, directions) / clip
    charged = most_charged(ledgers)
    obs = Observation(secrets, scores, canary_cosines(observed, directions), tuple(charged.charges()), "replace-one",
                      releases)
    extras = {"noise_multiplier": float(np.median(sent)) if sent else float(probe.noise_multiplier),
              "sample_rate": 1.0, "clip": clip, "steps": 1, "rounds_requested": rounds,
              "releases_per_canary": made_most, "mechanism": probe.kind, "accountant": charged.conversion(),
              "calibration": section.calibration, "shape": list(shape)}
    return obs, extras


#: The registered game (:data:`privet.audit_games.GAMES`).
CENTROIDS: Final = Game("centroids", "centroids", "client", CENTROIDS_OBSERVES, centroid_game)
