"""DP-SGD steps for models whose trainable layers are all ``nn.Linear``: book-keeping restricted to them.

For a linear layer z = W a + b applied to example i, the gradient of that example's loss is
∇_W ℓ_i = g_i a_iᵀ and ∇_b ℓ_i = g_i, where g_i = ∂ℓ_i/∂z_i is the layer's output gradient
(a row of ∂(Σ_j ℓ_j)/∂z, as examples do not interact). So its norm needs no per-sample
gradient (Goodfellow 2015; the "ghost norm" of Li et al. 2022), and neither does the clipped
sum. One step of DP-SGD (Abadi et al. 2016) with the arithmetic of Opacus' ``DPOptimizer``:

    ‖∇ℓ_i‖² = Σ_l ‖g_{l,i}‖² · (‖a_{l,i}‖² + [l has a trainable bias])                  (1)
    c_i     = min(1, C / (‖∇ℓ_i‖ + 10⁻⁶))                                               (2)
    ∇W_l    = ((c ⊙ g_l)ᵀ a_l + N(0, σ²C² I)) / B,   ∇b_l = (Σ_i c_i g_{l,i} + N(0, σ²C² I)) / B   (3)

with B = ⌊n·q⌋ the expected batch size (Opacus' ``loss_reduction = "mean"``). This is the T = 1
case of :mod:`client.bk_dpsgd` (book-keeping clipping, which also covers convolutions), and
:class:`LinearDPSGD` is that step with every trainable layer required to be ``nn.Linear``: the
``linear`` grad-sample-mode. A model with any other trainable parameter (a convolution, a norm
layer) is refused: use ``bk``, ``ghost`` or ``hooks`` there.
"""

from __future__ import annotations

from torch import nn

from client.bk_dpsgd import BookKeepingDPSGD
from tasks.model_names import LINEAR_MODE

__all__ = ["LinearDPSGD", "supports_linear_dpsgd"]


def _linear_layers(model: nn.Module) -> list[nn.Module]:
    """The ``nn.Linear`` layers holding a trainable parameter; ValueError if another module does."""
    layers: list[nn.Module] = []
    for name, module in model.named_modules():
        if not any(p.requires_grad for p in module.parameters(recurse=False)):
            continue
        if not isinstance(module, nn.Linear):
            raise ValueError(
                f"grad-sample-mode 'linear' needs every trainable parameter in an nn.Linear layer; "
                f"{name or type(model).__name__!r} is a {type(module).__name__}: use 'bk', 'ghost' or 'hooks'")
        layers.append(module)
    if not layers:
        raise ValueError("grad-sample-mode 'linear': the model has no trainable parameter")
    return layers


def supports_linear_dpsgd(model: nn.Module) -> bool:
    """Whether every trainable parameter of ``model`` sits in an ``nn.Linear`` layer."""
    try:
        _linear_layers(model)
    except ValueError:
        return False
    return True


class LinearDPSGD(BookKeepingDPSGD):
    """Sets ``p.grad`` of every trainable parameter to one DP-SGD step's noisy clipped mean (3).

    ``noise`` is the client's private source (:mod:`privacy.randomness`); ``expected_batch_size``
    is B = ⌊n·q⌋. Use :meth:`batch_gradients` for a non-empty batch and :meth:`empty_gradients`
    for an empty Poisson batch (noise only), then the optimizer's ``step()``.
    """

    mode = LINEAR_MODE
    layer_kind = "Linear"

    def _layers(self, model: nn.Module) -> list[nn.Module]:
        return _linear_layers(model)
