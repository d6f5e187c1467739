"""Book-keeping clipping (``client/bk_dpsgd.py``) against per-sample clipping, for every model.

Three computations of the same clipped sum: Opacus' ``hooks`` mode (materialises every
per-sample gradient with its own hooks, clips, sums, divides by the expected batch size), a loop
over examples with one ``torch.autograd.grad`` each (the definition), and book-keeping (one
backward pass to the layer outputs, per-layer norms, no second backward). Without noise they
must agree; with noise, a seeded source must give ``bk`` the same noise and the same Poisson
batches as Opacus' modes gave, so switching ``auto`` to ``bk`` changed no client's randomness.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import client.bk_dpsgd as bk
from client.bk_dpsgd import BookKeepingDPSGD, supports_bk_dpsgd
from client.training import LocalTrainingConfig, train_dpsgd
from privacy.randomness import OSEntropyNoise, SeededNoise
from tasks.array_dataset import ArrayDataset
from tasks.model_names import BK_MODELS, MODELS
from tasks.models import build_model, get_weights
from tests.opacus_reference import opacus_clipped_gradient

BATCH = 6


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, *shape, generator=g, dtype=torch.float64).to(dtype)
    x[0] *= 1e-3  # examples of very different gradient norms
    x[1] *= 30.0
    return x, torch.randint(0, 10, (BATCH,), generator=g)


def _per_sample_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float,
                          expected: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The definition: one gradient per example, clipped with Opacus' factor, summed, / B; and the norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    norms = []
    for i in range(len(x)):
        torch.manual_seed(100 + i)  # dropout (mlp2): any mask, the same for nothing else
        loss = nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        norms.append(norm)
        factor = (clip / (norm + 1e-6)).clamp(max=1.0)
        total = [t + factor * g for t, g in zip(total, grads, strict=True)]
    return [t / expected for t in total], torch.stack(norms)


def _bk(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, expected: int) -> list[torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    stepper = BookKeepingDPSGD(model, clip=clip, noise_multiplier=0.0, expected_batch_size=expected,
                               noise=OSEntropyNoise())
    model.train()
    torch.manual_seed(11)  # the same dropout mask as Opacus' forward pass
    assert np.isfinite(stepper.batch_gradients(x, y))
    return [p.grad for p in model.parameters() if p.requires_grad]


def _assert_equal_to_1e6(ours: list[torch.Tensor], theirs: list[torch.Tensor], dtype: torch.dtype) -> None:
    """float64: every coordinate within 1e-6 of the gradient's largest; float32: its rounding."""
    assert len(ours) == len(theirs) and all(g is not None for g in ours)
    scale = max(float(t.abs().max()) for t in theirs)
    worst = max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True))
    assert scale > 0
    assert worst <= (1e-6 if dtype == torch.float64 else 1e-4) * scale, (worst, scale)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", MODELS)
def test_the_clipped_sum_equals_opacus_per_sample_clipping(name, dtype):
    """Every model, a batch with clipped and unclipped examples: bk == Opacus hooks (σ = 0)."""
    model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=1).to(dtype)
    model.eval()  # for the clip level below, a gradient that depends on the example alone (no dropout)
    x, y = _inputs((1, 28, 28), dtype)
    _, norms = _per_sample_reference(model, x, y, 1.0, BATCH)
    clip = float(norms.median())  # about half the examples are clipped
    assert (norms > clip).any() and (norms < clip).any()
    model.train()
    theirs = opacus_clipped_gradient(model, x, y, clip, BATCH - 1)
    ours = _bk(model, x, y, clip, BATCH - 1)
    _assert_equal_to_1e6(ours, theirs, dtype)


@pytest.mark.parametrize("name", ["cnn", "cnn2"])
@pytest.mark.parametrize("clip", [1e-4, 1e4])
def test_all_clipped_and_none_clipped_equal_the_definition(name, clip):
    """Against the per-example loop: every example clipped (c_i < 1), then none (c_i = 1)."""
    model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=2).double().eval()
    x, y = _inputs((1, 28, 28), torch.float64, seed=3)
    reference, norms = _per_sample_reference(model, x, y, clip, BATCH)
    assert bool((norms > clip).all()) if clip < 1 else bool((norms < clip).all())
    _assert_equal_to_1e6(_bk(model, x, y, clip, BATCH), reference, torch.float64)


class _Convs(nn.Module):
    """Convolutions the project's models do not use.

    'same' padding with an even kernel (torch pads the extra pixel right/bottom), dilation, a
    non-square stride, no bias; a frozen bias; a layer frozen whole.
    """

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 5, kernel_size=(4, 2), padding="same", dilation=(1, 2), bias=False)
        self.b = nn.Conv2d(5, 6, kernel_size=3, stride=(2, 1), padding=1)
        self.b.bias.requires_grad_(False)
        self.frozen = nn.Conv2d(6, 6, kernel_size=1)
        self.frozen.requires_grad_(False)
        self.c = nn.Conv2d(6, 4, kernel_size=3, padding="valid")
        self.head = nn.Linear(4 * 3 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.frozen(torch.tanh(self.b(h))))
        return self.head(torch.tanh(self.c(h)).flatten(1))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths:UserWarning")
@pytest.mark.parametrize("gram", [False, True])
def test_other_convolutions_and_both_norm_forms_equal_the_definition(gram, monkeypatch):
    """Instantiated per-sample gradients and the Gram form (forced by a zero memory cap) agree."""
    if gram:
        monkeypatch.setattr(bk, "INSTANTIATE_BYTES", 0)
    torch.manual_seed(4)
    model = _Convs().double()
    x, y = _inputs((3, 10, 10), torch.float64, seed=5)
    _, norms = _per_sample_reference(model, x, y, 1.0, BATCH)
    clip = float(norms.median())
    reference, _ = _per_sample_reference(model, x, y, clip, BATCH)
    ours = _bk(model, x, y, clip, BATCH)
    _assert_equal_to_1e6(ours, reference, torch.float64)
    assert model.b.bias.grad is None and model.frozen.weight.grad is None  # frozen: no gradient, no noise


def test_a_frozen_body_trains_the_head_alone():
    """CENTAUR's head phase: the convolutions frozen, the Linear layers clipped on their own norms."""
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=6).double().eval()
    for p in [*model.conv1.parameters(), *model.conv2.parameters()]:
        p.requires_grad_(False)
    x, y = _inputs((1, 28, 28), torch.float64, seed=7)
    reference, _ = _per_sample_reference(model, x, y, 0.05, BATCH)
    _assert_equal_to_1e6(_bk(model, x, y, 0.05, BATCH), reference, torch.float64)
    assert model.conv1.weight.grad is None


def test_every_model_is_made_of_the_layers_bk_covers_and_others_are_refused():
    """BK_MODELS agrees with the models' layers; a norm layer or a grouped convolution is refused by name."""
    for name in MODELS:
        model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
        assert supports_bk_dpsgd(model) == (name in BK_MODELS)
    with pytest.raises(ValueError, match=r"grad-sample-mode 'bk' needs every trainable parameter in an nn.Linear "
                                         r"or nn.Conv2d layer; '1' is a GroupNorm"):
        BookKeepingDPSGD(nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4)), clip=1.0, noise_multiplier=1.0,
                         expected_batch_size=4, noise=OSEntropyNoise())
    with pytest.raises(ValueError, match="groups = 2"):
        BookKeepingDPSGD(nn.Conv2d(2, 4, 3, groups=2), clip=1.0, noise_multiplier=1.0, expected_batch_size=4,
                         noise=OSEntropyNoise())


def test_a_layer_applied_twice_is_refused():
    """(1) sums over one application per example; a reused layer would under-count the norm."""
    conv = nn.Conv2d(2, 2, 3, padding=1)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = conv
            self.head = nn.Linear(2 * 4 * 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.conv(self.conv(x)).flatten(1))

    stepper = BookKeepingDPSGD(Twice(), clip=1.0, noise_multiplier=0.0, expected_batch_size=1, noise=OSEntropyNoise())
    with pytest.raises(ValueError, match="each trainable layer applied once per forward"):
        stepper.batch_gradients(torch.ones(2, 2, 4, 4), torch.zeros(2, dtype=torch.long))


def _data(n: int, seed: int = 0) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    return ArrayDataset(rng.standard_normal((n, 1, 28, 28)).astype(np.float32),
                        rng.integers(0, 10, n).astype(np.int64), 10, "synthetic")


def _train(name: str, mode: str, noise_seed: int, sigma: float = 1.0) -> list[np.ndarray]:
    model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
    cfg = LocalTrainingConfig(epochs=1, batch_size=8, learning_rate=0.5, momentum=0.9, seed=1, steps=6)
    _, steps = train_dpsgd(model, _data(48), cfg, clip=0.5, noise_multiplier=sigma, noise=SeededNoise(noise_seed),
                           grad_sample_mode=mode)
    assert steps == [(sigma, 1 / 6, 6)]
    return get_weights(model)


@pytest.mark.parametrize(("name", "before"), [("cnn", "hooks"), ("cnn", "ghost"), ("logreg", "hooks")])
def test_a_seeded_source_gives_the_same_noise_and_batches_as_opacus(name, before):
    """Six noisy steps (σ = 1, momentum) from one seeded source: ``bk`` ends where Opacus' mode did.

    So it drew the same Poisson batches and the same noise in the same order; another seed ends far
    away (the noise dominates), so the agreement is not the clipped sums alone.
    """
    ours = _train(name, "bk", noise_seed=5)
    theirs = _train(name, before, noise_seed=5)
    other = _train(name, "bk", noise_seed=6)
    close = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True))
    apart = max(float(np.abs(a - b).max()) for a, b in zip(ours, other, strict=True))
    assert close < 1e-5 < 1e-2 < apart, (close, apart)


def test_an_example_whose_gradient_overflows_contributes_zero_not_nan():
    """A record on which the model overflows (an input of inf here; a crafted model in an attack) must not
    turn the step into NaN, which would release a data-dependent bit: its clipped gradient is 0, so the
    step equals the same batch without it (two computations, the same expected batch size)."""
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=1).to(torch.float64)
    model.eval()
    x, y = _inputs((1, 28, 28), torch.float64)
    x[2, 0, 5, 5] = float("inf")
    for p in model.parameters():
        p.grad = None
    stepper = BookKeepingDPSGD(model, clip=1.0, noise_multiplier=0.0, expected_batch_size=BATCH,
                               noise=OSEntropyNoise())
    stepper.batch_gradients(x, y)  # the mean loss is NaN: a training metric, not released unless opted in
    ours = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    keep = torch.arange(BATCH) != 2
    without = _bk(model, x[keep], y[keep], clip=1.0, expected=BATCH)
    assert all(torch.isfinite(g).all() for g in ours)
    _assert_equal_to_1e6(ours, without, torch.float64)


def test_opacus_hooks_give_a_diverged_record_the_zero_gradient_as_book_keeping_does():
    """Six noisy steps on a shard holding a record with an inf feature: Opacus' ``hooks`` (wrapped by
    privet) ends where ``bk`` does, finite, from the same seeded source (the inf record adds nothing in
    either; bk's own rule is checked against the batch without it above)."""

    def train(mode: str) -> list[np.ndarray]:
        data = _data(48)
        data.x[7, 0, 3, 3] = np.inf
        model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=0)
        cfg = LocalTrainingConfig(epochs=1, batch_size=8, learning_rate=0.5, momentum=0.9, seed=1, steps=6)
        train_dpsgd(model, data, cfg, clip=0.5, noise_multiplier=1.0, noise=SeededNoise(5), grad_sample_mode=mode)
        return get_weights(model)

    hooks, ours = train("hooks"), train("bk")
    assert all(np.isfinite(w).all() for w in hooks)
    assert max(float(np.abs(a - b).max()) for a, b in zip(hooks, ours, strict=True)) < 1e-5
