r"""``privet audit``'s ``dpsgd-steps`` game: DP-SGD white-box per step, through the client's real DP-SGD code.

Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini & Terzis, "Tight Auditing of Differentially
Private Machine Learning" (USENIX Security 2023): with gradient canaries and an adversary who sees
every step's noisy gradient sum, an audit of DP-SGD reaches the accountant's ε. Here the steps are
the client's own: :func:`client.training.train_dpsgd` through the round's mechanism
(:class:`privacy.mechanisms.DPSGD`, :func:`client.release.client_release`: plan against a fresh
ledger of the client's budget, ``run`` with the client's noise source, charge), with the
per-example gradients, clipping and noise of whatever ``grad-sample-mode`` resolves to
(``auto``: book-keeping, :mod:`client.bk_dpsgd`; ``hooks``/``ghost``: Opacus).

**The canaries** (one client, one run, m canaries: Steinke, Nasr & Jagielski's one-run setting).
The client's shard of n records (the config's n, so q = 1/⌈n/B⌉ and the steps are the run's)
holds m canary records; record i has feature a = :data:`DIRAC_FEATURE`·C on coordinate i of a
logistic regression without bias (privet's ``logreg``, its bias frozen at 0: frozen parameters get
neither gradient nor noise in either code path) and label (1 + S_i)/2; the other n − m records are
all-zero features, whose gradient is 0. Record i's gradient is then a Dirac canary in the basis of
the model: it lies on the unit direction v_i = (e_{1,i} − e_{0,i})/√2 of the weight matrix,
−S_i·a·p_{1−y}·√2·v_i (p the model's probabilities on it), of norm well above C while the model's
probability of its label stays below about 0.76, so clipping makes it exactly −S_i·C·v_i; no other
record touches coordinate column i.

**What the adversary sees** (white-box, the server's view if it saw every step): each step's
noisy clipped gradient sum o_t = Σ_{j ∈ batch} clip(g_j) + N(0, σ²C² I), read as the optimizer
step's ``p.grad`` times the expected batch size (global pre-step hooks on ``tasks.sgd.SGD`` and
``torch.optim.SGD``, the optimizers the code paths step; nothing in them is changed), and the weights w_t before the
step. Per canary and step, the projection z = ⟨o_t, v_i⟩ is N(0, σ²C²) when the record was not
sampled and N(μ_S, σ²C²) when it was (probability q), with μ_S the clipped gradient's projection
for label (1 + S)/2 at w_t, which the adversary computes. The score is the sum over steps of the
log-likelihood ratio of the two mixtures

    log[(1 − q)·φ(z) + q·φ(z − μ₊)] − log[(1 − q)·φ(z) + q·φ(z − μ₋)],   φ = N(0, σ²C²) density,

the optimal per-step test (Neyman–Pearson). As in every game, a server that knows the run seed
replays a ``seeded`` client's noise (the Poisson coins, then one N(0, σ²C²) draw per trainable
parameter, :func:`client.training.train_dpsgd`'s order) and subtracts it where that explains the
step. The server asks for ``extension`` × T rounds; the client's ledger refuses what it did not plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import numpy as np

from client.release import client_release
from privacy.auditing import canary_cosines
from privacy.mechanism_audit import Observation
from privet.audit_games import Game, explained
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

__all__ = ["DIRAC_FEATURE", "DPSGD_STEPS", "DPSGD_STEPS_OBSERVES", "dpsgd_steps_game", "mixture_log_ratio", "projected_clipped"]

#: A canary record's one feature, in units of C (its gradient norm exceeds C while p(label) < 0.76).
DIRAC_FEATURE: Final = 3.0

#: Opacus' (and book-keeping's) guard in the clip factor min(1, C / (‖g‖ + 1e-6)).
_NORM_EPS: Final = 1e-6

#: What the ``dpsgd-steps`` game's adversary sees.
DPSGD_STEPS_OBSERVES: Final = ("every DP-SGD step's noisy clipped gradient sum of one client whose shard holds the "
                               "canary records, and the weights before it (white-box: the server's view if it saw "
                               "each step)")


def projected_clipped(weights: np.ndarray, feature: float, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """⟨clip(g_i), v_i⟩ for label 1 and for label 0, per canary i, at the weights W (2 × m, no bias).

    The logits of canary i are a·W[:, i]; the gradient of the cross-entropy on W[:, i] is a·(p − e_y),
    which is a·p₀·(1, −1) for y = 1 and a·p₁·(−1, 1) for y = 0, so its projection on
    v_i = (−1, 1)/√2 is −√2·a·p₀ (y = 1) and +√2·a·p₁ (y = 0), of norm equal to its absolute value,
    times the clip factor min(1, C / (‖g‖ + 10⁻⁶)).
    """
    logits = feature * np.asarray(weights, np.float64)
    diff = logits[1] - logits[0]
    p1 = 1.0 / (1.0 + np.exp(-diff))
    p0 = 1.0 - p1
    norm_pos, norm_neg = math.sqrt(2.0) * feature * p0, math.sqrt(2.0) * feature * p1
    pos = -norm_pos * np.minimum(1.0, clip / (norm_pos + _NORM_EPS))
    neg = norm_neg * np.minimum(1.0, clip / (norm_neg + _NORM_EPS))
    return pos, neg


def mixture_log_ratio(z: np.ndarray, rate: float, std: float, mean_pos: np.ndarray,
                      mean_neg: np.ndarray) -> np.ndarray:
    """log[(1 − q)φ(z) + qφ(z − μ₊)] − log[(1 − q)φ(z) + qφ(z − μ₋)], φ the N(0, std²) density."""
    base = (np.log1p(-rate) - 0.5 * (z / std) ** 2) if rate < 1 else np.full_like(z, -np.inf)
    up = math.log(rate) - 0.5 * ((z - mean_pos) / std) ** 2
    down = math.log(rate) - 0.5 * ((z - mean_neg) / std) ** 2
    return np.asarray(np.logaddexp(base, up) - np.logaddexp(base, down), dtype=np.float64)


@contextmanager
def _watching_steps(weight: Any, seen: list[tuple[np.ndarray, np.ndarray]]) -> Iterator[None]:
    """Record (W before the step, W.grad) at every SGD step that updates ``weight``.

    Both optimizers a client steps are watched: ``tasks.sgd.SGD`` (book-keeping and Linear-only
    DP-SGD) and ``torch.optim.SGD`` (the one Opacus' DPOptimizer wraps; the wrapper itself is skipped).
    """
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from tasks.sgd import SGD, register_step_pre_hook

    def record(params: Iterable[Any]) -> None:
        if not any(p is weight for p in params):
            return
        grad = weight.grad
        assert grad is not None, "a DP-SGD step without a gradient"
        seen.append((weight.detach().cpu().numpy().astype(np.float64),
                     grad.detach().cpu().numpy().astype(np.float64)))

    def torch_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if type(optimizer) is torch.optim.SGD:  # Opacus' DPOptimizer wraps the SGD that steps
            record(p for group in optimizer.param_groups for p in group["params"])

    def own_hook(optimizer: SGD) -> None:
        record(optimizer.params)

    handles = [register_optimizer_step_pre_hook(torch_hook), register_step_pre_hook(own_hook)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def dpsgd_steps_game(setup: AuditSetup, *, canaries: int, extension: int, rng: np.random.Generator,
                     hook: MechanismHook | None = None) -> tuple[Observation, dict[str, Any]]:
    """Canary records in one client's shard, every DP-SGD step observed (module docstring).

    Parameters
    ----------
    setup : privet.audit_setup.AuditSetup
        The audited run config (``dp-mode = "dpsgd"``).
    canaries : int
        Canary records (at most the shard's n).
    extension : int
        The server asks for ``extension`` × T rounds.
    rng : numpy.random.Generator
        The auditor's own randomness (the secrets); never the clients' noise.
    hook : callable, optional
        **Tests only**: wraps the mechanism of every client round.
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
    clip = float(train.clip)
    feature = DIRAC_FEATURE * clip
    secrets = rng.choice(np.array([-1, 1]), size=m)
    x = np.zeros((examples, 1, 1, m), dtype=np.float32)
    x[np.arange(m), 0, 0, np.arange(m)] = feature
    y = np.arange(examples, dtype=np.int64) % 2  # fillers: zero features, zero gradient
    y[:m] = (1 + secrets) // 2
    data = ArrayDataset(x, y, num_classes=2, name="dirac-canary-shard")
    model = build_model("logreg", input_shape=(1, 1, m), num_classes=2, seed=0)
    layer = model.get_submodule("fc")
    assert isinstance(layer, torch.nn.Linear)
    weight = layer.weight
    layer.bias.requires_grad_(False)  # no bias: each canary's gradient lies on its own direction v_i
    mode = resolve_grad_sample_mode(train.grad_sample_mode, "logreg")
    batch = dpsgd_expected_batch(examples, train.batch_size)
    rounds = train.num_rounds * extension
    scores = np.zeros(m)
    total = np.zeros((2, m))
    sigma, rate, steps_per_round = float(train.noise_multiplier), 0.0, 0
    releases = steps_seen = 0
    pid = setup.profile.partition_id
    kind = ""
    for t in range(1, rounds + 1):
        before = [w.copy() for w in get_weights(model)]
        mechanism = round_mechanism(setup, n, hook)
        kind = mechanism.kind
        local = LocalTrainingConfig(epochs=train.local_epochs, steps=train.local_steps, batch_size=train.batch_size,
                                    learning_rate=train.learning_rate, momentum=train.momentum, seed=t)
        torch.manual_seed(t)
        seen: list[tuple[np.ndarray, np.ndarray]] = []
        with _watching_steps(weight, seen):
            done = client_release(mechanism, ledger, run_id=RUN_ID, server_round=t,
                                  work=ModelWork(model, data, local, mode), noise=client_noise(setup, pid, t))
        if done is None:
            set_weights(model, before)  # refused: the model it trained (if any) is never sent
            continue
        upload, release = done
        releases += 1
        sigma, rate, steps_per_round = release.noise_multiplier, release.sample_rate, release.steps
        std = sigma * clip
        replay = server_replay(setup, pid, t)
        for w_t, grad in seen:
            sums = grad * batch  # the noisy clipped sum of the step
            replay.uniform(examples)  # the Poisson coins, then the weight's noise (the frozen bias draws none)
            sums = explained(sums, replay.normal((2, m), std))
            z = (sums[1] - sums[0]) / math.sqrt(2.0)
            pos, neg = projected_clipped(w_t, feature, clip)
            scores += mixture_log_ratio(z, rate, std, pos, neg)
            total += sums
        steps_seen += len(seen)
        set_weights(model, upload.arrays)  # the server sends the upload back as the next model
    directions = np.zeros((m, 2 * m))  # S = +1 moves W[0, i] up and W[1, i] down
    directions[np.arange(m), np.arange(m)] = 1.0
    directions[np.arange(m), m + np.arange(m)] = -1.0
    cos = canary_cosines(np.concatenate([total[0], total[1]]), directions)
    obs = Observation(secrets, scores, cos, tuple(ledger.charges()), "replace-one", steps_seen)
    extras = {"noise_multiplier": sigma, "sample_rate": rate, "clip": clip, "steps": steps_per_round,
              "rounds_requested": rounds, "releases_per_canary": releases, "mechanism": kind,
              "accountant": ledger.conversion(), "records": examples, "grad_sample_mode": mode,
              "steps_observed": steps_seen}
    return obs, extras


#: The registered game (:data:`privet.audit_games.GAMES`): the same mechanism kind as ``dpsgd``, whose
#: game :func:`privet.audit_games.select` picks for a run config; this one is run by name.
DPSGD_STEPS: Final = Game("dpsgd-steps", "dpsgd", "record", DPSGD_STEPS_OBSERVES, dpsgd_steps_game)
