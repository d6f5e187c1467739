"""The closed-form DP-SGD step for Linear-only models against Opacus' per-sample gradients.

Two independent computations of the same mechanism: Opacus' ``hooks`` mode materialises every
per-sample gradient, clips it and averages; :class:`client.linear_dpsgd.LinearDPSGD` never forms
one (eq. (1)-(3) of its module). Without noise both must give the same gradient; with noise the
difference from the clipped mean must be N(0, σ²C²/B²) per coordinate.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from client.linear_dpsgd import LinearDPSGD
from privacy.randomness import OSEntropyNoise
from tasks.models import build_model
from tests.opacus_reference import opacus_clipped_gradient


def _batch(n: int, features: int, scale: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(n, features, generator=g)
    x[0] *= 0.001  # one example whose gradient stays inside the clip ball, the rest are clipped
    return x, torch.randint(0, 10, (n,), generator=g)


def _two_layer_with_a_frozen_bias() -> nn.Module:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(12, 7), nn.Tanh(), nn.Linear(7, 10))
    model[0].bias.requires_grad_(False)
    return model


def _models() -> dict[str, tuple[nn.Module, int]]:
    return {
        "logreg": (build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=1), 784),
        "mlp2": (build_model("mlp2", input_shape=(1, 28, 28), num_classes=10, seed=1), 784),
        "frozen-bias": (_two_layer_with_a_frozen_bias(), 12),
    }


@pytest.mark.parametrize("name", ["logreg", "mlp2", "frozen-bias"])
@pytest.mark.parametrize("scale", [0.01, 3.0])
def test_noiseless_step_equals_opacus_per_sample_clipping(name, scale):
    model, features = _models()[name]
    x, y = _batch(9, features, scale)
    clip, expected = 0.5, 8
    theirs = opacus_clipped_gradient(model, x, y, clip, expected)
    stepper = LinearDPSGD(model, clip=clip, noise_multiplier=0.0, expected_batch_size=expected,
                          noise=OSEntropyNoise())
    model.train()
    torch.manual_seed(11)
    loss = stepper.batch_gradients(x, y)
    ours = [p.grad for p in model.parameters() if p.requires_grad]
    assert len(ours) == len(theirs) and all(g is not None for g in ours)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert np.isfinite(loss)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert all(p.grad is None for p in frozen)


def test_each_example_moves_the_sum_by_at_most_the_clip_norm():
    """Sensitivity: the clipped sum of one example has norm ≤ C, = C when its gradient is larger."""
    model = build_model("mlp2", input_shape=(1, 28, 28), num_classes=10, seed=2)
    model.eval()  # no dropout: the gradient is a function of the example alone
    clip = 0.3
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(1, 784, generator=g), torch.tensor([3])
    for scale in (0.0001, 10.0):
        stepper = LinearDPSGD(model, clip=clip, noise_multiplier=0.0, expected_batch_size=1, noise=OSEntropyNoise())
        stepper.batch_gradients(scale * x, y)
        norm = float(torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters())))
        if scale > 1:
            assert norm == pytest.approx(clip, rel=1e-4)
        else:
            assert 0 < norm < clip


def test_noise_is_gaussian_with_std_sigma_c_over_the_expected_batch_size():
    model = build_model("logreg", input_shape=(1, 28, 28), num_classes=10, seed=0)
    x, y = _batch(6, 784, 1.0)
    sigma, clip, expected = 2.0, 0.7, 5
    quiet = LinearDPSGD(model, clip=clip, noise_multiplier=0.0, expected_batch_size=expected, noise=OSEntropyNoise())
    quiet.batch_gradients(x, y)
    clean = [p.grad.clone() for p in model.parameters()]
    noisy = LinearDPSGD(model, clip=clip, noise_multiplier=sigma, expected_batch_size=expected,
                        noise=OSEntropyNoise())
    noisy.batch_gradients(x, y)
    diff = torch.cat([(p.grad - c).flatten() for p, c in zip(model.parameters(), clean, strict=True)])
    want = sigma * clip / expected
    n = diff.numel()  # 7,850 draws: the sample std is within 5 standard errors of the truth
    assert abs(float(diff.std()) - want) < 5 * want / np.sqrt(2 * n)
    assert abs(float(diff.mean())) < 5 * want / np.sqrt(n)
    noisy.empty_gradients()  # an empty Poisson batch releases the noise alone
    alone = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert abs(float(alone.std()) - want) < 5 * want / np.sqrt(2 * n)


def test_models_with_other_trainable_layers_are_refused_unless_frozen():
    cnn = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=0)
    with pytest.raises(ValueError, match="grad-sample-mode 'linear' needs every trainable parameter in an nn.Linear"):
        LinearDPSGD(cnn, clip=1.0, noise_multiplier=1.0, expected_batch_size=4, noise=OSEntropyNoise())
    for p in [*cnn.conv1.parameters(), *cnn.conv2.parameters()]:  # a head trained alone (CENTAUR's phase 2)
        p.requires_grad_(False)
    head = LinearDPSGD(cnn, clip=1.0, noise_multiplier=0.0, expected_batch_size=2, noise=OSEntropyNoise())
    head.batch_gradients(torch.randn(2, 1, 28, 28), torch.tensor([1, 2]))
    assert cnn.conv1.weight.grad is None and cnn.fc1.weight.grad is not None


def test_a_layer_applied_twice_is_refused():
    """(1) assumes one input row per example and layer; a reused layer would under-count the norm."""
    layer = nn.Linear(4, 4)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(self.layer(x))

    stepper = LinearDPSGD(Twice(), clip=1.0, noise_multiplier=0.0, expected_batch_size=1, noise=OSEntropyNoise())
    with pytest.raises(ValueError, match="each Linear layer applied once per forward"):
        stepper.batch_gradients(torch.ones(2, 4), torch.zeros(2, dtype=torch.long))
