"""Seeded client sampling: the same seed draws the same clients on every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["seeded_sample"]


def seeded_sample(node_ids: Iterable[int], size: int, seed: Sequence[int],
                  order: Callable[[int], Any] | None = None) -> list[int]:
    """``size`` distinct node ids drawn uniformly with a seeded generator, sorted.

    The draw picks positions in the pool sorted by ``order`` (default: the node id). Node ids are
    uint64: indices are drawn with numpy, never the ids themselves (numpy would turn ids above
    2**63 into floats and lose digits).
    """
    pool = sorted(node_ids, key=order)
    rng = np.random.default_rng(list(seed))
    return sorted(pool[int(i)] for i in rng.choice(len(pool), size=min(size, len(pool)), replace=False))
