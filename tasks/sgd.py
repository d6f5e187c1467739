"""Stochastic gradient descent with heavy-ball momentum, without ``torch.optim``.

For every parameter θ that has a gradient g after ``backward``::

    v ← g               (its first step)
    v ← μ·v + g          (later steps)
    θ ← θ − η·v          (θ ← θ − η·g when μ = 0)

which is ``torch.optim.SGD(params, lr=η, momentum=μ)`` (dampening 0, no Nesterov, no weight decay)
to the bit: the same tensor operations in the same order (tests/tasks/test_sgd.py). A parameter
without a gradient is skipped and keeps its momentum, as there.

Why not ``torch.optim``: its first ``step`` imports ``torch._dynamo`` (0.5-1.3 s on this machine),
which a client that takes a few steps per round should not pay (#38). Opacus' DP optimizers wrap a
``torch.optim.Optimizer`` and keep using one (``client.training``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

import torch
from torch.utils.hooks import RemovableHandle

__all__ = ["SGD", "register_step_pre_hook"]

#: Called with the optimizer before every :meth:`SGD.step` (what ``privet audit`` observes), as
#: ``torch.optim.optimizer.register_optimizer_step_pre_hook`` does for torch's optimizers.
_STEP_PRE_HOOKS: OrderedDict[int, Callable[[SGD], None]] = OrderedDict()  # RemovableHandle holds a weakref


def register_step_pre_hook(hook: Callable[[SGD], None]) -> RemovableHandle:
    """Call ``hook(optimizer)`` before every step of every :class:`SGD`; ``.remove()`` the handle to stop."""
    handle = RemovableHandle(_STEP_PRE_HOOKS)
    _STEP_PRE_HOOKS[handle.id] = hook
    return handle


class SGD:
    """θ ← θ − η·v with v ← μ·v + g: ``torch.optim.SGD``'s update (module docstring).

    Parameters
    ----------
    params : iterable of torch.Tensor
        The tensors to update (leaf tensors that receive ``.grad``).
    lr : float
        Step size η > 0.
    momentum : float
        μ in [0, 1); 0 is plain SGD.
    """

    def __init__(self, params: Iterable[torch.Tensor], *, lr: float, momentum: float = 0.0) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0; found {lr!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); found {momentum!r}")
        self.params = list(params)
        self.lr = float(lr)
        self.momentum = float(momentum)
        self._velocity: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        for hook in tuple(_STEP_PRE_HOOKS.values()):
            hook(self)
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            if self.momentum != 0.0:
                velocity = self._velocity[i]
                if velocity is None:
                    velocity = self._velocity[i] = grad.detach().clone()
                else:
                    velocity.mul_(self.momentum).add_(grad)
                grad = velocity
            param.add_(grad, alpha=-self.lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient before the next ``backward``."""
        for param in self.params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_()
                param.grad.zero_()
