"""Paired comparisons over seeds, as the reproduction drivers report them.

Two methods run on the same seed share the sampled clients, the data split and the initial
model, so their per-seed difference g_s = a_s − b_s removes what the seed alone decides. The
drivers report the mean gap ḡ = (1/S) Σ_s g_s with a 95 % percentile bootstrap interval: resample
the S gaps with replacement B = 10,000 times, take the 2.5th and 97.5th percentiles of the
resampled means. The resampling is seeded, so a report rebuilt from the same records is the same.
With S = 5 seeds the interval is rough (it cannot be wider than the range of the gaps); it says
how the seeds disagree, not more.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from typing import TypeVar

__all__ = ["BOOTSTRAP", "bootstrap_interval", "paired_gaps"]

#: a seed, as the records name it (an int, or its text)
Seed = TypeVar("Seed", int, str)

#: bootstrap resamples of the mean gap
BOOTSTRAP = 10_000


def bootstrap_interval(gaps: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval at ``level`` of the mean of the paired ``gaps`` (seeded)."""
    if not gaps:
        raise ValueError("bootstrap_interval needs at least one gap")
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(list(gaps), k=len(gaps))) for _ in range(BOOTSTRAP))
    return means[int((1 - level) / 2 * BOOTSTRAP)], means[int((1 + level) / 2 * BOOTSTRAP) - 1]


def paired_gaps(a: Mapping[Seed, float], b: Mapping[Seed, float]) -> dict[Seed, float]:
    """a_s − b_s on every seed s both were run on, in seed order."""
    return {seed: a[seed] - b[seed] for seed in sorted(set(a) & set(b))}
