"""PFA's public / private split of the round's clients by budget (Alg. 2 line 5, Remark 2).

Paper: Liu et al., "Projected Federated Averaging with Heterogeneous Differential
Privacy", PVLDB 15(4), 2022 (``docs/notes/pfa.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from privacy.checks import check_choice
from strategies.layers import as_epsilons

SPLIT_METHODS: Final = ("top-fraction", "two-cluster")


def _split_top_fraction(eps: np.ndarray, public_fraction: float) -> np.ndarray:
    n_public = max(1, math.ceil(round(public_fraction * eps.size, 9)))
    threshold = np.sort(eps)[-n_public]
    is_public: np.ndarray = eps >= threshold
    return is_public


def _within_cluster_sse(values: np.ndarray) -> float:
    return float(np.sum((values - values.mean()) ** 2))


def _split_two_cluster(eps: np.ndarray, public_fraction: float) -> np.ndarray:
    del public_fraction  # not used by the clustering rule
    order = np.sort(eps)
    # Exact 1-D 2-means: an optimal 2-clustering of points on a line is a threshold
    # split of the sorted values, so score every split between two distinct values.
    cuts = [i for i in range(1, order.size) if order[i - 1] < order[i]]
    if not cuts:  # all budgets equal: a single cluster, all public
        return np.ones(eps.size, dtype=bool)
    sse = [
        _within_cluster_sse(order[:i]) + _within_cluster_sse(order[i:]) for i in cuts
    ]
    # among equal scores keep the last cut, i.e. the fewest public clients
    best = max(range(len(cuts)), key=lambda j: (-sse[j], j))
    is_public: np.ndarray = eps >= order[cuts[best]]
    return is_public


_SPLITTERS: Final[dict[str, Callable[[np.ndarray, float], np.ndarray]]] = {
    "top-fraction": _split_top_fraction,
    "two-cluster": _split_two_cluster,
}


def split_public_private(
    epsilons: Sequence[float] | np.ndarray,
    *,
    method: str = "top-fraction",
    public_fraction: float = 0.1,
) -> tuple[list[int], list[int]]:
    """Split clients into "public" (large ε) and "private" (small ε) groups.

    Paper §4.4 step (1) and Remark 2 suggest 2-cluster clustering of the budgets, or the
    top-K clients by ε. Both are deterministic here.

    Parameters
    ----------
    epsilons : sequence of float
        Per-client budgets ε_m > 0.
    method : {"top-fraction", "two-cluster"}
        ``"top-fraction"`` (**default**, the authors' ``Server.set_public_clients``):
        n = max(1, ⌈public_fraction · M⌉), threshold = the n-th largest ε, and every
        client with ε_m ≥ threshold is public. Ties at the threshold are all public, as
        in the code, so equal budgets are treated equally (all-equal ε: everyone is
        public and PFA reduces to WeiAvg = FedAvg). For 0.1·M integral this is the
        code's 2/3/4/5 public of 20/30/40/50 (Table 5); the code's floor ``int(0.1·M)``
        makes *every* client public for M < 10, the ceiling here gives one.
        ``"two-cluster"``: 1-D 2-means on ε, solved exactly (the optimum is a
        threshold split of the sorted budgets, so all M − 1 splits between distinct
        values are scored by within-cluster sum of squares; no initialisation, no
        local optima). The high-ε cluster is public; an SSE tie goes to the split with
        fewer public clients; all-equal ε makes everyone public.
        Top-fraction is the default because it is what the paper's experiments used,
        and because 2-means on a unimodal distribution (Uniform, Gauss) makes about
        half of the clients "public".
    public_fraction : float
        Fraction in (0, 1] for ``"top-fraction"``; ignored by ``"two-cluster"``.

    Returns
    -------
    tuple of (list of int, list of int)
        Ascending indices of the public and of the private clients.
    """
    eps = as_epsilons("epsilons", epsilons)
    if eps.size == 0:
        raise ValueError("epsilons must contain at least one budget; found none")
    check_choice("method", method, SPLIT_METHODS)
    if isinstance(public_fraction, bool) or not 0.0 < public_fraction <= 1.0:
        raise ValueError(
            f"public_fraction must be in (0, 1]; found {public_fraction!r}"
        )
    is_public = _SPLITTERS[method](eps, float(public_fraction))
    return np.flatnonzero(is_public).tolist(), np.flatnonzero(~is_public).tolist()
