"""``import privet``: every public name resolves, and the pieces fit privet's own ClientApp."""

from __future__ import annotations

import numpy as np
import pytest

import privet
from tasks.models import build_model, weight_names


def test_every_public_name_resolves_and_unknown_ones_fail():
    for name in privet.__all__:
        assert getattr(privet, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        privet.Nope  # noqa: B018


def test_strategy_by_name_uses_the_methods_own_mode_and_refuses_unknown_names():
    from strategies.catalogue import CATALOGUE

    built = privet.strategy("gdpfed-plus")
    assert isinstance(built, privet.GDPFedPlus) and built.dp_mode == CATALOGUE["gdpfed-plus"].dp_mode
    with pytest.raises(ValueError, match="unknown strategy 'fedsgd'; one of fedavg"):
        privet.strategy("fedsgd")


def test_initial_arrays_are_the_models_weights_under_its_own_names():
    arrays = privet.initial_arrays("cnn", input_shape=(1, 28, 28), num_classes=10, seed=3)
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=3)
    assert list(arrays.keys()) == weight_names(model)  # what the ClientApp loads by name
    state = model.state_dict()
    for name, array in arrays.items():
        np.testing.assert_array_equal(array.numpy(), state[name].numpy())
    other = privet.initial_arrays("cnn", input_shape=(1, 28, 28), num_classes=10, seed=4)
    assert any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(arrays.values(), other.values(),
                                                                          strict=True))
