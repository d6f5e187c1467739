"""``tasks.sgd.SGD`` is ``torch.optim.SGD``'s update to the bit, and never imports ``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from tasks.sgd import SGD, register_step_pre_hook


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("lr", [0.3, 1e-3])
def test_updates_equal_torch_optim_sgd_bit_for_bit(momentum, lr):
    ours, theirs = _model(0), _model(0)
    mine, reference = SGD(ours.parameters(), lr=lr, momentum=momentum), torch.optim.SGD(
        theirs.parameters(), lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(1)
    for step in range(6):
        x, y = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)
        for model, optimizer in ((ours, mine), (theirs, reference)):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            if step == 3:  # a parameter without a gradient is skipped and keeps its momentum
                model[0].bias.grad = None
            optimizer.step()
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}: max difference {float((a - b).abs().max())}"
    assert any(not torch.equal(a, b) for a, b in zip(ours.parameters(), _model(0).parameters(), strict=True))


def test_zero_grad_keeps_or_drops_the_gradient_as_asked():
    model = _model(2)
    optimizer = SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 6)).sum().backward()
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("lr", "momentum"), [(0.0, 0.0), (-1.0, 0.0), (0.1, 1.0), (0.1, -0.1)])
def test_rejects_a_step_size_or_momentum_out_of_range(lr, momentum):
    with pytest.raises(ValueError, match="lr|momentum"):
        SGD(_model(0).parameters(), lr=lr, momentum=momentum)


def test_a_training_step_does_not_import_torch_dynamo():
    probe = ("import sys, torch\nfrom tasks.sgd import SGD\nm = torch.nn.Linear(3, 2)\n"
             "o = SGD(m.parameters(), lr=0.1, momentum=0.9)\nm(torch.ones(2, 3)).sum().backward()\no.step()\n"
             "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"


def test_a_step_pre_hook_sees_every_step_before_the_update_until_removed():
    model = _model(3)
    optimizer = SGD(model.parameters(), lr=0.5)
    seen: list[torch.Tensor] = []
    handle = register_step_pre_hook(lambda opt: seen.append(opt.params[0].detach().clone()))
    before = model[0].weight.detach().clone()
    for _ in range(2):
        model(torch.ones(2, 6)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    handle.remove()
    model(torch.ones(2, 6)).sum().backward()
    optimizer.step()
    assert len(seen) == 2 and torch.equal(seen[0], before) and not torch.equal(seen[1], before)
