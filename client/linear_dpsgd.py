"""DP-SGD steps for models whose trainable layers are all ``nn.Linear``, without per-sample gradients.

For a linear layer z = W a + b applied to example i, the gradient of that example's loss is
∇_W ℓ_i = g_i a_iᵀ and ∇_b ℓ_i = g_i, where g_i = ∂ℓ_i/∂z_i is the layer's output gradient
(a row of ∂(Σ_j ℓ_j)/∂z, as examples do not interact). So its norm needs no per-sample
gradient (Goodfellow 2015; the "ghost norm" of Li et al. 2022), and neither does the clipped
sum. One step of DP-SGD (Abadi et al. 2016) with the arithmetic of Opacus' ``DPOptimizer``:

    ‖∇ℓ_i‖² = Σ_l ‖g_{l,i}‖² · (‖a_{l,i}‖² + [l has a trainable bias])                  (1)
    c_i     = min(1, C / (‖∇ℓ_i‖ + 10⁻⁶))                                               (2)
    ∇W_l    = ((c ⊙ g_l)ᵀ a_l + N(0, σ²C² I)) / B,   ∇b_l = (Σ_i c_i g_{l,i} + N(0, σ²C² I)) / B   (3)

with B = ⌊n·q⌋ the expected batch size (Opacus' ``loss_reduction = "mean"``); the optimizer
then steps on these gradients. One forward pass, one backward pass down to the layer outputs
and two matrix products per layer: the same mechanism as Opacus' modes (the tests compare
(3) without noise against Opacus' per-sample hooks), at a fraction of its fixed per-step cost
for small models. A model with any other trainable parameter (a convolution, a norm layer) is
refused: use ``ghost`` or ``hooks`` there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from privacy.randomness import NoiseSource

__all__ = ["LinearDPSGD", "supports_linear_dpsgd"]

#: Opacus' guard against division by zero in the clip factor (2).
_NORM_EPS = 1e-6


def _trainable_layers(model: nn.Module) -> list[nn.Linear]:
    """The ``nn.Linear`` layers holding a trainable parameter; ValueError if another module does."""
    layers: list[nn.Linear] = []
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if not isinstance(module, nn.Linear):
            raise ValueError(
                f"grad-sample-mode 'linear' needs every trainable parameter in an nn.Linear layer; "
                f"{name or type(model).__name__!r} is a {type(module).__name__}: use 'ghost' or 'hooks'")
        layers.append(module)
    if not layers:
        raise ValueError("grad-sample-mode 'linear': the model has no trainable parameter")
    return layers


def supports_linear_dpsgd(model: nn.Module) -> bool:
    """Whether every trainable parameter of ``model`` sits in an ``nn.Linear`` layer."""
    try:
        _trainable_layers(model)
    except ValueError:
        return False
    return True


class LinearDPSGD:
    """Sets ``p.grad`` of every trainable parameter to one DP-SGD step's noisy clipped mean (3).

    ``noise`` is the client's private source (:mod:`privacy.randomness`); ``expected_batch_size``
    is B = ⌊n·q⌋. Use :meth:`batch_gradients` for a non-empty batch and :meth:`empty_gradients`
    for an empty Poisson batch (noise only), then the optimizer's ``step()``.
    """

    def __init__(self, model: nn.Module, *, clip: float, noise_multiplier: float,
                 expected_batch_size: int, noise: NoiseSource) -> None:
        if not clip > 0:
            raise ValueError(f"clip must be > 0; found {clip}")
        if expected_batch_size < 1:
            raise ValueError(f"expected batch size must be >= 1; found {expected_batch_size}")
        self.model = model
        self.layers = _trainable_layers(model)
        self.clip = float(clip)
        self.std = float(noise_multiplier) * float(clip)
        self.expected_batch_size = int(expected_batch_size)
        self.noise = noise

    @contextmanager
    def _recording(self) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Record each trainable layer's (input, output) during a forward pass."""
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []

        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if inputs[0].dim() != 2:
                raise ValueError("grad-sample-mode 'linear' needs (batch, features) inputs to every Linear layer; "
                                 f"found shape {tuple(inputs[0].shape)}: use 'ghost' or 'hooks'")
            seen.append((inputs[0].detach(), output))

        handles = [layer.register_forward_hook(hook) for layer in self.layers]
        try:
            yield seen
        finally:
            for handle in handles:
                handle.remove()

    def _noisy(self, summed: torch.Tensor) -> torch.Tensor:
        """(summed + N(0, σ²C²)) / B, the draw from the private source."""
        if self.std > 0:
            draw = self.noise.normal(tuple(summed.shape), self.std)
            summed = summed + torch.from_numpy(np.asarray(draw)).to(summed.dtype)
        return summed / self.expected_batch_size

    def batch_gradients(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Forward and backward on one batch, then (1)-(3) into ``p.grad``; the mean loss."""
        with self._recording() as seen:
            logits = self.model(x)
        if len(seen) != len(self.layers):  # a layer called twice, or not at all: (1) would be wrong
            raise ValueError(f"grad-sample-mode 'linear' needs each Linear layer applied once per forward; "
                             f"saw {len(seen)} calls for {len(self.layers)} layers")
        per_example = nn.functional.cross_entropy(logits, y, reduction="none")
        outputs = [out for _, out in seen]
        grads = torch.autograd.grad(per_example.sum(), outputs)
        with torch.no_grad():
            squared = torch.zeros(len(x), dtype=logits.dtype)
            for layer, (a, _), g in zip(self.layers, seen, grads):
                g_sq = g.pow(2).sum(dim=1)
                if layer.weight.requires_grad:
                    squared += g_sq * a.pow(2).sum(dim=1)
                if layer.bias is not None and layer.bias.requires_grad:
                    squared += g_sq
            factor = (self.clip / (squared.sqrt() + _NORM_EPS)).clamp(max=1.0)  # (2)
            for layer, (a, _), g in zip(self.layers, seen, grads):
                scaled = g * factor[:, None]
                if layer.weight.requires_grad:
                    layer.weight.grad = self._noisy(scaled.T @ a)  # (3)
                if layer.bias is not None and layer.bias.requires_grad:
                    layer.bias.grad = self._noisy(scaled.sum(dim=0))
        return float(per_example.mean().item())

    def empty_gradients(self) -> None:
        """An empty Poisson batch: nothing to clip, the gradient is noise only (3)."""
        with torch.no_grad():
            for layer in self.layers:
                for p in (layer.weight, layer.bias):
                    if p is not None and p.requires_grad:
                        p.grad = self._noisy(torch.zeros_like(p))
