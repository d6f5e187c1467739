"""Client side of the personalized baselines: PPSGD ("additive") and CENTAUR ("head").

The personal part of a client's model lives in its ``context.state`` as an ArrayRecord
under ``privet.personal.<scheme>`` (named like the model's ``state_dict``), survives the
rounds of a run, and is **never uploaded**. Only the shared part is released, privatised
in one of two ways:

``dp-mode = "update"`` (the papers' user-level DP)
    Clip the shared part's update to ‖Δ‖₂ <= C, add N(0, σ²C²/m), charge the ledger one
    Gaussian release of multiplier σ/√m (``privacy.mechanisms``).
``dp-mode = "dpsgd"`` (sample-level, like FedCEO's code and its UDP-FedAvg)
    Every local step is an Opacus DP-SGD step (per-example clip C, noise σC); what the
    client keeps and what it sends are post-processing of those noisy steps, so the
    ledger charges exactly the DP-SGD steps taken (see each scheme below).

``additive`` (PPSGD, Bietti et al. 2022)
    The model predicts with u + v_k. Each local SGD step computes g = ∇ℓ(u + v_k) on a
    batch and moves u by −η·g and v_k by −α·η·g (joint steps; α =
    ``personal-lr-scale``). Upload: u₀ + privatise(u − u₀). v_k starts at 0.
    Under ``dpsgd``: since ∂ℓ(u+v)/∂u = ∂ℓ(u+v)/∂v = ∇ℓ(w) at w = u + v, both moves use
    the same noisy gradient, and SGD (with momentum) is linear in it; so w = u₀ + v_k is
    trained by DP-SGD at rate (1+α)η and its change Δw is split exactly:
    u = u₀ + Δw/(1+α), v_k ← v_k + αΔw/(1+α). Both are DP (post-processing).
``head`` (CENTAUR, Shen et al. 2023)
    The head is the model's last Linear layer (``tasks.models.
    head_parameter_names``), the body everything else. The client loads its local head
    (the received global head at its first round), trains the head for ``head-epochs``
    epochs with the body frozen, then the body for ``local-epochs`` epochs with the head
    fixed. Upload: body₀ + privatise(body − body₀), and the head entries equal to the
    **received** global head (a zero update). Under ``dpsgd`` both phases are DP-SGD on
    the same data at the same σ and q, so a round charges (head-epochs + local-epochs)
    passes of DP-SGD steps (:func:`dpsgd_workload`) and the local head is DP too.

Local held-out data: with personalization on, a client keeps a deterministic 20%
(:data:`HOLDOUT_FRACTION`, at least one example) of its shard, chosen by a permutation
seeded with (run seed, partition id), as local test data: it trains on the other 80%
and evaluates its personal model (u + v_k, or global body + local head) on the 20%.
Without personalization nothing changes (the whole shard trains).

Guarantee. ``update``: client-level DP of each upload for the shared part only; the
personal part is not released and no DP claim covers it. ``dpsgd``: sample-level DP of
everything the client computes (upload and personal part alike), over the DP-SGD steps.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict
from torch import nn
from torch.func import functional_call

from client.training import LocalTrainingConfig, train_dpsgd
from privacy.mechanisms import Privatizer
from privacy.randomness import NoiseSource
from protocol import keys
from protocol.run_settings import RunSettings
from protocol.train_config import TrainConfig
from tasks.array_dataset import ArrayDataset
from tasks.models import (
    get_weights,
    head_parameter_names,
    seeded_torch,
    set_weights,
    train_plain,
    unwrap,
    weight_names,
)
from tasks.partition import HOLDOUT_FRACTION, training_size
from tasks.sgd import SGD

log = logging.getLogger(__name__)

__all__ = [
    "HOLDOUT_FRACTION",
    "STATE_KEY_PREFIX",
    "training_size",
    "holdout_split",
    "load_personal",
    "personalize_for_evaluation",
    "scheme_of",
    "train_personalized",
]

STATE_KEY_PREFIX = "privet.personal"
_HOLDOUT_SALT = 0x686F6C64  # "hold": keeps this stream apart from other seeded draws


# ------------------------------------------------------------------ plumbing
def scheme_of(config: ConfigRecord | None) -> str:
    """The personalization scheme a config asks for ("" when none).

    Raises
    ------
    ValueError
        If the value is not one of ``keys.PERSONALIZATION_SCHEMES``.
    """
    if config is None:
        return ""
    scheme = str(config.get(keys.PERSONALIZATION, "") or "")
    if scheme and scheme not in keys.PERSONALIZATION_SCHEMES:
        raise ValueError(
            f"'{keys.PERSONALIZATION}' must be one of {keys.PERSONALIZATION_SCHEMES}; found {scheme!r}"
        )
    return scheme


def holdout_split(data: ArrayDataset, run_seed: int, partition_id: int) -> tuple[ArrayDataset, ArrayDataset]:
    """Deterministic (train 80%, local test 20%) split of a client's shard.

    The same (shard, run seed, partition id) always gives the same split, in every
    round and in both the train and the evaluate handler.

    Raises
    ------
    ValueError
        If the shard has fewer than 2 examples.
    """
    n = len(data)
    n_test = n - training_size(n)
    seed = np.random.SeedSequence([int(run_seed), int(partition_id), _HOLDOUT_SALT])
    order = np.random.default_rng(seed).permutation(n)
    return data.subset(np.sort(order[n_test:])), data.subset(np.sort(order[:n_test]))


def _state_key(scheme: str) -> str:
    return f"{STATE_KEY_PREFIX}.{scheme}"


def load_personal(context: Context, scheme: str, expected: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The stored personal arrays, or None if absent or not shaped like ``expected``."""
    record = context.state.get(_state_key(scheme))
    if not isinstance(record, ArrayRecord):
        return None
    stored = dict(zip(record.keys(), record.to_numpy_ndarrays(), strict=True))
    if stored.keys() != expected.keys() or any(
        stored[k].shape != expected[k].shape or stored[k].dtype != expected[k].dtype for k in expected
    ):
        log.warning("personal state %s does not match the model; starting afresh", _state_key(scheme))
        return None
    return stored


def _store_personal(context: Context, scheme: str, arrays: dict[str, np.ndarray]) -> None:
    context.state[_state_key(scheme)] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def _head_split(model: nn.Module) -> tuple[list[str], list[str]]:
    """(head names, body names) of the model; the head must be an ``nn.Linear``."""
    names = weight_names(model)
    head = head_parameter_names(names)
    owner = head[0].rpartition(".")[0]
    module = unwrap(model).get_submodule(owner) if owner else unwrap(model)
    if not isinstance(module, nn.Linear):
        raise ValueError(f"CENTAUR's head must be the model's last Linear layer; {owner!r} is a "
                         f"{type(module).__name__}")
    body = [n for n in names if n not in head]
    if not body:
        log.warning("the whole model is the head: CENTAUR shares nothing (purely local learning)")
    return head, body


def _privatize(received: list[np.ndarray], trained: list[np.ndarray],
               privatize: Privatizer | None) -> tuple[list[np.ndarray], dict[str, float]]:
    """The mechanism's privatisation of the shared part (None, ``dp-mode none``: received + Δ)."""
    if privatize is None:
        return [r + (t - r) for r, t in zip(received, trained, strict=True)], {}
    return privatize(received, trained)


# -------------------------------------------------------------------- training
def _train_additive(
    model: nn.Module, data: ArrayDataset, cfg: LocalTrainingConfig, v: dict[str, np.ndarray], alpha: float
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, float]]:
    """Joint SGD on (u, v) for the additive model u + v; returns (u, v, metrics)."""
    module = unwrap(model)
    state = module.state_dict()
    u_t = {n: t.detach().clone().requires_grad_(True) for n, t in state.items()}
    v_t = {n: torch.tensor(v[n], dtype=state[n].dtype).requires_grad_(True) for n in state}
    optimizers = (SGD(u_t.values(), lr=cfg.learning_rate, momentum=cfg.momentum),
                  SGD(v_t.values(), lr=alpha * cfg.learning_rate, momentum=cfg.momentum))
    generator = torch.Generator().manual_seed(cfg.seed)
    module.train()
    total, seen, steps = 0.0, 0, 0
    with seeded_torch(cfg.seed):  # dropout draws, as in train_plain
        for _ in range(cfg.epochs):
            order = torch.randperm(len(data), generator=generator).numpy()
            for start in range(0, len(data), cfg.batch_size):
                rows = order[start: start + cfg.batch_size]
                x, y = torch.tensor(data.x[rows]), torch.tensor(data.y[rows])
                for optimizer in optimizers:
                    optimizer.zero_grad(set_to_none=True)
                logits = functional_call(module, {n: u_t[n] + v_t[n] for n in state}, (x,))
                loss = F.cross_entropy(logits, y)
                loss.backward()
                for optimizer in optimizers:
                    optimizer.step()
                total += float(loss.detach()) * len(y)
                seen += len(y)
                steps += 1
    u = {n: t.detach().numpy().copy() for n, t in u_t.items()}
    v_new = {n: t.detach().numpy().copy() for n, t in v_t.items()}
    return u, v_new, {keys.TRAIN_LOSS: total / seen, keys.LOCAL_STEPS: float(steps)}


def _train_phase(model: nn.Module, trainable: Sequence[str], data: ArrayDataset, cfg: LocalTrainingConfig,
                 epochs: int, seed: int, dpsgd: _DPSGD | None = None) -> dict[str, float]:
    """SGD on the named parameters only (the others frozen), then unfreeze all.

    Plain SGD or, with ``dpsgd``, Opacus DP-SGD: the frozen parameters get no gradient and no
    noise.
    """
    params = dict(unwrap(model).named_parameters())
    wanted = set(trainable)
    try:
        for name, p in params.items():
            p.requires_grad_(name in wanted)
        if dpsgd is None:
            return train_plain(model, data, epochs=epochs, batch_size=cfg.batch_size, lr=cfg.learning_rate,
                               momentum=cfg.momentum, seed=seed)
        return train_dpsgd(model, data, replace(cfg, epochs=epochs, seed=seed), clip=dpsgd.clip,
                           noise_multiplier=dpsgd.noise_multiplier, noise=dpsgd.noise,
                           grad_sample_mode=dpsgd.grad_sample_mode)[0]
    finally:
        for p in params.values():
            p.requires_grad_(True)


def _train_additive_dpsgd(
    model: nn.Module, data: ArrayDataset, cfg: LocalTrainingConfig, received: dict[str, np.ndarray],
    v: dict[str, np.ndarray], alpha: float, dpsgd: _DPSGD,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, float]]:
    """PPSGD's joint steps under DP-SGD: train w = u₀ + v at rate (1+α)η, split Δw (module doc)."""
    names = list(received)
    start = {n: received[n] + v[n] for n in names}
    set_weights(model, [start[n] for n in names])
    metrics, _ = train_dpsgd(model, data, replace(cfg, learning_rate=(1.0 + alpha) * cfg.learning_rate),
                             clip=dpsgd.clip, noise_multiplier=dpsgd.noise_multiplier,
                             noise=dpsgd.noise, grad_sample_mode=dpsgd.grad_sample_mode)
    moved = {n: w - start[n] for n, w in zip(names, get_weights(model), strict=True)}
    u = {n: received[n] + moved[n] / (1.0 + alpha) for n in names}
    v_new = {n: v[n] + alpha * moved[n] / (1.0 + alpha) for n in names}
    return u, v_new, metrics


@dataclass(frozen=True)
class _DPSGD:
    """The DP-SGD parameters of a ``dpsgd``-mode personalized round."""

    clip: float
    noise_multiplier: float
    grad_sample_mode: str
    noise: NoiseSource


def train_personalized(
    model: nn.Module,
    data: ArrayDataset,
    cfg: LocalTrainingConfig,
    config: TrainConfig,
    context: Context,
    *,
    partition_id: int,
    privatize: Privatizer | None = None,
    dpsgd: tuple[float, float, NoiseSource] | None = None,
    grad_sample_mode: str = "ghost",
) -> dict[str, float]:
    """One round of PPSGD or CENTAUR client work; leaves the **upload** in ``model``.

    ``model`` holds the received global model on entry. On return it holds what the client
    sends: the shared part (privatised by ``privatize``, the round's mechanism, in ``update``
    mode; every step DP-SGD with ``dpsgd = (C, σ, noise)`` in ``dpsgd`` mode), with the
    personal part removed (PPSGD: u only; CENTAUR: the head entries equal to the received
    head). The updated personal part is stored in ``context.state``. ``metrics`` carries
    ``num-examples`` = the number of training examples (the 80% split). Every DP draw comes
    from the mechanism's noise source.

    Raises
    ------
    ValueError
        On an unknown scheme, a model without a Linear head (CENTAUR), or a shard too small to
        split.
    """
    scheme = config.personalization
    sgd = _DPSGD(dpsgd[0], dpsgd[1], grad_sample_mode, dpsgd[2]) if dpsgd is not None else None
    train, _ = holdout_split(data, RunSettings.of(context.run_config).seed, partition_id)
    names = weight_names(model)
    received = dict(zip(names, get_weights(model), strict=True))

    if scheme == keys.PERSONALIZATION_ADDITIVE:
        alpha = config.personal_lr_scale
        if not alpha > 0:
            raise ValueError(f"'{keys.PERSONAL_LR_SCALE}' must be > 0; found {alpha}")
        v = load_personal(context, scheme, received) or {n: np.zeros_like(a) for n, a in received.items()}
        if sgd is not None:
            u, v_new, metrics = _train_additive_dpsgd(model, train, cfg, received, v, alpha, sgd)
            upload, diag = [u[n] for n in names], dict[str, float]()
        else:
            u, v_new, metrics = _train_additive(model, train, cfg, v, alpha)
            upload, diag = _privatize([received[n] for n in names], [u[n] for n in names], privatize)
        _store_personal(context, scheme, v_new)
    elif scheme == keys.PERSONALIZATION_HEAD:
        head, body = _head_split(model)
        local_head = load_personal(context, scheme, {n: received[n] for n in head})
        if local_head is not None:
            set_weights(model, [local_head.get(n, received[n]) for n in names])
        head_metrics = _train_phase(model, head, train, cfg, config.head_epochs, cfg.seed, sgd)
        metrics = (_train_phase(model, body, train, cfg, cfg.epochs, cfg.seed + 1, sgd) if body
                   else {keys.TRAIN_LOSS: head_metrics[keys.TRAIN_LOSS], keys.LOCAL_STEPS: 0.0})
        trained = dict(zip(names, get_weights(model), strict=True))
        if sgd is not None:  # both phases were DP-SGD: the body is already private
            shared_body, diag = [trained[n] for n in body], dict[str, float]()
        else:
            shared_body, diag = _privatize([received[n] for n in body], [trained[n] for n in body], privatize)
        shared = dict(zip(body, shared_body, strict=True))
        upload = [shared[n] if n in shared else received[n].copy() for n in names]
        _store_personal(context, scheme, {n: trained[n] for n in head})
        metrics = {**metrics, "head-train-loss": float(head_metrics[keys.TRAIN_LOSS]),
                   keys.LOCAL_STEPS: float(metrics[keys.LOCAL_STEPS]) + float(head_metrics[keys.LOCAL_STEPS])}
    else:
        raise ValueError(f"'{keys.PERSONALIZATION}' is not set in the train config")
    set_weights(model, upload)
    return {**metrics, **diag, keys.NUM_EXAMPLES: int(len(train))}


# ------------------------------------------------------------------ evaluation
def personalize_for_evaluation(
    content: RecordDict, context: Context, model: nn.Module, data: ArrayDataset, partition_id: int
) -> tuple[nn.Module, ArrayDataset]:
    """For a personalized evaluate request: (personal model, local held-out split).

    The personal model is the received global model with the personal part applied:
    u + v_k (additive) or the local head in place of the global head (head). A client
    without stored personal state evaluates the received model. Without personalization
    in the request, returns ``(model, data)`` unchanged.
    """
    config = content.config_records.get(keys.CONFIG)
    scheme = scheme_of(config)
    if not scheme:
        return model, data
    _, test = holdout_split(data, RunSettings.of(context.run_config).seed, partition_id)
    names = weight_names(model)
    received = dict(zip(names, get_weights(model), strict=True))
    if scheme == keys.PERSONALIZATION_ADDITIVE:
        v = load_personal(context, scheme, received)
        if v is not None:
            set_weights(model, [received[n] + v[n] for n in names])
    else:
        head, _ = _head_split(model)
        local_head = load_personal(context, scheme, {n: received[n] for n in head})
        if local_head is not None:
            set_weights(model, [local_head.get(n, received[n]) for n in names])
    return model, test
