"""FedCEO as a Flower strategy: clients collaborate through tensor low-rank smoothing.

Paper: Y. Li et al., "Clients Collaborate: Flexible Differentially Private Federated
Learning with Guaranteed Improvement of Utility-Privacy Trade-off", ICML 2025,
https://arxiv.org/abs/2402.07002 (equation and line numbers: the arXiv version).
Authors' code: ``6lyc/FedCEO_Collaborate-with-Each-Other``.

The mathematics (stacking, the T-tSVD, the threshold schedule) is pure numpy in
:mod:`strategies.fedceo_smoothing`; this module converts records, keeps each client's
smoothed model ŵ_k(t) between rounds and sends it back to that client.

Privacy. The server's smoothing is a deterministic function of the clients' privatised
uploads, so it is post-processing (Theorem 4.5): FedCEO's guarantee is exactly that of
the clients' mechanism, which ``dp-mode`` selects and every run reports:

- ``"update"`` (default, the paper's Algorithm 1): client-level DP of each upload; the
  client clips its whole update to C and adds N(0, σ²C²/m) locally.
- ``"dpsgd"``: the authors' code, which produced the paper's tables: Opacus per-sample
  DP-SGD with noise multiplier σ_g at every local step; sample-level DP only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Unpack

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from typing_extensions import override

from protocol import keys
from strategies.base import AcceptedReply, ClientAccount, PrivacyAwareFedAvg, StrategyOptions
from strategies.fedceo_config import FedCEOConfig
from strategies.fedceo_smoothing import (
    is_smoothing_round,
    mean_model,
    smooth_client_models,
    smoothing_threshold,
)

log = logging.getLogger("privet.strategy")

#: Per-round diagnostics, merged into the round's results line (rounds.jsonl).
DIAG_SMOOTHING_ROUND = "fedceo-smoothing-round"  # 1 if t % I == 0
DIAG_SMOOTHED = "fedceo-smoothed"  # 1 if the T-tSVD actually ran
DIAG_THRESHOLD = "fedceo-threshold"  # ϑ^{t/I}/(2λ); NaN when not smoothed
DIAG_CLIENTS = "fedceo-clients-smoothed"  # K, the tensor's third dimension
DIAG_SECONDS = "fedceo-smoothing-seconds"  # wall time of the T-tSVD
DIAG_SHRINKAGE = "fedceo-global-shrinkage"  # ‖w'(t) − mean_k w'_k(t)‖ / ‖mean_k w'_k(t)‖

GUARANTEES = {
    keys.DP_UPDATE: "client-level DP of each upload (the paper's Algorithm 1)",
    keys.DP_SGD: "sample-level DP-SGD (the authors' code variant, not the paper's user-level DP)",
    keys.DP_NONE: "no privacy",
}


class FedCEO(PrivacyAwareFedAvg):
    """FedCEO (Algorithm 2): every I rounds, smooth the K client models as one tensor.

    Round t, for the K clients S_t whose replies passed validation (in node-id order,
    which fixes the client mode of the tensor):

    - t % I == 0 (line 11): for each model array, fold the K uploads into
      W_N ∈ R^{n1×n2×K} and solve Eq. (2) in closed form (Theorem 3.1, Eq. (3)): the
      T-tSVD at threshold ϑ^{t/I}/(2λ). Client k's slice is its smoothed model ŵ_k(t),
      kept for the next round; the global model is w'(t) = (1/K) Σ_k ŵ_k(t) (App. B.3),
      which equals SVT(mean_k w'_k(t), thr/K) per array (Prop. 3.2, Eq. (17)).
    - otherwise (line 18): w'(t) = (1/K) Σ_k w'_k(t).

    Both averages are unweighted, as in the paper and its code: every clipped update
    counts once, whatever the client's example count.

    In round t+1 a client k ∈ S_t starts from **its own** ŵ_k(t) (lines 5-6: personalised
    collaboration). Any other client, including a client of S_t sampled again only later,
    starts from the global w'(t): the paper leaves this case open and the authors' code
    sends a possibly stale model (docs/notes/fedceo.md §8 item 6). With fewer than two usable replies a
    smoothing round cannot collaborate; it averages and logs why.

    Parameters
    ----------
    params : FedCEOConfig, optional
        The ``fedceo.*`` section (default ``FedCEOConfig()``).
    dp_mode : str, optional
        Default ``"update"`` (Algorithm 1); ``"dpsgd"`` is the authors' code variant.

    Other parameters: see PrivacyAwareFedAvg.
    """

    default_dp_mode = keys.DP_UPDATE

    def __init__(self, params: FedCEOConfig | None = None, **options: Unpack[StrategyOptions]) -> None:
        super().__init__(**options)
        self.params = params if params is not None else FedCEOConfig()
        self._smoothed: dict[int, list[np.ndarray]] = {}  # node id -> ŵ_k(t)
        self._smoothed_round = -1  # the t of the stored ŵ_k(t)
        self._diagnostics: dict[int, dict[str, float]] = {}

    @override
    def summary(self) -> None:
        super().summary()
        log.info("%s: %s; guarantee: %s", type(self).__name__, self.params.model_dump(by_alias=True),
                 GUARANTEES[self.dp_mode])

    # ---------------------------------------------------------------- downlink
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Check ``fedceo.layers`` against the model before any client trains."""
        self._check_layers(arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def _check_layers(self, arrays: ArrayRecord) -> None:
        indices = self.params.layer_indices
        if indices is None:
            return
        models = arrays.to_numpy_ndarrays()
        for i in indices:
            if i >= len(models):
                raise ValueError(f"'fedceo.layers' index {i} out of range: the model has {len(models)} arrays")
            if not np.issubdtype(models[i].dtype, np.floating):
                raise ValueError(f"'fedceo.layers' index {i} is array '{list(arrays.keys())[i]}' of dtype "
                                 f"{models[i].dtype}; only floating arrays can be smoothed")

    def node_arrays(self, server_round: int, account: ClientAccount, arrays: ArrayRecord) -> ArrayRecord:
        """Lines 5-6: ŵ_k(t−1) for a client smoothed in round t−1, else the global w'(t−1)
        (always the global with ``restart = "global"``).
        """
        if self.params.restart == "global":
            return arrays
        own = self._smoothed.get(account.node_id) if self._smoothed_round == server_round - 1 else None
        if own is None:
            return arrays
        return ArrayRecord({name: Array(np.asarray(a)) for name, a in zip(arrays.keys(), own, strict=True)})

    # -------------------------------------------------------------- aggregation
    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """Lines 11-18 of Algorithm 2 on this round's validated uploads w'_k(t)."""
        replies = sorted(replies, key=lambda r: r.node_id)
        uploads = [r.arrays for r in replies]
        self._smoothed, self._smoothed_round = {}, -1
        diag = {DIAG_SMOOTHING_ROUND: 0.0, DIAG_SMOOTHED: 0.0, DIAG_THRESHOLD: math.nan,
                DIAG_CLIENTS: 0.0, DIAG_SECONDS: 0.0, DIAG_SHRINKAGE: 0.0}
        self._diagnostics[server_round] = diag
        p = self.params
        if not is_smoothing_round(server_round, p.interval):
            return mean_model(uploads)  # line 18: FedAvg
        diag[DIAG_SMOOTHING_ROUND] = 1.0
        if len(replies) < 2:
            log.warning("round %d: FedCEO smoothing needs >= 2 usable client models, got %d; "
                        "averaging instead", server_round, len(replies))
            return mean_model(uploads)
        thr = smoothing_threshold(server_round, lam=p.lam, theta=p.theta, interval=p.interval)  # Eq. (2)
        start = time.perf_counter()
        smoothed = smooth_client_models(uploads, thr, layers=p.layer_indices,
                                        half_spectrum=p.half_spectrum)  # Thm 3.1, Eq. (3)
        seconds = time.perf_counter() - start
        self._smoothed = {r.node_id: model for r, model in zip(replies, smoothed, strict=True)}
        self._smoothed_round = server_round
        new_global = mean_model(smoothed)  # App. B.3: w'(t) = (1/K) Σ_k ŵ_k(t)
        diag.update({DIAG_SMOOTHED: 1.0, DIAG_THRESHOLD: thr, DIAG_CLIENTS: float(len(replies)),
                     DIAG_SECONDS: seconds, DIAG_SHRINKAGE: _relative_change(new_global, mean_model(uploads))})
        log.info("round %d: FedCEO smoothed %d client models at threshold %.4g in %.3fs "
                 "(global shrinkage %.3g)", server_round, len(replies), thr, seconds, diag[DIAG_SHRINKAGE])
        return new_global

    def round_metrics(self, server_round: int) -> dict[str, float]:
        """Whether smoothing ran, its threshold, K, seconds and shrinkage (``fedceo-*``)."""
        return self._diagnostics.pop(server_round, {})


def _relative_change(new: list[np.ndarray], old: list[np.ndarray]) -> float:
    """‖new − old‖_F / ‖old‖_F over all arrays (0 when old is zero)."""
    diff = math.sqrt(sum(float(np.sum((np.asarray(a, np.float64) - b) ** 2)) for a, b in zip(new, old, strict=True)))
    norm = math.sqrt(sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for b in old))
    return diff / norm if norm > 0 else 0.0
