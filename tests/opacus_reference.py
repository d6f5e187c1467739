"""Opacus' own per-sample clipping as the reference the closed-form DP-SGD steps are checked against."""

from __future__ import annotations

import warnings

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def opacus_clipped_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float,
                            expected: int) -> list[torch.Tensor]:
    """Opacus ``hooks`` at σ = 0: Σ_i clip_C(g_i) / ``expected``, per parameter that requires grad.

    The loader is set up so that Opacus' expected batch size is ``expected``; the forward pass
    runs under ``torch.manual_seed(11)`` (the same dropout mask as the step under test, which
    seeds the same way). The model is returned to a standard module afterwards.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    loader = DataLoader(TensorDataset(torch.zeros(expected * 5, 1), torch.zeros(expected * 5)), batch_size=expected)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, optimizer, _ = PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(params, lr=0.0), data_loader=loader, noise_multiplier=0.0,
            max_grad_norm=clip, poisson_sampling=False, grad_sample_mode="hooks")
        dp_model.train()
        torch.manual_seed(11)
        nn.functional.cross_entropy(dp_model(x), y).backward()
    optimizer.pre_step()  # clip, sum, noise (none), divide by the expected batch size
    grads = [p.grad.detach().clone() for p in params]
    optimizer.zero_grad(set_to_none=True)
    dp_model.to_standard_module()
    return grads
