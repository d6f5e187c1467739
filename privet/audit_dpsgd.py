"""``privet audit``'s record-level games: ``dpsgd`` (each round's upload) and ``dpsgd-final`` (the final model).

One client, one run (Steinke, Nasr & Jagielski's one-run setting): its shard of n records holds m
canary records, record i with feature :data:`RECORD_FEATURE`·C on coordinate i of a logistic
regression (privet's ``logreg``) and label (1 + S_i)/2 (S_i = ±1 its secret); the rest are
zero-feature fillers. :func:`client.training.train_dpsgd` trains on it with the config's q, steps,
clip, learning rate and momentum, each round through the client's own steps
(:func:`client.release.client_release`: the plan against a fresh ledger of its budget, the run
with the client's noise source, the charge). The server asks for ``extension`` times the T rounds
it declared; the ledger refuses what it did not plan.

``dpsgd``
    The server sees each round's upload (the model), not the steps inside it. A server that knows
    the run seed replays a ``seeded`` client's DP-SGD noise (:func:`_replayed_dpsgd`) and subtracts
    it where that explains the upload (:func:`privet.audit_games.explained`).
``dpsgd-final``
    The adversary holds only the final model and queries it on the canary records (black-box).

The white-box view of every step is the ``dpsgd-steps`` game (:mod:`privet.audit_dpsgd_steps`).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from client.release import client_release
from privacy.auditing import canary_cosines
from privacy.mechanism_audit import Observation
from privet.audit_games import Game, Played, explained
from privet.audit_setup import (
    RUN_ID,
    AuditSetup,
    MechanismHook,
    client_noise,
    fresh_ledger,
    num_examples,
    round_mechanism,
    server_replay,
)

__all__ = ["DPSGD", "DPSGD_FINAL", "RECORD_FEATURE"]

#: A DP-SGD canary record's feature, in units of C (its gradient's norm exceeds C while the
#: model's probability of its label stays below about 0.76).
RECORD_FEATURE: Final = 3.0


def _record_level(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
                  hook: MechanismHook | None) -> Played:
    """One client's DP-SGD run on a shard holding canary records, each upload observed (module docstring)."""
    return _dpsgd_run(setup, canaries=canaries, extension=extension, rng=rng, hook=hook, view="uploads")


def _record_level_final(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
                        hook: MechanismHook | None) -> Played:
    """The same run, observed only by querying the final model (black-box, ``dpsgd-final``)."""
    return _dpsgd_run(setup, canaries=canaries, extension=extension, rng=rng, hook=hook, view="final")


def _dpsgd_run(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
               hook: MechanismHook | None, view: str) -> Played:
    """The record-level game; ``view`` is what the adversary reads: ``uploads`` or the ``final`` model.

    ``final``: the adversary holds only the released model after the last round and queries it on
    each canary record and on the all-zero record: the logit change on x_i = 3C·e_i less the
    zero record's (the bias) is 3C·(W_T − W_0)[:, i], the canary's coordinate, read through
    forward passes alone. No per-round view and no replay of seeded noise.
    """
    import torch

    from client.training import LocalTrainingConfig
    from client.work import ModelWork
    from privacy.mechanisms import dpsgd_expected_batch
    from tasks.array_dataset import ArrayDataset
    from tasks.model_names import resolve_grad_sample_mode
    from tasks.models import build_model, get_weights, set_weights

    train = setup.train
    n = num_examples(setup)
    examples, _ = train.dpsgd_workload(n)
    m = min(canaries, examples)
    ledger = fresh_ledger(setup)
    clip = train.clip
    secrets = rng.choice(np.array([-1, 1]), size=m)
    x = np.zeros((examples, 1, 1, m), dtype=np.float32)
    x[np.arange(m), 0, 0, np.arange(m)] = RECORD_FEATURE * clip
    y = np.arange(examples, dtype=np.int64) % 2  # fillers: alternating labels (the bias stays balanced)
    y[:m] = (1 + secrets) // 2
    data = ArrayDataset(x, y, num_classes=2, name="canary-shard")
    model = build_model("logreg", input_shape=(1, 1, m), num_classes=2, seed=0)
    mode = resolve_grad_sample_mode(train.grad_sample_mode, "logreg")
    rounds = train.num_rounds * extension
    released = np.zeros((2, m))
    initial = [w.copy() for w in get_weights(model)]
    sigma, rate, steps = float(train.noise_multiplier), 0.0, 0
    releases = 0
    pid = setup.profile.partition_id
    for t in range(1, rounds + 1):
        before = [w.copy() for w in get_weights(model)]
        mechanism = round_mechanism(setup, n, hook)
        local = LocalTrainingConfig(epochs=train.local_epochs, steps=train.local_steps, batch_size=train.batch_size,
                                    learning_rate=train.learning_rate, momentum=train.momentum, seed=t)
        torch.manual_seed(t)
        done = client_release(mechanism, ledger, run_id=RUN_ID, server_round=t,
                              work=ModelWork(model, data, local, mode), noise=client_noise(setup, pid, t))
        if done is None:
            set_weights(model, before)  # refused: the model it trained (if any) is never sent
            continue
        upload, release = done
        releases += 1
        sigma, rate, steps = release.noise_multiplier, release.sample_rate, release.steps
        seen = upload.arrays[0].astype(np.float64) - before[0]
        replayed = _replayed_dpsgd(setup, t, examples, (2, m), sigma * clip, rate, steps, train,
                                   dpsgd_expected_batch(examples, train.batch_size))
        released += explained(seen, replayed)
        set_weights(model, upload.arrays)  # the server sends the upload back as the next model
    if view == "final":
        released = _queried_change(model, initial, x[:m], RECORD_FEATURE * clip)
    scores = (released[1] - released[0]) / clip
    directions = np.zeros((m, 2 * m))
    directions[np.arange(m), m + np.arange(m)] = 1.0
    directions[np.arange(m), np.arange(m)] = -1.0
    cos = canary_cosines(np.concatenate([released[0], released[1]]), directions)
    obs = Observation(secrets, scores, cos, tuple(ledger.charges()), "replace-one", releases)
    return Played(obs, mechanism.kind, ledger.conversion(), noise_multiplier=sigma, sample_rate=rate, clip=clip,
                  steps=steps, rounds_requested=rounds, releases_per_canary=releases)


def _queried_change(model: Any, initial: list[np.ndarray], probes: np.ndarray, feature: float) -> np.ndarray:
    """(W_T − W_0)[:, i] for each canary i, from the logits of the final and the initial model only."""
    import torch

    from tasks.models import get_weights, set_weights

    final = [w.copy() for w in get_weights(model)]
    queries = torch.from_numpy(np.concatenate([probes, np.zeros_like(probes[:1])]))

    def logits(weights: list[np.ndarray]) -> np.ndarray:
        set_weights(model, weights)
        with torch.no_grad():
            return np.asarray(model(queries).double().numpy())

    change = logits(final) - logits(initial)
    set_weights(model, final)
    return np.asarray((change[:-1] - change[-1]).T / feature)


def _replayed_dpsgd(setup: AuditSetup, server_round: int, n: int, shape: tuple[int, int], std: float, rate: float,
                    steps: int, train: Any, expected_batch: int) -> np.ndarray:
    """The weight change that a seeded client's DP-SGD noise alone makes, regenerated from the run seed.

    The source is drawn in :func:`client.training.train_dpsgd`'s order (each step: the Poisson
    coin flips, then the weight's and the bias's noise); SGD with momentum β is linear, so the
    noise of step t moves the weights by −η z_t (1 − β^(S−t)) / ((1 − β) B).
    """
    replay = server_replay(setup, setup.profile.partition_id, server_round)
    beta, lr = train.momentum, train.learning_rate
    total = np.zeros(shape)
    for t in range(steps):
        replay.uniform(n)
        z = replay.normal(shape, std).astype(np.float32).astype(np.float64)
        replay.normal((shape[0],), std)
        remaining = steps - t
        factor = remaining if beta == 0 else (1 - beta ** remaining) / (1 - beta)
        total -= lr * factor * z / expected_batch
    return total


DPSGD: Final = Game("dpsgd", "dpsgd", "record",
                    "each round's uploaded model of one client whose shard holds the canary records (not the steps)",
                    _record_level)
DPSGD_FINAL: Final = Game("dpsgd-final", "dpsgd", "record",
                          "only the final model, queried on the canary records (black-box; one client whose shard "
                          "holds the canary records)", _record_level_final)
