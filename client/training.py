"""Local training under each DP mode: Opacus DP-SGD, whole-update clipping + noise, none.

Each function trains ``model`` in place from the global weights already loaded into it and
returns ``(metrics, steps)``, where ``steps`` is the list of ``(noise_multiplier,
sample_rate, num_steps)`` mechanism invocations that must be charged to the client's ledger.
The guarantees:

``dpsgd``
    Sample-level (ε, δ)-DP of the client's dataset w.r.t. adding/removing one example,
    via DP-SGD with Poisson sampling (rate q = 1/⌈n/B⌉), per-sample clipping to C and
    Gaussian noise σC per step (Abadi et al. 2016; Opacus).
``update``
    Client-level DP of each upload w.r.t. replacing the client's whole dataset: the model
    update Δ is clipped to ‖Δ‖₂ ≤ C and N(0, σ²C²/m) is added locally. One upload alone is
    a Gaussian mechanism with multiplier σ/√m (m = 1: purely local DP); the full σ holds
    only for the sum of m uploads, i.e. against a server that sees only that sum
    (secure aggregation, which this system does not implement). The ledger charges the
    per-upload multiplier σ/√m: what an honest-but-curious server actually sees.
``none``
    No guarantee; only allowed for clients whose budget is infinite.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privacy.accountants import Step
from privacy.mechanisms import local_noise_multiplier, privatize_update
from tasks.datasets import ArrayDataset
from tasks.models import get_weights, set_weights, train_plain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyperparameters of one client's local work in one round."""

    epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    seed: int


def local_sgd(model: nn.Module, data: ArrayDataset, cfg: LocalTrainingConfig) -> dict[str, float]:
    """Plain (non-private) local SGD with this round's hyperparameters."""
    return train_plain(
        model,
        data,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        lr=cfg.learning_rate,
        momentum=cfg.momentum,
        seed=cfg.seed,
    )


def dpsgd_sample_rate(num_examples: int, batch_size: int) -> float:
    """Poisson sampling rate Opacus uses for a loader of batch ``B``: q = 1/⌈n/B⌉."""
    return 1.0 / max(1, -(-num_examples // batch_size))


def dpsgd_steps_per_round(num_examples: int, batch_size: int, epochs: int) -> int:
    """Expected DP-SGD steps in one round: ``epochs`` × ⌈n/B⌉ (one pass = 1/q steps)."""
    return epochs * max(1, -(-num_examples // batch_size))


def train_dpsgd(
    model: nn.Module,
    data: ArrayDataset,
    cfg: LocalTrainingConfig,
    *,
    clip: float,
    noise_multiplier: float,
    grad_sample_mode: str = "ghost",
) -> tuple[dict[str, float], list[Step]]:
    """Sample-level DP-SGD with Opacus; returns metrics and the steps to charge.

    The steps come from the Opacus accountant attached to this round's privacy engine,
    i.e. what the optimizer actually did (Poisson sampling may vary the batch sizes, never
    the number of steps).
    """
    from opacus import PrivacyEngine  # heavy import, only where used

    generator = torch.Generator().manual_seed(cfg.seed)
    dataset = TensorDataset(torch.from_numpy(data.x), torch.from_numpy(data.y))
    loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, generator=generator)
    trainable = [p for p in model.parameters() if p.requires_grad]  # frozen ones get no noise either
    optimizer = torch.optim.SGD(trainable, lr=cfg.learning_rate, momentum=cfg.momentum)
    criterion = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about secure_mode on every call
        engine = PrivacyEngine(accountant="rdp", secure_mode=False)
        private = engine.make_private(
            module=model,
            optimizer=optimizer,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=clip,
            poisson_sampling=True,
            grad_sample_mode=grad_sample_mode,
            noise_generator=torch.Generator().manual_seed(cfg.seed + 1),
        )
    if len(private) == 4:  # ghost clipping also returns a wrapped criterion
        dp_model, dp_optimizer, dp_criterion, dp_loader = private
    else:
        dp_model, dp_optimizer, dp_loader = private
        dp_criterion = criterion
    dp_model.train()
    losses: list[float] = []
    try:
        for _ in range(cfg.epochs):
            for xb, yb in dp_loader:
                if len(yb) == 0:  # Poisson sampling may draw an empty batch; Opacus still steps
                    dp_optimizer.zero_grad()
                    continue
                dp_optimizer.zero_grad()
                loss = dp_criterion(dp_model(xb), yb)
                loss.backward()
                dp_optimizer.step()
                losses.append(float(loss.item()))
    finally:  # unhook, so the same model can be made private again (CENTAUR's two phases)
        dp_optimizer.zero_grad()
        dp_model.to_standard_module()
    steps: list[Step] = [(float(s), float(q), int(n)) for s, q, n in engine.accountant.history]
    metrics = {
        "train-loss": float(np.mean(losses)) if losses else float("nan"),
        "local-steps": float(sum(n for _, _, n in steps)),
    }
    return metrics, steps


def train_update_dp(
    model: nn.Module,
    data: ArrayDataset,
    cfg: LocalTrainingConfig,
    *,
    clip: float,
    noise_multiplier: float,
    noise_shares: int,
) -> tuple[dict[str, float], list[Step]]:
    """Client-level DP: plain local SGD, then clip Δ to C and add N(0, σ²C²/m) locally.

    The new model sent up is w₀ + clip(Δ) + noise. Charged to the ledger: one Gaussian
    mechanism with multiplier σ/√m at sampling rate 1 (the server knows who took part).
    """
    start = [w.copy() for w in get_weights(model)]
    metrics = local_sgd(model, data, cfg)
    trained = get_weights(model)
    update = [w - w0 for w, w0 in zip(trained, start)]
    rng = np.random.default_rng(cfg.seed)
    noisy, diag = privatize_update(
        update, clip=clip, noise_multiplier=noise_multiplier, noise_shares=noise_shares, rng=rng
    )
    set_weights(model, [w0 + u for w0, u in zip(start, noisy)])
    metrics = {**metrics, **diag}
    per_upload = local_noise_multiplier(noise_multiplier, noise_shares)
    return metrics, [(per_upload, 1.0, 1)]


def train_non_private(
    model: nn.Module, data: ArrayDataset, cfg: LocalTrainingConfig
) -> tuple[dict[str, float], list[Step]]:
    """Plain local SGD; charges one zero-noise step, so the ledger honestly reads ε = ∞."""
    metrics = local_sgd(model, data, cfg)
    return metrics, [(0.0, 1.0, 1)]
