"""The models' and DP-SGD modes' names, and the choice of a mode: what validation reads, without torch.

The models themselves are :mod:`tasks.models`; a config error must be reported before torch loads.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BK_MODE", "BK_MODELS", "FASTEST_GRAD_SAMPLE_MODE", "GRAD_SAMPLE_MODES", "LINEAR_MODE", "LINEAR_MODELS",
           "MODELS", "resolve_grad_sample_mode"]

MODELS: Final = ("mlp2", "lenet5", "logreg", "cnn", "cnn2")

#: How DP-SGD gets its clipped per-sample gradients: Opacus' three modes, privet's book-keeping
#: clipping for models of Linear and Conv2d layers (``bk``, ``client/bk_dpsgd.py``), its special
#: case for models of Linear layers only (``linear``, ``client/linear_dpsgd.py``), and ``auto``,
#: the fastest measured for the model.
LINEAR_MODE: Final = "linear"
BK_MODE: Final = "bk"
GRAD_SAMPLE_MODES: Final = ("auto", "hooks", "ghost", "functorch", LINEAR_MODE, BK_MODE)

#: Models whose trainable parameters all sit in ``nn.Linear`` layers (``linear`` applies;
#: a test checks this against the models themselves).
LINEAR_MODELS: Final = ("mlp2", "logreg")

#: Models whose trainable parameters all sit in ``nn.Linear`` and ``nn.Conv2d`` layers (``bk``
#: applies; a test checks this against the models themselves).
BK_MODELS: Final = MODELS

#: The fastest mode per model (benchmarks/results/dpsgd_step.md, batch 64, one thread, every mode
#: interleaved step by step, tuned malloc): book-keeping clipping for every model, e.g. ``cnn``
#: 1.42x a plain step against hooks 1.73x and ghost 2.03x; ``cnn2`` 1.62x against ghost 2.33x;
#: ``logreg`` 2.09x against the closed form's 2.53x. ``bk`` is exact per-sample clipping
#: (tests/client/test_bk_dpsgd.py against Opacus), so ``auto`` changes the cost, not the mechanism.
FASTEST_GRAD_SAMPLE_MODE: Final = dict.fromkeys(BK_MODELS, BK_MODE)


def resolve_grad_sample_mode(mode: str, model: str) -> str:
    """The per-sample-gradient mode to run: ``mode`` itself, or for ``auto`` the fastest measured.

    The fastest for ``model`` is :data:`FASTEST_GRAD_SAMPLE_MODE`'s entry, else ``ghost``.

    Raises ValueError on an unknown mode, ``linear`` for a model with other layers than Linear,
    or ``bk`` for one with other layers than Linear and Conv2d.
    """
    if mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad-sample-mode must be one of {', '.join(GRAD_SAMPLE_MODES)}; found {mode!r}")
    if mode == LINEAR_MODE and model not in LINEAR_MODELS:
        raise ValueError(f"grad-sample-mode 'linear' needs a model of Linear layers only ({', '.join(LINEAR_MODELS)}); "
                         f"found model {model!r}: use 'auto', 'bk', 'ghost' or 'hooks'")
    if mode == BK_MODE and model not in BK_MODELS:
        raise ValueError(f"grad-sample-mode 'bk' needs a model of Linear and Conv2d layers ({', '.join(BK_MODELS)}); "
                         f"found model {model!r}: use 'auto', 'ghost' or 'hooks'")
    return FASTEST_GRAD_SAMPLE_MODE.get(model, "ghost") if mode == "auto" else mode
