"""Tests for tasks.models: shapes, parameter counts, Opacus compatibility, training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.validators import ModuleValidator
from torch.utils.data import DataLoader, TensorDataset

from tasks.array_dataset import ArrayDataset
from tasks.dataset_files import DEFAULT_FASHION_MNIST_DIR, MNIST_FILES
from tasks.datasets import load_dataset
from tasks.models import (
    LOCAL_STEPS_KEY,
    MODELS,
    TRAIN_LOSS_KEY,
    build_model,
    count_parameters,
    evaluate,
    get_weights,
    set_weights,
    train_plain,
    unwrap,
    weight_names,
)

SHAPES = [(1, 28, 28), (3, 32, 32)]

needs_fmnist = pytest.mark.skipif(
    not all((Path(DEFAULT_FASHION_MNIST_DIR) / f"{f}.gz").is_file() for f in MNIST_FILES),
    reason="apt-get install dataset-fashion-mnist",
)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", MODELS)
def test_builds_forwards_and_validates(name: str, shape: tuple[int, int, int]) -> None:
    model = build_model(name, input_shape=shape, num_classes=7, seed=0)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7)
    assert ModuleValidator.validate(model, strict=True) == []
    assert list(model.buffers()) == []  # nothing but parameters to exchange
    assert len(get_weights(model)) == len(list(model.parameters()))


@pytest.mark.parametrize(
    ("name", "shape", "expected"),
    [
        ("logreg", (1, 28, 28), 7_850),  # PFA Table 5
        ("cnn", (1, 28, 28), 26_010),  # PFA Table 5
        ("mlp2", (1, 28, 28), 784 * 64 + 64 * 10),  # FedCEO code, no biases
        ("lenet5", (3, 32, 32), 1_141_194),  # FedCEO CNNCifar, "about 1.14M"
        ("cnn2", (1, 28, 28), 1_663_370),  # McMahan et al. 2017 CNN
    ],
)
def test_parameter_counts(name: str, shape: tuple[int, int, int], expected: int) -> None:
    assert count_parameters(build_model(name, input_shape=shape, num_classes=10)) == expected


def test_fedceo_lenet5_tensor_shapes() -> None:
    # docs/notes/fedceo.md §2.5: conv1 (75, 32), conv2 (800, 64), fc1 (1600, 512), fc2 (512, 512),
    # fc3 (512, 10)
    model = build_model("lenet5", input_shape=(3, 32, 32), num_classes=10)
    shapes = dict(zip(weight_names(model), (w.shape for w in get_weights(model)), strict=True))
    assert shapes["conv1.weight"] == (32, 3, 5, 5) and shapes["conv2.weight"] == (64, 32, 5, 5)
    assert shapes["fc1.weight"] == (512, 1600) and shapes["fc2.weight"] == (512, 512)
    assert shapes["fc3.weight"] == (10, 512)
    mlp = build_model("mlp2", input_shape=(1, 28, 28), num_classes=26)
    assert weight_names(mlp) == ["fc1.weight", "fc2.weight"]


def test_seeded_init_is_deterministic_and_isolated() -> None:
    state = torch.random.get_rng_state()
    a = get_weights(build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=5))
    b = get_weights(build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=5))
    c = get_weights(build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=6))
    assert torch.equal(torch.random.get_rng_state(), state)  # global generator untouched
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    zeros = get_weights(build_model("logreg", input_shape=(1, 28, 28), num_classes=10))
    assert all(not w.any() for w in zeros)  # PFA's zero init


def test_build_model_errors() -> None:
    with pytest.raises(ValueError, match="mlp2, lenet5, logreg, cnn, cnn2.*'resnet'"):
        build_model("resnet", input_shape=(1, 28, 28), num_classes=10)
    with pytest.raises(ValueError, match="input_shape"):
        build_model("cnn", input_shape=(28, 28), num_classes=10)
    with pytest.raises(ValueError, match="too small"):
        build_model("lenet5", input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(ValueError, match="num_classes"):
        build_model("cnn", input_shape=(1, 28, 28), num_classes=0)


def test_get_set_weights_round_trip() -> None:
    src = build_model("lenet5", input_shape=(1, 28, 28), num_classes=10, seed=1)
    dst = build_model("lenet5", input_shape=(1, 28, 28), num_classes=10, seed=2)
    weights = get_weights(src)
    set_weights(dst, weights)
    assert all(np.array_equal(x, y) for x, y in zip(get_weights(dst), weights, strict=True))
    weights[0][...] = 0.0  # copies: editing them does not touch the model
    assert get_weights(src)[0].any()
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(src(x), dst(x))
    bad = get_weights(src)
    bad[2] = bad[2][:, :10]
    with pytest.raises(ValueError, match="conv2.weight has shape"):
        set_weights(dst, bad)
    with pytest.raises(ValueError, match="10 tensors"):
        set_weights(dst, bad[:3])


@pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook")
@pytest.mark.parametrize("name", MODELS)
def test_opacus_ghost_clipping_step(name: str) -> None:
    model = build_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
    before = get_weights(model)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8, 1, 28, 28, generator=gen), torch.arange(8) % 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    private, optimizer, criterion, loader = PrivacyEngine().make_private(
        module=model,
        optimizer=optimizer,
        data_loader=DataLoader(data, batch_size=8),
        noise_multiplier=0.5,
        max_grad_norm=1.0,
        criterion=torch.nn.CrossEntropyLoss(),
        grad_sample_mode="ghost",
        poisson_sampling=False,
    )
    for x, y in loader:
        optimizer.zero_grad()
        criterion(private(x), y).backward()
        optimizer.step()
    assert unwrap(private) is model
    assert weight_names(private) == weight_names(model)
    after = get_weights(private)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    set_weights(private, before)
    assert all(np.array_equal(a, b) for a, b in zip(before, get_weights(model), strict=True))


def _toy(n: int = 64) -> ArrayDataset:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 1, 6, 6)) + y[:, None, None, None]
    return ArrayDataset(x.astype(np.float32), y.astype(np.int64), 3, "toy")


def test_evaluate_restores_mode_and_counts() -> None:
    data = _toy()
    model = build_model("logreg", input_shape=(1, 6, 6), num_classes=3)
    model.train()
    loss, acc = evaluate(model, data, batch_size=10)
    assert model.training
    assert loss == pytest.approx(np.log(3), rel=1e-6)  # zero weights: uniform softmax
    assert acc == pytest.approx(np.mean(data.y == 0))  # argmax ties -> class 0
    with pytest.raises(ValueError, match="empty"):
        evaluate(model, ArrayDataset(data.x[:0], data.y[:0], 3, "none"))


def test_train_plain_is_deterministic_and_validates() -> None:
    data = _toy()
    runs = []
    for _ in range(2):
        model = build_model("mlp2", input_shape=(1, 6, 6), num_classes=3, seed=3)
        metrics = train_plain(model, data, epochs=2, batch_size=10, lr=0.1, momentum=0.5, seed=9)
        runs.append((metrics, get_weights(model)))
    assert runs[0][0] == runs[1][0]
    assert runs[0][0][LOCAL_STEPS_KEY] == 2 * 7
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
    with pytest.raises(ValueError, match="momentum"):
        train_plain(model, data, epochs=1, batch_size=10, lr=0.1, momentum=1.0, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        train_plain(model, data, epochs=1, batch_size=0, lr=0.1, momentum=0.0, seed=0)


@needs_fmnist
@pytest.mark.parametrize("name", ["cnn", "logreg"])
def test_train_plain_reduces_loss_on_real_fmnist(name: str) -> None:
    splits = load_dataset("fashion-mnist")
    train = splits.train.subset(np.arange(512))
    held_out = splits.test.subset(np.arange(500))
    model = build_model(name, input_shape=train.input_shape, num_classes=10, seed=0)
    loss0, acc0 = evaluate(model, held_out)
    metrics = train_plain(model, train, epochs=3, batch_size=32, lr=0.05, momentum=0.9, seed=0)
    loss1, acc1 = evaluate(model, held_out)
    assert metrics[LOCAL_STEPS_KEY] == 3 * 16 and np.isfinite(metrics[TRAIN_LOSS_KEY])
    assert loss1 < 0.75 * loss0 and acc1 > max(0.5, acc0 + 0.3)


def test_auto_grad_sample_mode_takes_the_table_and_only_modes_the_model_supports():
    """``auto`` resolves per model from the step benchmark's table (else ghost) to a mode that
    model can run; explicit modes pass through; ``linear`` is refused for a model with convolutions."""
    from client.bk_dpsgd import supports_bk_dpsgd
    from client.linear_dpsgd import supports_linear_dpsgd
    from tasks.model_names import (
        BK_MODE,
        BK_MODELS,
        FASTEST_GRAD_SAMPLE_MODE,
        GRAD_SAMPLE_MODES,
        LINEAR_MODE,
        LINEAR_MODELS,
        MODELS,
        resolve_grad_sample_mode,
    )

    assert set(FASTEST_GRAD_SAMPLE_MODE) <= set(MODELS)
    for m in MODELS:
        chosen = resolve_grad_sample_mode("auto", m)
        assert chosen == FASTEST_GRAD_SAMPLE_MODE.get(m, "ghost") and chosen in GRAD_SAMPLE_MODES[1:]
        # the table of Linear-only models agrees with the models themselves
        linear = supports_linear_dpsgd(build_model(m, input_shape=(1, 28, 28), num_classes=10, seed=0))
        assert (m in LINEAR_MODELS) == linear
        assert chosen != LINEAR_MODE or linear
        bk = supports_bk_dpsgd(build_model(m, input_shape=(1, 28, 28), num_classes=10, seed=0))
        assert (m in BK_MODELS) == bk
        assert chosen != BK_MODE or bk
    assert [resolve_grad_sample_mode(m, "mlp2") for m in GRAD_SAMPLE_MODES[1:]] == list(GRAD_SAMPLE_MODES[1:])
    with pytest.raises(ValueError, match="grad-sample-mode 'linear' needs a model of Linear layers only"):
        resolve_grad_sample_mode(LINEAR_MODE, "cnn")
    with pytest.raises(ValueError, match="grad-sample-mode must be one of auto, hooks, ghost, functorch, linear"):
        resolve_grad_sample_mode("fast", "cnn")


def test_seeded_torch_on_the_cpu_draws_as_manual_seed_and_restores_the_state() -> None:
    """seeded_torch seeds only the CPU's generator on the CPU (#38: torch.manual_seed's lazy CUDA seeding
    formats the call stack each time): the same draws as under torch.manual_seed, the outer state kept."""
    from tasks.models import seeded_torch

    torch.manual_seed(123)
    outside = torch.rand(3)
    torch.manual_seed(123)
    with seeded_torch(7):
        inside = torch.rand(5)
    assert torch.equal(torch.rand(3), outside)  # restored: the block drew nothing from the outer stream
    torch.manual_seed(7)
    assert torch.equal(inside, torch.rand(5))
