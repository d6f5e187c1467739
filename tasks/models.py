"""The papers' models in plain PyTorch, plus weight exchange, evaluation and plain SGD.

Every model returns logits (train with cross-entropy), has no BatchNorm and no buffers,
so it passes ``opacus.validators.ModuleValidator.validate(model, strict=True)`` and works
with Opacus' ``hooks`` and ``ghost`` grad-sample modes; every trainable layer is ``nn.Linear``
or ``nn.Conv2d``, so privet's book-keeping clipping (``bk``) applies to all of them. Flatten
sizes are computed from ``input_shape``, so each model takes both ``1 x 28 x 28`` and
``3 x 32 x 32`` images.
Parameter counts below are for ``1 x 28 x 28`` inputs and 10 classes unless stated.

======  ====================================  =========  ==================================
name    architecture                          params     source
======  ====================================  =========  ==================================
mlp2    784-64-C MLP, no biases, dropout 0.5  50,816     FedCEO "MLP-2-Layers" (authors' code)
lenet5  conv32-conv64 (5x5), FC 512-512-C     1,141,194  FedCEO "LeNet-5" (CNNCifar), on
                                                         3x32x32; 844,682 on 1x28x28
logreg  784-C linear, zero init               7,850      PFA LogR (Table 5)
cnn     conv16 8x8/2, conv32 4x4/2, FC 32-C   26,010     PFA 2-layer CNN (Table 5), the
                                                         TF-Privacy tutorial net
cnn2    conv32-conv64 (5x5 same), FC 512-C    1,663,370  GDPFed "2-layer CNN" (no details
                                                         given): McMahan et al. 2017's CNN
======  ====================================  =========  ==================================
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tasks.array_dataset import ArrayDataset
from tasks.model_names import (
    MODELS,
)
from tasks.sgd import SGD

log = logging.getLogger(__name__)


TRAIN_LOSS_KEY: Final = "train-loss"
LOCAL_STEPS_KEY: Final = "local-steps"

InputShape = tuple[int, int, int]


# ------------------------------------------------------------------------ models


def _flat_size(features: Callable[[torch.Tensor], torch.Tensor], input_shape: InputShape) -> int:
    """Count the features ``features`` outputs for one image of ``input_shape``."""
    with torch.no_grad():
        try:
            out = features(torch.zeros(1, *input_shape))
        except RuntimeError as exc:
            raise ValueError(
                f"input_shape {input_shape} is too small for this model: {exc}"
            ) from exc
    return int(out[0].numel())


class MLP2(nn.Module):
    """FedCEO's "MLP-2-Layers": Linear(d, 64) -> Dropout(0.5) -> ReLU -> Linear(64, C).

    No biases, as in the authors' code (which returns log-softmax; this returns logits).
    """

    def __init__(self, input_shape: InputShape, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(math.prod(input_shape), hidden, bias=False)
        self.dropout = nn.Dropout(0.5)
        self.fc2 = nn.Linear(hidden, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images to logits."""
        logits: torch.Tensor = self.fc2(F.relu(self.dropout(self.fc1(x.flatten(1)))))
        return logits


class LeNet5(nn.Module):
    """FedCEO's "LeNet-5" (``CNNCifar`` in the authors' code, wider than LeCun's).

    Conv(5x5, 32) -> ReLU -> MaxPool 2 -> Conv(5x5, 64) -> ReLU -> MaxPool 2 ->
    FC 512 -> ReLU -> FC 512 -> ReLU -> FC C. On 3 x 32 x 32 the flatten size is 1600.
    """

    def __init__(self, input_shape: InputShape, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(input_shape[0], 32, kernel_size=5)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5)
        flat = _flat_size(self.features, input_shape)
        self.fc1 = nn.Linear(flat, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the convolutional part."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return F.max_pool2d(F.relu(self.conv2(x)), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images to logits."""
        x = self.features(x).flatten(1)
        logits: torch.Tensor = self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))
        return logits


class LogReg(nn.Module):
    """PFA's logistic regression: flatten -> Linear(d, C), zero-initialised as in its code.

    PFA's code applies softmax twice (softmax output fed to a softmax cross-entropy);
    this model returns logits for a single softmax in the loss.
    """

    def __init__(self, input_shape: InputShape, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(math.prod(input_shape), num_classes)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images to logits."""
        logits: torch.Tensor = self.fc(x.flatten(1))
        return logits


class SmallCNN(nn.Module):
    """PFA's MNIST/FMNIST "2-layer CNN", the TF-Privacy tutorial net (also Opacus' MNIST).

    Conv(8x8, 16, stride 2, pad 3 = TF "same") -> ReLU -> MaxPool(2, stride 1) ->
    Conv(4x4, 32, stride 2) -> ReLU -> MaxPool(2, stride 1) -> FC 32 -> ReLU -> FC C.
    """

    def __init__(self, input_shape: InputShape, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(input_shape[0], 16, kernel_size=8, stride=2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=4, stride=2)
        flat = _flat_size(self.features, input_shape)
        self.fc1 = nn.Linear(flat, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the convolutional part."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 1)
        return F.max_pool2d(F.relu(self.conv2(x)), 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images to logits."""
        logits: torch.Tensor = self.fc2(F.relu(self.fc1(self.features(x).flatten(1))))
        return logits


class CNN2(nn.Module):
    """A 2-conv-layer CNN for GDPFed's Fashion-MNIST runs.

    GDPFed names a "2-layer CNN" without details; this is the CNN of McMahan et al.
    (2017, FedAvg): Conv(5x5, 32, same) -> ReLU -> MaxPool 2 -> Conv(5x5, 64, same) ->
    ReLU -> MaxPool 2 -> FC 512 -> ReLU -> FC C.
    """

    def __init__(self, input_shape: InputShape, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(input_shape[0], 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        flat = _flat_size(self.features, input_shape)
        self.fc1 = nn.Linear(flat, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the convolutional part."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return F.max_pool2d(F.relu(self.conv2(x)), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images to logits."""
        logits: torch.Tensor = self.fc2(F.relu(self.fc1(self.features(x).flatten(1))))
        return logits


_REGISTRY: Final[dict[str, Callable[[InputShape, int], nn.Module]]] = {
    "mlp2": MLP2,
    "lenet5": LeNet5,
    "logreg": LogReg,
    "cnn": SmallCNN,
    "cnn2": CNN2,
}


@contextlib.contextmanager
def seeded_torch(seed: int | None, device: torch.device | None = None) -> Iterator[None]:
    """Seed torch's default generators inside the block only (restored afterwards)."""
    if seed is None:
        yield
        return
    devices: list[int] = []
    if device is not None and device.type == "cuda":
        devices = [torch.cuda.current_device() if device.index is None else device.index]
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        if devices:
            torch.manual_seed(seed)
        else:  # the CPU's generator only: torch.manual_seed also queues a lazy CUDA seeding, which formats
            torch.default_generator.manual_seed(seed)  # the call stack three times (0.3-0.5 ms a call, #38)
        yield


def build_model(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int | None = None,
) -> nn.Module:
    """Build one of :data:`MODELS`, in training mode, on the CPU.

    Parameters
    ----------
    name : str
        One of :data:`MODELS`.
    input_shape : sequence of 3 ints
        ``(C, H, W)`` of one image, e.g. ``(1, 28, 28)`` or ``(3, 32, 32)``.
    num_classes : int
        Number of outputs.
    seed : int or None
        Seeds the initialisation (equal seeds, equal weights) without touching the
        global torch generator; ``None`` draws from the global generator.

    Raises
    ------
    ValueError
        For an unknown name (the message lists :data:`MODELS`) or bad shapes.
    """
    if name not in _REGISTRY:
        raise ValueError(f"model must be one of {', '.join(MODELS)}; found {name!r}")
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(
            f"input_shape must be (C, H, W) with positive sizes; found {input_shape!r}"
        )
    if isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1; found {num_classes!r}")
    with seeded_torch(seed):
        model = _REGISTRY[name]((shape[0], shape[1], shape[2]), int(num_classes))
    log.debug(
        "built %s for %s, %d classes: %d parameters",
        name,
        shape,
        num_classes,
        count_parameters(model),
    )
    return model


# ------------------------------------------------------------------------ weights


def unwrap(model: nn.Module) -> nn.Module:
    """Return the plain model inside Opacus' ``GradSampleModule`` wrappers, else ``model``.

    Opacus' wrappers (``GradSampleModule`` and its ghost-clipping subclass) keep the
    wrapped model in ``_module`` and share its parameters.
    """
    inner = getattr(model, "_module", None)
    while isinstance(inner, nn.Module):
        model, inner = inner, getattr(inner, "_module", None)
    return model


def head_parameter_names(names: Sequence[str]) -> list[str]:
    """The parameters of the model's head: those of the module owning the last name.

    ``["conv1.weight", ..., "fc3.weight", "fc3.bias"]`` -> ``["fc3.weight", "fc3.bias"]``.
    ``state_dict`` order follows module registration order, so for the project's models
    (and any ``nn.Sequential``-like net) this is the output layer.

    Raises
    ------
    ValueError
        If ``names`` is empty.
    """
    if not names:
        raise ValueError("head_parameter_names: the model has no parameters")
    owner = names[-1].rpartition(".")[0]
    return [n for n in names if n.rpartition(".")[0] == owner]


def weight_names(model: nn.Module) -> list[str]:
    """Return the names of the tensors :func:`get_weights` returns, in the same order."""
    return list(unwrap(model).state_dict().keys())


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """Return copies of all ``state_dict`` tensors as numpy arrays, in ``state_dict`` order."""
    return [t.detach().cpu().numpy().copy() for t in unwrap(model).state_dict().values()]


def set_weights(model: nn.Module, arrays: Sequence[np.ndarray]) -> None:
    """Load arrays (in :func:`get_weights` order) into ``model``, in place.

    Raises
    ------
    ValueError
        If the number of arrays or a shape does not match (the tensor is named).
    """
    module = unwrap(model)
    current = module.state_dict()
    if len(arrays) != len(current):
        raise ValueError(
            f"set_weights: model has {len(current)} tensors ({', '.join(current)}); "
            f"got {len(arrays)} arrays"
        )
    new_state = {}
    for (key, tensor), array in zip(current.items(), arrays, strict=True):
        array = np.asarray(array)
        if tuple(array.shape) != tuple(tensor.shape):
            raise ValueError(
                f"set_weights: {key} has shape {tuple(tensor.shape)}; got {tuple(array.shape)}"
            )
        new_state[key] = torch.tensor(array, dtype=tensor.dtype, device=tensor.device)
    module.load_state_dict(new_state, strict=True)


def count_parameters(model: nn.Module) -> int:
    """Count the trainable scalars (the model dimension d)."""
    return sum(p.numel() for p in unwrap(model).parameters() if p.requires_grad)


# ------------------------------------------------------------------------ train / eval


def _device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _batch(
    data: ArrayDataset, rows: np.ndarray | slice, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    # torch.tensor copies: the cached dataset arrays are read-only and must stay intact.
    x = torch.tensor(data.x[rows], device=device)
    y = torch.tensor(data.y[rows], device=device)
    return x, y


def evaluate(
    model: nn.Module, data: ArrayDataset, *, batch_size: int = 1000
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``data``.

    Runs without gradients in eval mode, then restores the model's previous mode.

    Returns
    -------
    tuple of float
        ``(loss, accuracy)``.
    """
    if len(data) == 0:
        raise ValueError(f"evaluate: dataset {data.name!r} is empty")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; found {batch_size}")
    module = unwrap(model)
    device = _device(module)
    was_training = module.training
    module.eval()
    total_loss, correct = 0.0, 0
    try:
        with torch.no_grad():
            for start in range(0, len(data), batch_size):
                x, y = _batch(data, slice(start, start + batch_size), device)
                logits = module(x)
                total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(dim=1) == y).sum())
    finally:
        module.train(was_training)
    return total_loss / len(data), correct / len(data)


def train_plain(
    model: nn.Module,
    data: ArrayDataset,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    seed: int,
    steps: int = 0,
) -> dict[str, float]:
    """Non-private local training: SGD with momentum on cross-entropy, in place.

    Batches are drawn by shuffling with a ``torch.Generator`` seeded with ``seed``;
    dropout draws from torch's default generator, seeded with ``seed`` inside this call
    only. Equal seeds and equal starting weights give equal results (on the CPU).

    Parameters
    ----------
    model : nn.Module
        Trained in place (and left in training mode).
    data : ArrayDataset
        Local examples; the last batch of an epoch may be smaller.
    epochs, batch_size : int
        >= 1.
    lr : float
        Learning rate, > 0.
    momentum : float
        In [0, 1).
    seed : int
        Seed for shuffling and dropout.
    steps : int
        If > 0, exactly this many mini-batch steps (τ), walking through as many shuffled
        passes as that takes and stopping mid-pass; ``epochs`` is then ignored.

    Returns
    -------
    dict
        ``{"train-loss": mean loss over all examples seen, "local-steps": steps}``.
    """
    for key, value, low in (("epochs", epochs, 1), ("batch_size", batch_size, 1), ("steps", steps, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise ValueError(f"{key} must be an int >= {low}; found {value!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0; found {lr!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1); found {momentum!r}")
    if len(data) == 0:
        raise ValueError(f"train_plain: dataset {data.name!r} is empty")
    device = _device(model)
    optimizer = SGD(model.parameters(), lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    batches_per_pass = -(-len(data) // batch_size)
    total = int(steps) if steps > 0 else epochs * batches_per_pass
    total_loss, seen, taken = 0.0, 0, 0
    with seeded_torch(seed, device):
        while taken < total:
            order = torch.randperm(len(data), generator=generator).numpy()
            for start in range(0, len(data), batch_size):
                if taken == total:
                    break
                x, y = _batch(data, order[start : start + batch_size], device)
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                torch.autograd.backward(loss)
                optimizer.step()
                total_loss += float(loss.detach()) * len(y)
                seen += len(y)
                taken += 1
    return {TRAIN_LOSS_KEY: total_loss / seen, LOCAL_STEPS_KEY: taken}
