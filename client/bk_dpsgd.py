r"""Book-keeping DP-SGD: per-sample clipping of Linear and Conv2d models in one backward pass.

Bu, Wang, Zha and Karypis, "Differentially Private Optimization on Large Model at Small Cost"
(ICML 2023), "book-keeping" (BK): record every trainable layer's input a_l during the forward
pass, backpropagate once to the layer outputs to get g_l = ∂(Σ_j ℓ_j)/∂z_l, and compute both the
per-sample gradient norms and the clipped sum from (a_l, g_l); no per-sample gradient of the
whole model and no second backward pass (Opacus' ghost clipping takes two).

For a layer applied to example i at T positions (T = 1 for a Linear layer on (batch, features)
inputs; T = H'·W' output pixels for a Conv2d, a_{l,i} its unfolded input patches, d = C_in·k_h·k_w),
z_{l,i,t} = W a_{l,i,t} + b, so the gradient of example i's loss ℓ_i is (examples do not interact)

    ∇_W ℓ_i = Σ_t g_{l,i,t} a_{l,i,t}ᵀ = G_{l,i}  (p × d),     ∇_b ℓ_i = Σ_t g_{l,i,t}          (1)

and one step of DP-SGD (Abadi et al. 2016) with the arithmetic of Opacus' ``DPOptimizer``:

    ‖∇ℓ_i‖² = Σ_l ‖G_{l,i}‖²_F + ‖Σ_t g_{l,i,t}‖²      (trainable parameters only)        (2)
    c_i     = min(1, C / (‖∇ℓ_i‖ + 10⁻⁶))                                                 (3)
    ∇W_l    = (Σ_i c_i G_{l,i} + N(0, σ²C² I)) / B,   ∇b_l = (Σ_i c_i Σ_t g_{l,i,t} + N(0, σ²C² I)) / B   (4)

with B = ⌊n·q⌋ the expected batch size (Opacus' ``loss_reduction = "mean"``). ‖G_{l,i}‖_F is
computed per layer the cheaper of two exact ways (the paper's "mixed" choice, here by memory):

``ghost``  (Linear, T = 1)
    ‖g aᵀ‖²_F = ‖g‖²·‖a‖² (Goodfellow 2015; Li et al. 2022): O(B(p + d)); the clipped sum (4) is
    one matrix product (c ⊙ g)ᵀ a, the cost of the layer's ordinary weight gradient.
``instantiate``  (Conv2d)
    G_{l,i} by one batched product of (p × T)(T × d) per example, then ‖G_{l,i}‖_F and
    Σ_i c_i G_{l,i} as one (B)·(B × pd) product; O(B·T·p·d) time, the ordinary weight
    gradient's, and B·p·d floats (13 MB for cnn2's second convolution at B = 64). The Gram
    form ‖G‖² = ⟨a aᵀ, g gᵀ⟩ (Li et al. 2022) costs O(B·T²(p + d)) and is never cheaper in time
    for the project's models (cnn's first convolution: T = 196, 2T² = 76,832 > pd = 1,024), so
    it is used only where B·p·d floats would exceed :data:`INSTANTIATE_BYTES`.

**An example whose gradient is not finite** (its norm NaN or inf: the model overflowed on it)
contributes the zero gradient, c_i = 0 (3'): its clipped gradient must stay a point of the C-ball
whatever the data, or the step's sum, and the model the client releases, would be NaN exactly when
some record makes the model overflow, a data-dependent event that no charge covers (a deviating
server can craft weights that overflow on chosen records). Opacus' ``hooks`` mode gets the same
rule in :func:`client.training.train_dpsgd`; its ``ghost`` mode does not.

Same mechanism as Opacus' modes: the tests compare (4) without noise against Opacus' per-sample
hooks for every model in :data:`tasks.models.MODELS`, and the noise is drawn from the client's
private source in Opacus' order (one draw per trainable parameter, in ``model.parameters()``
order), so a seeded source gives the same noise and the same Poisson batches as ``hooks``.
A model with any other trainable module (a norm layer, an embedding) is refused: use ``ghost``
or ``hooks`` there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from privacy.randomness import NoiseSource
from tasks.model_names import BK_MODE

__all__ = ["BK_MODE", "INSTANTIATE_BYTES", "BookKeepingDPSGD", "bk_layers", "supports_bk_dpsgd"]

#: Opacus' guard against division by zero in the clip factor (3).
_NORM_EPS: Final = 1e-6

#: Above this many bytes of per-sample gradients (B·p·d) a convolution's norms take the Gram form.
INSTANTIATE_BYTES: Final = 256 * 2**20

_SUPPORTED: Final = (nn.Linear, nn.Conv2d)


def bk_layers(model: nn.Module, mode: str = BK_MODE) -> list[nn.Module]:
    """The Linear and Conv2d layers holding a trainable parameter, in module order.

    Raises
    ------
    ValueError
        If another module holds a trainable parameter, a convolution is one book-keeping does
        not cover (groups, a padding mode other than zeros), or nothing is trainable.
    """
    layers: list[nn.Module] = []
    for name, module in model.named_modules():
        if not any(p.requires_grad for p in module.parameters(recurse=False)):
            continue
        label = name or type(model).__name__
        if not isinstance(module, _SUPPORTED):
            raise ValueError(f"grad-sample-mode {mode!r} needs every trainable parameter in an nn.Linear or "
                             f"nn.Conv2d layer; {label!r} is a {type(module).__name__}: use 'ghost' or 'hooks'")
        if isinstance(module, nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"):
            raise ValueError(f"grad-sample-mode {mode!r} covers convolutions with groups = 1 and zero padding; "
                             f"{label!r} has groups = {module.groups}, padding_mode = {module.padding_mode!r}: "
                             "use 'ghost' or 'hooks'")
        layers.append(module)
    if not layers:
        raise ValueError(f"grad-sample-mode {mode!r}: the model has no trainable parameter")
    return layers


def supports_bk_dpsgd(model: nn.Module) -> bool:
    """Whether every trainable parameter of ``model`` sits in a layer :func:`bk_layers` accepts."""
    try:
        bk_layers(model)
    except ValueError:
        return False
    return True


def _patches(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The input patches a convolution multiplies, (B, T, k_h·k_w·C_in), T = output pixels.

    ``F.unfold``'s patches, transposed, with each patch's entries in (k_h, k_w, C_in) order (the
    weight's (C_in, k_h, k_w) permuted: :func:`_as_weight` maps a gradient back). Gathered by one
    strided copy of the (padded) input in channels-last layout viewed as (B, H', W', k_h, k_w, C_in),
    whose innermost k_w·C_in entries are contiguous: a quarter of the time of the (C_in, k_h, k_w)
    order and of ``F.unfold`` for a convolution with 16 or more input channels.
    """
    padding = layer.padding
    if isinstance(padding, str):  # "valid" is no padding; "same" pads as torch does, the extra pixel right/bottom
        pads: list[int] = []
        if padding == "same":
            for k, dil in zip(reversed(layer.kernel_size), reversed(layer.dilation), strict=True):
                total = dil * (k - 1)
                pads += [total // 2, total - total // 2]
    else:
        pads = [padding[1], padding[1], padding[0], padding[0]]
    if any(pads):
        x = F.pad(x, pads)
    batch, channels, height, width = x.shape
    x = x.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C_in)
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.stride, layer.dilation
    out_h, out_w = (height - dh * (kh - 1) - 1) // sh + 1, (width - dw * (kw - 1) - 1) // sw + 1
    sb, sy, sx, sc = x.stride()
    view = x.as_strided((batch, out_h, out_w, kh, kw, channels), (sb, sy * sh, sx * sw, sy * dh, sx * dw, sc))
    return view.reshape(batch, out_h * out_w, kh * kw * channels)


def _as_weight(layer: nn.Conv2d, grad: torch.Tensor) -> torch.Tensor:
    """A weight gradient in :func:`_patches`' (C_out, k_h, k_w, C_in) order, in the weight's layout."""
    out_channels, in_channels, kh, kw = layer.weight.shape
    return grad.reshape(out_channels, kh, kw, in_channels).permute(0, 3, 1, 2).contiguous()


#: Given the clip factors c (3), a layer's clipped sums (4) by parameter.
_Finish = Callable[[torch.Tensor], dict[torch.Tensor, torch.Tensor]]


def _zero_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t`` with the examples (first dimension) marked in ``rows`` set to zero."""
    return torch.where(rows.view(-1, *([1] * (t.dim() - 1))), torch.zeros((), dtype=t.dtype, device=t.device), t)


def _trainable(p: torch.Tensor | None) -> bool:
    return p is not None and p.requires_grad


def _linear_norms(layer: nn.Linear, a: torch.Tensor, g: torch.Tensor) -> tuple[_Finish, torch.Tensor]:
    """Ghost norms, T = 1: ‖g aᵀ‖² = ‖g‖²‖a‖²; the clipped sum is (c ⊙ g)ᵀ a."""
    weight, bias = layer.weight, layer.bias
    g_sq = g.pow(2).sum(dim=1)
    squared = g_sq * a.pow(2).sum(dim=1) if weight.requires_grad else torch.zeros_like(g_sq)
    if _trainable(bias):
        squared = squared + g_sq

    def finish(c: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        scaled = g * c[:, None]
        out = {}
        if weight.requires_grad:
            out[weight] = scaled.T @ a
        if bias is not None and bias.requires_grad:
            out[bias] = scaled.sum(dim=0)
        return out

    return finish, squared


def _conv_norms(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> tuple[_Finish, torch.Tensor]:
    """Instantiated per-example gradients G_i (or the Gram form above the memory cap); Σ_i c_i G_i."""
    weight, bias = layer.weight, layer.bias
    batch = len(a)
    g3 = g.reshape(batch, g.shape[1], -1)  # (B, p, T)
    g_bias = g3.sum(dim=2)  # (B, p): ∇_b ℓ_i (1)
    squared = g_bias.pow(2).sum(dim=1) if _trainable(bias) else torch.zeros(batch, dtype=g.dtype, device=g.device)
    patches = _patches(layer, a) if weight.requires_grad else None  # (B, T, d)
    per_sample = None
    if patches is not None:
        if batch * g3.shape[1] * patches.shape[2] * g.element_size() <= INSTANTIATE_BYTES:
            per_sample = torch.bmm(g3, patches).reshape(batch, -1)  # (B, p·d): G_i
            squared = squared + torch.linalg.vector_norm(per_sample, dim=1).square()
        else:  # Gram form: ‖G_i‖² = ⟨a_iᵀ a_i, g_iᵀ g_i⟩ over positions
            gram_a = torch.bmm(patches, patches.transpose(1, 2))
            gram_g = torch.bmm(g3.transpose(1, 2), g3)
            squared = squared + (gram_a * gram_g).sum(dim=(1, 2)).clamp(min=0)

    def finish(c: torch.Tensor) -> dict[torch.Tensor, torch.Tensor]:
        out = {}
        if per_sample is not None:
            out[weight] = _as_weight(layer, c @ per_sample)
        elif patches is not None:  # Σ_i c_i G_i = Σ_{i,t} c_i g_{i,t} a_{i,t}ᵀ
            out[weight] = _as_weight(layer, torch.einsum("bpt,btd->pd", g3 * c[:, None, None], patches))
        if bias is not None and bias.requires_grad:
            out[bias] = c @ g_bias
        return out

    return finish, squared


class BookKeepingDPSGD:
    """Sets ``p.grad`` of every trainable parameter to one DP-SGD step's noisy clipped mean (4).

    ``noise`` is the client's private source (:mod:`privacy.randomness`); ``expected_batch_size``
    is B = ⌊n·q⌋. Use :meth:`batch_gradients` for a non-empty batch and :meth:`empty_gradients`
    for an empty Poisson batch (noise only), then the optimizer's ``step()``.
    """

    mode: str = BK_MODE
    layer_kind: str = "trainable"

    def __init__(self, model: nn.Module, *, clip: float, noise_multiplier: float,
                 expected_batch_size: int, noise: NoiseSource) -> None:
        if not clip > 0:
            raise ValueError(f"clip must be > 0; found {clip}")
        if expected_batch_size < 1:
            raise ValueError(f"expected batch size must be >= 1; found {expected_batch_size}")
        self.model = model
        self.layers = self._layers(model)
        self.params = [p for p in model.parameters() if p.requires_grad]  # Opacus' noise order
        self.clip = float(clip)
        self.std = float(noise_multiplier) * float(clip)
        self.expected_batch_size = int(expected_batch_size)
        self.noise = noise

    def _layers(self, model: nn.Module) -> list[nn.Module]:
        return bk_layers(model, self.mode)

    @contextmanager
    def _recording(self) -> Iterator[list[tuple[nn.Module, torch.Tensor, torch.Tensor]]]:
        """Record each trainable layer's (input, output) during a forward pass."""
        seen: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []

        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if isinstance(module, nn.Linear) and inputs[0].dim() != 2:
                raise ValueError(f"grad-sample-mode {self.mode!r} needs (batch, features) inputs to every Linear "
                                 f"layer; found shape {tuple(inputs[0].shape)}: use 'ghost' or 'hooks'")
            seen.append((module, inputs[0].detach(), output))

        handles = [layer.register_forward_hook(hook) for layer in self.layers]
        try:
            yield seen
        finally:
            for handle in handles:
                handle.remove()

    def batch_gradients(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Forward, one backward to the layer outputs, then (1)-(4) into ``p.grad``; the mean loss."""
        with self._recording() as seen:
            logits = self.model(x)
        if len(seen) != len(self.layers) or {id(m) for m, _, _ in seen} != {id(m) for m in self.layers}:
            # a layer called twice, or not at all: (1) would be wrong
            raise ValueError(f"grad-sample-mode {self.mode!r} needs each {self.layer_kind} layer applied once per "
                             f"forward; saw {len(seen)} calls for {len(self.layers)} layers")
        per_example = F.cross_entropy(logits, y, reduction="none")
        grads = torch.autograd.grad(per_example.sum(), [out for _, _, out in seen])
        with torch.no_grad():
            squared = torch.zeros(len(x), dtype=logits.dtype, device=logits.device)
            pending = []
            for (layer, a, _), g in zip(seen, grads, strict=True):
                finish, sq = self._layer_norms(layer, a, g)
                squared += sq
                pending.append(finish)
            factor = (self.clip / (squared.sqrt() + _NORM_EPS)).clamp(max=1.0)  # (3)
            diverged = ~torch.isfinite(squared)
            if bool(diverged.any()):  # (3'): such an example's clipped gradient is 0 (module docstring)
                factor = torch.where(diverged, torch.zeros_like(factor), factor)
                pending = [self._layer_norms(layer, _zero_rows(a, diverged), _zero_rows(g, diverged))[0]
                           for (layer, a, _), g in zip(seen, grads, strict=True)]
            summed: dict[torch.Tensor, torch.Tensor] = {}
            for finish in pending:
                summed.update(finish(factor))
            self._release(summed)
        return float(per_example.mean().item())

    def _layer_norms(self, layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> tuple[_Finish, torch.Tensor]:
        """Per-example squared gradient norm of ``layer`` (2), and how to form its clipped sum (4)."""
        if isinstance(layer, nn.Linear):
            return _linear_norms(layer, a, g)
        assert isinstance(layer, nn.Conv2d)  # bk_layers admits nothing else
        return _conv_norms(layer, a, g)

    def _noisy(self, summed: torch.Tensor) -> torch.Tensor:
        """(summed + N(0, σ²C²)) / B, the draw from the private source."""
        if self.std > 0:
            draw = self.noise.normal(tuple(summed.shape), self.std)
            summed = summed + torch.from_numpy(np.asarray(draw)).to(summed.dtype)
        return summed / self.expected_batch_size

    def _release(self, summed: dict[torch.Tensor, torch.Tensor]) -> None:
        """Noise and scale every trainable parameter's clipped sum into ``p.grad``, in Opacus' order."""
        for p in self.params:
            p.grad = self._noisy(summed[p]).view_as(p)

    def empty_gradients(self) -> None:
        """An empty Poisson batch: nothing to clip, the gradient is noise only (4)."""
        with torch.no_grad():
            self._release({p: torch.zeros_like(p) for p in self.params})
