"""Local training under each DP mode: Opacus DP-SGD, whole-update clipping + noise, none.

Each function trains ``model`` in place from the global weights already loaded into it and
returns ``(metrics, steps)``, where ``steps`` is the list of ``(noise_multiplier,
sample_rate, num_steps)`` mechanism invocations that must be charged to the client's ledger.
Every DP random draw (Gaussian noise, Poisson sampling) comes from the ``noise`` source the
caller passes (:mod:`privacy.randomness`: entropy that never leaves the client); the
non-DP randomness of local SGD (shuffling, dropout) may be seeded reproducibly. The
guarantees, both under the **replace-one** relation (the dataset size is public):

``dpsgd``
    Sample-level (ε, δ)-DP of the client's dataset w.r.t. replacing one example by
    another, via DP-SGD with Poisson sampling (rate q = 1/⌈n/B⌉), per-sample clipping to C
    and Gaussian noise σC per step (Abadi et al. 2016; Opacus for the per-sample
    gradients, or book-keeping clipping for models of Linear and Conv2d layers, which forms
    the clipped sum without them: :mod:`client.bk_dpsgd`, :mod:`client.linear_dpsgd`).
    Every one of the ``epochs × ⌈n/B⌉`` steps (or τ = ``local-steps``) is taken and
    charged, an empty Poisson batch included (it releases noise only).
``update``
    Client-level DP of each upload w.r.t. replacing the client's whole dataset: the model
    update Δ is clipped to ‖Δ‖₂ <= C and N(0, σ²C²/m) is added locally. One upload alone is
    a Gaussian mechanism with multiplier σ/√m and sensitivity 2C (two updates in the
    C-ball); the full σ holds only for the sum of m uploads, i.e. against a server that
    sees only that sum (secure aggregation). The ledger charges the per-upload multiplier
    σ/√m under replace-one: what an honest-but-curious server actually sees.
``none``
    No guarantee; only allowed for clients whose budget is infinite.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from client.bk_dpsgd import BookKeepingDPSGD
from client.linear_dpsgd import LinearDPSGD
from privacy.accountants import Step, import_opacus
from privacy.mechanisms import dpsgd_expected_batch, dpsgd_sample_rate, dpsgd_steps_per_round
from privacy.randomness import NoiseSource
from tasks.array_dataset import ArrayDataset
from tasks.model_names import BK_MODE, LINEAR_MODE
from tasks.models import train_plain
from tasks.sgd import SGD

# Opacus' ghost clipping backpropagates from the loss to module outputs on purpose, and
# PyTorch warns about it on every step (60 times in the default run): not the user's business.
# A process-wide filter, as ``catch_warnings`` is not thread-safe (simulated clients share a process).
warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyperparameters of one client's local work in one round."""

    epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    seed: int
    steps: int = 0  # τ mini-batch steps per round when > 0 (then ``epochs`` is ignored)


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
        steps=cfg.steps,
    )


def poisson_batches(num_examples: int, sample_rate: float, steps: int, noise: NoiseSource):
    """Yield ``steps`` index arrays; each index is in a batch independently with prob. q.

    The coin flips come from the private ``noise`` source, so nobody else can tell which
    examples a step used. Batches may be empty.
    """
    for _ in range(steps):
        yield np.flatnonzero(noise.uniform(num_examples) < sample_rate)


def _private_noise(optimizer, noise: NoiseSource) -> None:
    """Make an Opacus DP optimizer draw its Gaussian noise from ``noise``.

    Replaces the instance's ``add_noise`` (Opacus draws from a ``torch.Generator``): the
    same arithmetic, p.grad = p.summed_grad + N(0, (σC)²), with the draw from the source.
    """
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    def add_noise() -> None:
        std = optimizer.noise_multiplier * optimizer.max_grad_norm
        for p in optimizer.params:
            _check_processed_flag(p.summed_grad)
            draw = noise.normal(tuple(p.summed_grad.shape), std)
            p.grad = (p.summed_grad + torch.from_numpy(draw).to(p.summed_grad.dtype)).view_as(p)
            _mark_as_processed(p.summed_grad)

    optimizer.add_noise = add_noise


def _finite_examples(optimizer) -> None:
    """Make an Opacus DP optimizer give an example whose per-sample gradient is not finite the zero gradient.

    Wraps the instance's ``clip_and_accumulate``: such an example's rows of every ``p.grad_sample``
    are set to 0 first (norm 0, so it adds nothing), as book-keeping does (:mod:`client.bk_dpsgd`,
    (3')): otherwise one record on which the model overflows makes the step NaN, a data-dependent
    event no charge covers. Ghost clipping clips inside the loss's backward pass and is not wrapped.
    """
    clip_and_accumulate = optimizer.clip_and_accumulate

    def finite_then_clip() -> None:
        samples = optimizer.grad_samples
        if samples and len(samples[0]):
            diverged = torch.zeros(len(samples[0]), dtype=torch.bool, device=samples[0].device)
            for g in samples:
                diverged |= ~torch.isfinite(g.reshape(len(g), -1)).all(dim=1)
            if bool(diverged.any()):
                for p in optimizer.params:
                    p.grad_sample[diverged] = 0
        clip_and_accumulate()

    optimizer.clip_and_accumulate = finite_then_clip


def _empty_step(optimizer, ghost: bool) -> None:
    """One DP-SGD step on an empty batch: nothing to clip, the update is noise only."""
    for p in optimizer.params:
        if ghost:  # the fast-gradient-clipping optimizer accumulates p.grad (already clipped)
            p.grad = torch.zeros_like(p)
        else:  # per-sample gradients of zero samples
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
    optimizer.step()


def train_dpsgd(
    model: nn.Module,
    data: ArrayDataset,
    cfg: LocalTrainingConfig,
    *,
    clip: float,
    noise_multiplier: float,
    noise: NoiseSource,
    grad_sample_mode: str = "ghost",
) -> tuple[dict[str, float], list[Step]]:
    """Sample-level DP-SGD; returns metrics and the steps to charge.

    Opacus computes the per-sample gradients and clips them (``bk``: book-keeping clipping,
    :mod:`client.bk_dpsgd`; ``linear``: its Linear-only form, :mod:`client.linear_dpsgd`); the
    batches come from :func:`poisson_batches` and the noise from ``noise``, drawn in the same
    order in every mode. Exactly ``epochs × ⌈n/B⌉`` steps (τ = ``cfg.steps`` when > 0) are taken at
    q = 1/⌈n/B⌉ and charged as such, the same figures the round was planned and checked with.
    """
    n = len(data)
    rate = dpsgd_sample_rate(n, cfg.batch_size)
    steps = dpsgd_steps_per_round(n, cfg.batch_size, cfg.epochs, cfg.steps)
    x_all, y_all = torch.from_numpy(data.x), torch.from_numpy(data.y)
    trainable = [p for p in model.parameters() if p.requires_grad]  # frozen ones get no noise either
    batches = poisson_batches(n, rate, steps, noise)
    if grad_sample_mode in (LINEAR_MODE, BK_MODE):
        kind = LinearDPSGD if grad_sample_mode == LINEAR_MODE else BookKeepingDPSGD
        stepper = kind(model, clip=clip, noise_multiplier=noise_multiplier,
                       expected_batch_size=dpsgd_expected_batch(n, cfg.batch_size), noise=noise)
        sgd = SGD(trainable, lr=cfg.learning_rate, momentum=cfg.momentum)
        losses = _book_keeping_steps(model, sgd, stepper, x_all, y_all, batches)
    else:  # Opacus wraps a torch.optim optimizer
        optimizer = torch.optim.SGD(trainable, lr=cfg.learning_rate, momentum=cfg.momentum)
        losses = _opacus_steps(model, optimizer, x_all, y_all, batches, cfg.batch_size, clip=clip,
                               noise_multiplier=noise_multiplier, noise=noise, grad_sample_mode=grad_sample_mode)
    metrics = {
        "train-loss": float(np.mean(losses)) if losses else float("nan"),
        "local-steps": float(steps),
    }
    return metrics, [(float(noise_multiplier), rate, steps)]


def _book_keeping_steps(model: nn.Module, optimizer: SGD, stepper: BookKeepingDPSGD,
                        x_all: torch.Tensor, y_all: torch.Tensor, batches: Iterator[np.ndarray]) -> list[float]:
    """DP-SGD steps by book-keeping clipping on the given batches; the loss of each non-empty one."""
    model.train()
    losses: list[float] = []
    for batch in batches:
        if len(batch) == 0:
            stepper.empty_gradients()
        else:
            index = torch.from_numpy(batch)
            losses.append(stepper.batch_gradients(x_all[index], y_all[index]))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return losses


def _opacus_steps(model: nn.Module, optimizer: torch.optim.Optimizer, x_all: torch.Tensor, y_all: torch.Tensor,
                  batches: Iterator[np.ndarray], batch_size: int, *, clip: float, noise_multiplier: float,
                  noise: NoiseSource, grad_sample_mode: str) -> list[float]:
    """DP-SGD steps by Opacus on the given batches; the loss of each non-empty one."""
    import_opacus()  # heavy, only where used; without Opacus' root log handler
    from opacus import PrivacyEngine

    # Opacus reads q off this loader (its batches are never used); the expected batch size it
    # divides the noisy sum by is set below.
    loader = DataLoader(TensorDataset(x_all, y_all), batch_size=batch_size)
    criterion = nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about secure_mode and poisson_sampling
        engine = PrivacyEngine(accountant="rdp", secure_mode=False)
        private = engine.make_private(
            module=model,
            optimizer=optimizer,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=clip,
            poisson_sampling=False,
            grad_sample_mode=grad_sample_mode,
        )
    if len(private) == 4:  # ghost clipping also returns a wrapped criterion
        dp_model, dp_optimizer, dp_criterion, _ = private
    else:
        dp_model, dp_optimizer, _ = private
        dp_criterion = criterion
    _private_noise(dp_optimizer, noise)
    if grad_sample_mode != "ghost":
        _finite_examples(dp_optimizer)
    dp_optimizer.expected_batch_size = dpsgd_expected_batch(len(x_all), batch_size)  # not int(n·q): float rounding
    ghost = grad_sample_mode == "ghost"
    dp_model.train()
    losses: list[float] = []
    try:
        for batch in batches:
            dp_optimizer.zero_grad()
            if len(batch) == 0:
                _empty_step(dp_optimizer, ghost)
                continue
            index = torch.from_numpy(batch)
            loss = dp_criterion(dp_model(x_all[index]), y_all[index])
            loss.backward()
            dp_optimizer.step()
            losses.append(float(loss.item()))
    finally:  # unhook, so the same model can be made private again (CENTAUR's two phases)
        dp_optimizer.zero_grad()
        dp_model.to_standard_module()
    return losses
