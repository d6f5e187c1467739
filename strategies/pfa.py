"""WeiAvg, PFA and PFA+ as Flower strategies (heterogeneous DP budgets).

Paper: J. Liu, J. Lou, L. Xiong, J. Liu, X. Meng, "Projected Federated Averaging with
Heterogeneous Differential Privacy", PVLDB 15(4), 2022, doi:10.14778/3503585.3503592.
Authors' code: ``JunxuLiu/PFA``. The mathematics (split, ε-weights, subspaces,
projection, coordinates) is pure numpy in :mod:`strategies.pfa_projection`; this module
turns records into updates and back, and keeps what a strategy must remember between
rounds (the public set, the global model of the round, PFA+'s previous subspace).

Every client runs DP-SGD with noise calibrated from its own ε (``dp-mode = "dpsgd"``);
the server weights clients by the ε they declared in the budget handshake (Remark 1: a
client's privacy preference is public to the server).

Sign convention: an update is Δ_m = w_m − w_global (the paper's Fig. 2) and the new
global model is w_global + Δ̄. Alg. 7 and the maths module's docstring use the opposite
sign; every operation there (weighted means, the span and centre of the subspace, the
affine projection, the coordinates) is odd under Δ → −Δ, so both give the same model.

PFA+ on the wire (Alg. 4): from round 2 on, the train request to a *private* client holds,
beside the global model, the previous round's subspace of every model array and
``upload-format = "coordinates"``; the client replies with k_ℓ coordinates per array
(:mod:`protocol.pfa_plus`, the format). The server reconstructs with the same rounded
subspace it sent, so encode and decode are exactly one affine map.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Final, Unpack

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from typing_extensions import override

from protocol import keys
from strategies.base import AcceptedReply, ClientAccount, PrivacyAwareFedAvg, StrategyOptions
from strategies.layers import weighted_mean
from strategies.pfa_config import PFAConfig
from strategies.pfa_plus_projection import pfa_plus_aggregate
from strategies.pfa_projection import pfa_aggregate
from strategies.pfa_split import split_public_private
from strategies.pfa_subspace import LayerSubspace
from strategies.validation import ArraySpec

log = logging.getLogger("privet.strategy")

#: PFA+ diagnostic: private replies that were k-coordinate uploads this round.
DIAG_COORDINATE_UPLOADS = "pfa-coordinate-uploads"




#: Redraws of a round's sample under ``no-public = "redraw"`` before giving up (the chance
#: that every one misses the public clients is negligible whenever one is eligible).
MAX_REDRAWS: Final = 1000


def declared_epsilon(account: ClientAccount) -> float:
    """The ε a client declared in the handshake; WeiAvg and PFA need it finite."""
    eps = account.epsilon_budget
    if not math.isfinite(eps):
        raise ValueError(
            f"WeiAvg/PFA weight clients by their declared eps; client {account.client_id} "
            f"declared eps={eps} (budget-distribution 'none'?): give every client a finite budget"
        )
    return float(eps)


class EpsilonWeighted(PrivacyAwareFedAvg):
    """A strategy that weights clients by their declared ε: an infinite one is refused at
    the handshake (it would take all the weight, and break the run mid-way), and so is one
    above ``max-epsilon-ratio`` × the median declared ε (:class:`PrivacyAwareFedAvg`).
    """

    weights_by_epsilon = True

    @override
    def refuse_declaration(self, account: ClientAccount) -> str | None:
        if math.isfinite(account.epsilon_budget):
            return None
        return (f"declared eps={account.epsilon_budget}: {type(self).__name__} weights clients by their "
                f"declared eps, which must be finite (set node-config 'epsilon' to a number)")


class WeiAvg(EpsilonWeighted):
    """WeiAvg (Alg. 1, §4.3): x ← Σ_{m∈S} W_S(ε_m) w_m, with W_S(ε_m) = ε_m / Σ_S ε.

    Averaging the uploaded models with weights that sum to one is the same as adding
    the weighted mean update to the global model: Σ W_m (w + Δ_m) = w + Σ W_m Δ_m.
    Example counts are ignored, as in the paper. Parameters: see PrivacyAwareFedAvg.
    """

    @override
    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        eps = [declared_epsilon(self.accounts[r.node_id]) for r in replies]
        return weighted_mean([r.arrays for r in replies], eps)


class PFA(EpsilonWeighted):
    """Projected Federated Averaging (Alg. 2 + Alg. 3), ε-weighted (the code's WeiPFA).

    Per layer: the ε-weighted mean of the private updates is projected onto the top-k
    subspace of the public updates, then mixed with the ε-weighted public mean in the
    ratio E_pub : E_pri (:func:`strategies.pfa_projection.pfa_aggregate`).

    The public set (Alg. 2 line 5) is computed **once over every registered client**
    from their declared budgets, as the authors' ``Server.set_public_clients`` does, not
    per sampled round; it is recomputed only when new clients register.

    Parameters
    ----------
    params : PFAConfig, optional
        The ``pfa.*`` section (default ``PFAConfig()``).

    Other parameters: see PrivacyAwareFedAvg.
    """

    def __init__(self, params: PFAConfig | None = None, **options: Unpack[StrategyOptions]) -> None:
        super().__init__(**options)
        self.params = params if params is not None else PFAConfig()
        self._global: list[np.ndarray] = []  # w_global of the current round
        self._public: frozenset[int] = frozenset()
        self._split_over: frozenset[int] = frozenset()  # the registered nodes split
        self._subspaces: list[LayerSubspace] = []  # fitted in the last aggregation
        self._diagnostics: dict[int, dict[str, float]] = {}

    @override
    def summary(self) -> None:
        super().summary()
        log.info("%s: %s", type(self).__name__, self.params.model_dump(by_alias=True))

    def public_nodes(self) -> frozenset[int]:
        """Node ids of the public clients (Alg. 2 line 5, Remark 2)."""
        registered = frozenset(self.accounts)
        if registered and registered != self._split_over:
            nodes = sorted(registered)
            eps = [declared_epsilon(self.accounts[n]) for n in nodes]
            public, _ = split_public_private(
                eps, method=self.params.split, public_fraction=self.params.public_fraction
            )
            self._public = frozenset(nodes[i] for i in public)
            self._split_over = registered
            log.info("%s: public clients %s of %d (split %s)", type(self).__name__,
                     sorted(self.accounts[n].client_id for n in self._public), len(nodes),
                     self.params.split)
        return self._public

    def sample(self, server_round: int, eligible: list[int], attempt: int = 0) -> list[int]:
        """The base sample; under ``no-public = "redraw"``, redrawn (seeded per attempt)
        until it holds a public client, as the authors' code does.
        """
        chosen = super().sample(server_round, eligible, attempt)
        public = self.public_nodes() & frozenset(eligible)
        if self.params.no_public != "redraw" or not chosen or not public:
            return chosen
        for retry in range(1, MAX_REDRAWS + 1):
            if public & frozenset(chosen):
                if retry > 1:
                    log.info("%s round %d: sample redrawn %d times for a public client", type(self).__name__,
                             server_round, retry - 1)
                return chosen
            chosen = super().sample(server_round, eligible, attempt + retry)
        return chosen

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember w_global: clients upload models, the maths works on updates."""
        self._global = arrays.to_numpy_ndarrays()
        for name, g in zip(arrays.keys(), self._global, strict=True):
            if not np.issubdtype(g.dtype, np.floating):
                raise ValueError(f"PFA projects every model array; '{name}' has dtype {g.dtype}, not floating")
        return super().configure_train(server_round, arrays, config, grid)

    def _round_seed(self, server_round: int) -> int:
        return int(np.random.SeedSequence([self.seed, server_round]).generate_state(1)[0])

    def _updates(self, replies: list[AcceptedReply]) -> list[list[np.ndarray]]:
        """Δ_m = w_m − w_global, per model array, in float64."""
        return [
            [np.asarray(w, np.float64) - np.asarray(g, np.float64) for w, g in zip(r.arrays, self._global, strict=True)]
            for r in replies
        ]

    def _apply(self, aggregate: list[np.ndarray]) -> list[np.ndarray]:
        """Alg. 2 line 9: the new global model w_global + Δ̄, in the model's dtypes."""
        return [
            (np.asarray(g, np.float64) + a).astype(g.dtype) for g, a in zip(self._global, aggregate, strict=True)
        ]

    def _epsilons(self, replies: list[AcceptedReply]) -> list[float]:
        return [declared_epsilon(self.accounts[r.node_id]) for r in replies]

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """Alg. 2 line 8 (ProjectedFedAvg, Alg. 3) on this round's accepted updates."""
        public = self.public_nodes()
        p = self.params
        aggregate, subspaces, diagnostics = pfa_aggregate(
            self._updates(replies),
            self._epsilons(replies),
            k=p.k,
            public_mask=[r.node_id in public for r in replies],
            center=p.center,
            method=p.subspace_method,
            no_public=p.no_public,
            seed=self._round_seed(server_round),
        )
        self._subspaces = subspaces
        self._diagnostics[server_round] = diagnostics
        return self._apply(aggregate)

    def round_metrics(self, server_round: int) -> dict[str, float]:
        """Split sizes, E_pub/E, effective k and the private energy kept (``pfa-*``)."""
        return self._diagnostics.pop(server_round, {})


class PFAPlus(PFA):
    """PFA+ (Alg. 4 + Alg. 5): private clients upload k coordinates per layer.

    Round 1 (and any round with no subspace yet) is the warm-up: everyone uploads a full
    model and the server runs PFA, which yields the first subspace. Afterwards every
    sampled private client receives the latest subspace (V_k[t−1], μ[t−1]) in the
    ``"pfa-basis"`` record and answers with V_kᵀ(Δ_m − μ) per layer; public clients
    still upload full models. The server lifts the ε-weighted mean coordinates back with
    the subspace it sent and refits the subspace on this round's public updates
    (:func:`strategies.pfa_plus_projection.pfa_plus_aggregate`). A private client that was
    not sampled last round gets the latest subspace too (docs/notes/pfa.md §7.15). After the
    warm-up, a round without public replies cannot fall back to WeiAvg (the private
    updates exist only as coordinates): it uses the reconstructed private mean and keeps
    the previous subspace (``pfa-stale-subspace``), unless ``no-public = "error"``.

    Parameters: see PFA.
    """

    def __init__(self, params: PFAConfig | None = None, **options: Unpack[StrategyOptions]) -> None:
        super().__init__(params, **options)
        self._sent: dict[int, list[LayerSubspace]] = {}  # round -> subspace sent down

    def uses_coordinates(self, server_round: int, account: ClientAccount) -> bool:
        """Alg. 4 line 10: private and past the warm-up."""
        return server_round in self._sent and account.node_id not in self.public_nodes()

    @override
    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        if not self.uses_coordinates(server_round, account):
            return config
        cfg = ConfigRecord(dict(config))
        cfg[keys.UPLOAD_FORMAT] = keys.UPLOAD_COORDINATES
        return cfg

    def expected_specs(self, server_round: int, account: ClientAccount) -> list[ArraySpec]:
        """k_ℓ values per model array for a private client after the warm-up."""
        if not self.uses_coordinates(server_round, account):
            return self.global_specs
        return [
            ArraySpec(spec.name, (sub.k,), spec.dtype)
            for spec, sub in zip(self.global_specs, self._sent[server_round], strict=True)
        ]

    def _basis_record(self, subspaces: list[LayerSubspace]) -> ArrayRecord:
        items: dict[str, Array] = {}
        for name, sub in zip(self.global_names, subspaces, strict=True):
            items[keys.PROJECTION_BASIS_PREFIX + name] = Array(sub.basis)
            if sub.center is not None:
                items[keys.PROJECTION_CENTER_PREFIX + name] = Array(sub.center)
        return ArrayRecord(items)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Alg. 4 line 5: broadcast x, and V_k[t−1] (with μ[t−1]) to private clients."""
        self._sent = {server_round: self._subspaces} if self._subspaces else {}
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if server_round in self._sent:
            record = self._basis_record(self._sent[server_round])
            size = sum(a.nbytes for a in record.to_numpy_ndarrays())
            for msg in messages:
                if msg.metadata.dst_node_id not in self.public_nodes():
                    msg.content[keys.PFA_BASIS_RECORD] = record
                    self.book.add_bytes_down(server_round, size)
        return messages

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """Warm-up: PFA (Alg. 3). Later rounds: ProjectedFedAvgPro (Alg. 5)."""
        sent = self._sent.get(server_round)
        if sent is None:
            new_global = super().aggregate_models(server_round, replies)
        else:
            public = self.public_nodes()
            pub = [r for r in replies if r.node_id in public]
            pri = [r for r in replies if r.node_id not in public]
            p = self.params
            if not pub and p.no_public == "error":
                raise ValueError(f"round {server_round}: no public client replied (pfa.no-public = 'error')")
            aggregate, self._subspaces, diagnostics = pfa_plus_aggregate(
                self._updates(pub),
                [r.arrays for r in pri],
                self._epsilons(pub),
                self._epsilons(pri),
                sent,
                k=p.k,
                center=p.center,
                method=p.subspace_method,
                seed=self._round_seed(server_round),
            )
            diagnostics[DIAG_COORDINATE_UPLOADS] = float(len(pri))
            self._diagnostics[server_round] = diagnostics
            new_global = self._apply(aggregate)
        # The subspace travels in the model's dtype; keep exactly what is sent, so that
        # next round's decode (server) inverts the clients' encode with the same numbers.
        self._subspaces = [
            LayerSubspace(sub.basis.astype(g.dtype), None if sub.center is None else sub.center.astype(g.dtype),
                          sub.shape)
            for sub, g in zip(self._subspaces, self._global, strict=True)
        ]
        return new_global
