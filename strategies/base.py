"""The shared server side every paper's strategy stands on.

``PrivacyAwareFedAvg`` is a Flower ``FedAvg`` that adds, around the unchanged round loop of
``Strategy.start``:

1. a **budget handshake** (a ``query.budget`` message) with every node seen for the first
   time: its declared (ε, δ), example count and ε already spent;
2. **budget-aware sampling**: a client whose budget is spent (it said so, or a reply put it
   at its budget) is never scheduled again; sampling is seeded per round;
3. **per-node messages** (``node_config`` / ``node_arrays`` hooks) so that methods can send
   each client its own model, basis or target ε;
4. **reply validation** before anything is aggregated (``strategies.validation``): a bad
   reply is dropped with a logged reason and the round goes on with the others;
5. **verification and privacy bookkeeping**: every reported figure the server can derive
   itself is checked (example count against the handshake, σ against the one it set,
   DP-SGD's q and steps against the handshake's n), and the claimed cumulative ε must be
   at least what the verified mechanisms of this run imply under the server's own
   accountant; a reply that fails is rejected with a logged reason. Per client: the ε it
   reports, the server's recomputation, rounds joined, drops and rejections.

Subclasses override ``aggregate_models`` (the paper's aggregation rule) and, where the paper
needs it, ``node_arrays``, ``node_config`` or ``expected_specs``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Sequence, TypedDict

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from privacy.accountants import DEFAULT_ACCOUNTANT, Step, epsilon_of, exceeds_budget
from privacy import dp_modes
from privacy.policy import is_spent
from privacy.secure_sum import quantisation_for
from protocol import keys
from protocol.budget_query import BudgetQuery
from protocol.replies import BudgetDeclaration, TrainReport
from protocol.train_config import TrainConfig
from strategies.secure_sum import (
    SecureAggregation,
    SumResult,
    SumState,
    check_sum,
    collect_messages,
    masked_input,
    open_sums,
    release_sums,
)
from strategies.layers import weighted_mean
from strategies.round_result import RoundResult
from strategies.validation import (
    ArraySpec,
    DeclaredBudget,
    ExpectedRelease,
    specs_of,
    validate_train_reply,
)

#: Relative slack when the claimed cumulative ε is compared with the server's recomputation
#: (both use the same accountant; the slack absorbs float round-off only). Whether an ε is
#: within its budget is one decision everywhere: :func:`privacy.accountants.exceeds_budget`.
CLAIM_RTOL = 1e-6

log = logging.getLogger("privet.strategy")


@dataclass
class ClientAccount:
    """The server's view of one client, keyed by its Flower node id."""

    node_id: int
    client_id: str
    epsilon_budget: float
    delta: float
    num_examples: int
    epsilon_spent: float
    epsilon_at_start: float
    server_history: list[Step] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    dropped_rounds: list[int] = field(default_factory=list)
    rejections: list[tuple[int, str]] = field(default_factory=list)
    exhausted: bool = False
    guarantee_unit: str = "record"
    noise_source: str = "csprng"
    client_evaluation: bool = False
    train_metrics: bool = False

    def declared(self) -> DeclaredBudget:
        return DeclaredBudget(self.epsilon_budget, self.delta, self.epsilon_spent)

    def server_epsilon(self, accountant: str) -> float:
        """ε recomputed by the server from the mechanism parameters the client reported
        (this run only); an independent check on the client's own ledger."""
        return epsilon_of(self.server_history, self.delta, accountant) if self.server_history else 0.0


@dataclass(frozen=True)
class Refusal:
    """A node refused at the handshake: who it said it was, and why."""

    client_id: str
    reason: str
    retry: bool = False  #: it did not answer: asked again at later rounds


@dataclass(frozen=True)
class AcceptedReply:
    """A validated train reply, unpacked."""

    node_id: int
    client_id: str
    arrays: list[np.ndarray]
    metrics: dict[str, float]
    meta: dict[str, str]

    @property
    def num_examples(self) -> int:
        return int(self.metrics[keys.NUM_EXAMPLES])


def spend_statistics(accounts: Iterable[ClientAccount]) -> dict[str, float | int]:
    """Largest and mean cumulative ε over the registered clients with a finite spend."""
    spent = [a.epsilon_spent for a in accounts if math.isfinite(a.epsilon_spent)]
    return {"epsilon_spent_max": max(spent, default=0.0),
            "epsilon_spent_mean": float(np.mean(spent)) if spent else 0.0,
            "num_registered": len(spent)}


def seeded_sample(node_ids: Iterable[int], size: int, seed: Sequence[int],
                  order: Callable[[int], Any] | None = None) -> list[int]:
    """``size`` distinct node ids drawn uniformly with a seeded generator, sorted.

    The draw picks positions in the pool sorted by ``order`` (default: the node id). Node
    ids are uint64: indices are drawn with numpy, never the ids themselves (numpy would
    turn ids above 2**63 into floats and lose digits).
    """
    pool = sorted(node_ids, key=order)
    rng = np.random.default_rng(list(seed))
    return sorted(pool[int(i)] for i in rng.choice(len(pool), size=min(size, len(pool)), replace=False))


#: Timeout of a handshake that only re-asks nodes that did not answer before.
RETRY_HANDSHAKE_SECONDS = 10.0

#: Flower's error codes for replies the SuperLink writes itself when the destination node
#: is gone; such a node is counted as dropped.
_NODE_GONE_ERRORS = (ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE)


class StrategyOptions(TypedDict, total=False):
    """The keyword arguments every privet strategy takes (:class:`PrivacyAwareFedAvg`).

    A subclass declares its own parameters and passes these on typed
    (``**options: Unpack[StrategyOptions]``), so a misspelt or mistyped option is an error
    for mypy and at construction, as with Flower's own strategies.
    """

    dp_mode: str | None
    noise_shares: int
    accountant: str
    seed: int
    fraction_train: float
    min_train_nodes: int
    min_available_nodes: int
    availability_timeout: float
    handshake_timeout: float
    message_ttl: float | None
    min_accepted: int
    max_examples: int
    max_epsilon_ratio: float
    secure_aggregation: SecureAggregation | None


class PrivacyAwareFedAvg(FedAvg):
    """FedAvg with a budget handshake, budget-aware sampling, validation and bookkeeping.

    Parameters
    ----------
    dp_mode : str or None
        ``"dpsgd"``, ``"update"`` or ``"none"``: what clients run (for the report and the
        server-side recomputation of ε); ``None``: the class's :attr:`default_dp_mode`.
    noise_shares : int
        m of the ``update`` mode (noise N(0, σ²C²/m) per client).
    accountant : str
        ``"rdp"`` or ``"prv"`` for the server-side recomputation.
    seed : int
        Root seed of the per-round sampling.
    availability_timeout : float
        Seconds to wait for ``min_available_nodes`` before a round proceeds with those
        connected (Flower's ``sample_nodes`` waits forever).
    handshake_timeout : float
        Seconds to wait for handshake replies (the run config's ``round-timeout``). A node
        that has not answered by then is listed as refused and not asked again this run.
    max_examples : int
        The run's ``max-examples-per-client`` (0: none). An honest client never trains on or
        declares more, so a larger declared example count (which would make FedAvg's weight
        that site's alone) is refused at the handshake.
    max_epsilon_ratio : float
        The run's ``max-epsilon-ratio`` (0: none). Where clients are weighted by their declared
        ε (:attr:`weights_by_epsilon`), a declaration above this many times the median declared
        ε is refused at the handshake: one site could otherwise take almost all of a round's
        weight (ε → 1e300 would even overflow Σε and wreck the model).
    min_accepted : int
        A round with fewer accepted replies fails: no new global model, listed in
        ``failed_rounds`` (the run config's ``min-accepted-clients``).
    message_ttl : float or None
        Time-to-live of every train message (the run config's ``round-timeout``): a client
        refuses a message older than this before spending anything (:mod:`client.app`).
    secure_aggregation : SecureAggregation or None
        Run every round's aggregation as secure sums (:mod:`strategies.secure_sum`): the
        server learns only Σ of each sum's privatised updates, and each member charges
        σ·√(r_min/m) instead of σ/√m. Needs ``update`` mode and a common σ (a fixed
        ``noise-multiplier``); the strategy aggregates sums (:meth:`aggregate_sums`).

    Other parameters: see ``flwr.serverapp.strategy.FedAvg``.
    """

    #: Whether clients are weighted by their declared ε (WeiAvg, PFA): such a strategy refuses a
    #: dominant declaration (``max_epsilon_ratio``) and an infinite one.
    weights_by_epsilon: ClassVar[bool] = False
    #: What its clients run when constructed without ``dp_mode`` (the method's own mode).
    default_dp_mode: ClassVar[str] = keys.DP_SGD
    #: A sentence the report adds to every client's guarantee (GDPFed: who saw the sums).
    guarantee_note: str = ""

    def __init__(
        self,
        *,
        dp_mode: str | None = None,
        noise_shares: int = 1,
        accountant: str = DEFAULT_ACCOUNTANT,
        seed: int = 0,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        availability_timeout: float = 300.0,
        handshake_timeout: float = 600.0,
        message_ttl: float | None = None,
        min_accepted: int = 1,
        max_examples: int = 0,
        max_epsilon_ratio: float = 0.0,
        secure_aggregation: SecureAggregation | None = None,
    ) -> None:
        dp_mode = dp_modes.dp_mode(dp_mode or self.default_dp_mode).name  # a ValueError naming the modes
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train must be in (0, 1]; found {fraction_train}")
        if noise_shares < 1:
            raise ValueError(f"noise_shares must be >= 1; found {noise_shares}")
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=0.0,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=0,
            min_available_nodes=min_available_nodes,
        )
        self.dp_mode = dp_mode
        self.noise_shares = noise_shares
        self.accountant = accountant
        self.seed = seed
        self.availability_timeout = availability_timeout
        self.handshake_timeout = handshake_timeout
        self.message_ttl = message_ttl
        self.min_accepted = min_accepted
        self.max_examples = max_examples
        self.max_epsilon_ratio = max_epsilon_ratio
        #: Nodes refused at the handshake (never scheduled, not asked again): node -> why.
        self.refused: dict[int, Refusal] = {}
        #: Rounds that produced no new global model: round -> why.
        self.failed_rounds: dict[int, str] = {}
        self.accounts: dict[int, ClientAccount] = {}
        #: One :class:`RoundResult` per round that reached aggregation, in order.
        self.round_log: list[RoundResult] = []
        self._global_specs: list[ArraySpec] = []
        self._global_names: list[str] = []
        self._sampled: dict[int, list[int]] = {}
        self._bytes_down: dict[int, int] = {}
        self._handshake_seconds: dict[int, float] = {}
        self._train_config: ConfigRecord = ConfigRecord()
        self.secure_aggregation = secure_aggregation
        self._grid: Grid | None = None
        self._sums: list[SumState] = []
        self._global_arrays: list[np.ndarray] = []

    # ------------------------------------------------------------------ hooks
    def node_arrays(self, server_round: int, account: ClientAccount, arrays: ArrayRecord) -> ArrayRecord:
        """The arrays sent to one client (default: the global model)."""
        return arrays

    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        """The config sent to one client (default: the shared one). Must return a copy
        if it changes anything."""
        return config

    def expected_specs(self, server_round: int, account: ClientAccount) -> list[ArraySpec]:
        """What this client's upload must look like (default: the global model's specs;
        none inside a secure sum, whose input is checked by :func:`masked_input`)."""
        return [] if self.secure_aggregation else self._global_specs

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """The paper's aggregation rule. Default: FedAvg, Σ n_k w_k / Σ n_k (McMahan et al.)."""
        return weighted_mean([r.arrays for r in replies], [r.num_examples for r in replies])

    def secure_groups(self, server_round: int, chosen: list[int]) -> list[list[int]]:
        """The disjoint subsets of the round's clients that are each summed securely
        (default: one sum of all of them)."""
        return [list(chosen)]

    def aggregate_sums(self, server_round: int, sums: list[SumResult]) -> list[np.ndarray]:
        """The new global model from released secure sums (default: the global model plus
        the plain mean of every survivor's privatised update, Σ_s Σ_i ỹ_i / Σ_s r_s: a
        secure sum hides the example counts FedAvg would weight by)."""
        count = sum(len(r.survivors) for r in sums)
        total = [sum(np.asarray(r.total[j]) for r in sums if r.total is not None) for j in range(len(self._global_arrays))]
        return [(g.astype(np.float64) + np.asarray(t) / count).astype(g.dtype) for g, t in zip(self._global_arrays, total)]

    def budget_query(self) -> BudgetQuery:
        """The budget query's config (:mod:`protocol.budget_query`): what a client needs to know
        about the run to answer it, so that it never has to read a strategy's name."""
        return BudgetQuery(accountant=self.accountant)

    def expected_num_examples(self, account: ClientAccount) -> int:
        """The example count a train reply must claim (default: the handshake's)."""
        return account.num_examples

    def expected_release(self, server_round: int, account: ClientAccount) -> ExpectedRelease:
        """What the server can derive about this client's next train reply (module doc)."""
        n = self.expected_num_examples(account)
        mode = dp_modes.dp_mode(self.dp_mode)
        if not mode.private:
            return ExpectedRelease(n, 0.0, 1.0, 1)
        try:
            cfg = TrainConfig.decode(self.node_config(server_round, account, self._train_config))
        except ValueError:  # a config no client can run (each refuses it): nothing more to derive
            return ExpectedRelease(n)
        sigma = cfg.noise_multiplier if cfg.noise_multiplier > 0 else None
        if mode.per_record and cfg.personalization:  # the workload depends on the scheme
            return ExpectedRelease(n, sigma)
        rate, steps = mode.release(n, cfg.batch_size, cfg.local_epochs, cfg.local_steps)
        return ExpectedRelease(n, sigma, rate, steps)

    def round_metrics(self, server_round: int) -> dict[str, float]:
        """Extra per-round diagnostics a subclass wants in the results (default: none)."""
        return {}

    # --------------------------------------------------------------- summary
    def summary(self) -> None:
        log.info("%s: dp-mode=%s noise-shares=%d accountant=%s fraction-train=%.2f seed=%d",
                 type(self).__name__, self.dp_mode, self.noise_shares, self.accountant,
                 self.fraction_train, self.seed)

    # ------------------------------------------------------------- handshake
    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.availability_timeout
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= self.min_available_nodes or time.monotonic() > deadline:
                if len(nodes) < self.min_available_nodes:
                    log.warning("only %d of %d nodes connected after %.0fs; going on with them",
                                len(nodes), self.min_available_nodes, self.availability_timeout)
                return nodes
            log.info("waiting for nodes: %d connected, %d required", len(nodes), self.min_available_nodes)
            time.sleep(1.0)

    def refuse_declaration(self, account: ClientAccount) -> str | None:
        """Why this strategy cannot use a well-formed declaration (``None``: it can).

        Strategies that weight or calibrate by declared budgets refuse the ones they cannot
        use here, at the handshake, rather than failing mid-run.
        """
        return None

    def _refuse(self, node: int, client_id: str, reason: str, retry: bool = False) -> None:
        if node not in self.refused:
            log.warning("handshake: %s (node %d) refused: %s", client_id, node, reason)
        self.refused[node] = Refusal(client_id, reason, retry)

    def handshake(self, grid: Grid, node_ids: Iterable[int]) -> None:
        """Ask every node not seen before for its budget; register those that answer.

        A node is refused (listed in the summary and report with the reason, never
        scheduled, not asked again) when it answers with an error (e.g. a malformed node
        config), declares a malformed or invalid budget, one this strategy cannot use
        (:meth:`refuse_declaration`), or a ``client-id`` another node already holds. A node
        that does not answer within ``handshake_timeout`` (hung, restarting, unreachable) is
        listed too, but asked again at later rounds with a short timeout
        (``RETRY_HANDSHAKE_SECONDS``), so a hung site costs little and a restarted one rejoins.
        """
        node_ids = list(node_ids)
        new = [n for n in node_ids if n not in self.accounts and n not in self.refused]
        retry = [n for n in node_ids if n in self.refused and self.refused[n].retry]
        if not new and not retry:
            return
        timeout = self.handshake_timeout if new else min(self.handshake_timeout, RETRY_HANDSHAKE_SECONDS)
        config = self.budget_query().encode()
        messages = [
            Message(RecordDict({keys.CONFIG: config}), dst_node_id=n,
                    message_type=f"{MessageType.QUERY}.{keys.QUERY_BUDGET}")
            for n in new + retry
        ]
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        # the grid gives each message its id when it sends it; a reply the SuperLink writes for
        # an unavailable node comes from the SuperLink, so map replies back by that id
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
        for reply in replies:
            node = asked.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if reply.has_error():
                if reply.error.code not in _NODE_GONE_ERRORS:  # gone: counted as unanswered below
                    self._refuse(node, f"node-{node}", reply.error.reason or f"error code {reply.error.code}")
                continue
            try:
                declared = BudgetDeclaration.decode(reply.content)
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                self._refuse(node, f"node-{node}", f"malformed budget declaration ({exc})")
                continue
            account = ClientAccount(
                node_id=node, client_id=declared.client_id, epsilon_budget=declared.epsilon_budget,
                delta=declared.delta, num_examples=declared.num_examples, epsilon_spent=declared.epsilon_spent,
                epsilon_at_start=declared.epsilon_spent, guarantee_unit=declared.guarantee_unit,
                noise_source=declared.noise_source, client_evaluation=declared.client_evaluation,
            )
            if not (account.epsilon_budget > 0 and 0 < account.delta < 1
                    and math.isfinite(account.epsilon_spent) and account.epsilon_spent >= 0):
                self._refuse(node, account.client_id, f"invalid budget declaration (eps={account.epsilon_budget}, "
                             f"delta={account.delta}, spent={account.epsilon_spent})")
                continue
            holder = next((a for a in self.accounts.values() if a.client_id == account.client_id), None)
            if holder is not None:
                why: str | None = f"client-id {account.client_id!r} is already held by node {holder.node_id}"
            elif self.max_examples and account.num_examples > self.max_examples:
                why = (f"declares {account.num_examples} examples, more than the run's max-examples-per-client "
                       f"({self.max_examples}) that an honest client trains on")
            else:
                why = self.refuse_declaration(account)
            if why:
                self._refuse(node, account.client_id, why)
                continue
            account.exhausted = is_spent(account.epsilon_spent, account.epsilon_budget)
            self.accounts[node] = account
            self.refused.pop(node, None)
            log.info("handshake: client %s (node %d) eps=%g delta=%g spent=%.4f n=%d",
                     account.client_id, node, account.epsilon_budget, account.delta,
                     account.epsilon_spent, account.num_examples)
        self._refuse_dominant([self.accounts[n] for n in new + retry if n in self.accounts])
        for node in new + retry:
            if node not in self.accounts and (node not in self.refused or self.refused[node].retry):
                self._refuse(node, f"node-{node}", f"no answer to the budget handshake within {timeout:g}s "
                             "(asked again at later rounds)", retry=True)

    def _refuse_dominant(self, batch: list[ClientAccount]) -> None:
        """Refuse, from a handshake batch, each declared ε above ``max_epsilon_ratio`` × the
        median declared ε of every registered client (ε-weighted strategies only)."""
        if not (self.weights_by_epsilon and self.max_epsilon_ratio > 0 and batch):
            return
        median = float(np.median([a.epsilon_budget for a in self.accounts.values()]))
        for account in batch:
            if account.epsilon_budget > self.max_epsilon_ratio * median:
                del self.accounts[account.node_id]
                self._refuse(account.node_id, account.client_id,
                             f"declared eps={account.epsilon_budget:g} is more than max-epsilon-ratio="
                             f"{self.max_epsilon_ratio:g} times the median declared eps ({median:g}); "
                             f"{type(self).__name__} weights clients by eps, so this site would take nearly "
                             "all of a round's weight (the operator may raise max-epsilon-ratio)")

    # -------------------------------------------------------------- sampling
    def eligible(self, node_ids: Iterable[int]) -> list[int]:
        """Connected, registered clients whose budget is not spent."""
        return [n for n in node_ids if n in self.accounts and not self.accounts[n].exhausted]

    def sample(self, server_round: int, eligible: list[int], attempt: int = 0) -> list[int]:
        """Sample ``max(min_train_nodes, ⌊fraction·|eligible|⌋)`` clients, seeded per round
        (and per ``attempt``, for strategies that redraw a sample)."""
        if not eligible:
            return []
        size = min(len(eligible), max(self.min_train_nodes, int(self.fraction_train * len(eligible))))
        # positions in client-id order: the same seed samples the same clients whatever node ids
        # the backend gave them (the in-process backend, Ray simulation and a deployment differ)
        return seeded_sample(eligible, size, [self.seed, server_round] + ([attempt] if attempt else []),
                             order=self.client_order)

    def client_order(self, node: int) -> tuple[int, str]:
        """Sort key of a registered node by its client id (numeric ids in numeric order): samples
        drawn over positions in this order are the same clients whatever node ids the backend
        gave them (the in-process backend, Ray simulation and a deployment differ)."""
        client_id = self.accounts[node].client_id
        return len(client_id), client_id

    # -------------------------------------------------------- configure_train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Handshake new nodes, sample eligible ones, build one message per node."""
        self._global_specs = specs_of(arrays)
        self._global_names = list(arrays.keys())
        nodes = self._wait_for_nodes(grid)
        started = time.perf_counter()
        self.handshake(grid, nodes)
        self._handshake_seconds[server_round] = time.perf_counter() - started
        chosen = self.sample(server_round, self.eligible(nodes))
        self._sampled[server_round] = chosen
        skipped = [self.accounts[n].client_id for n in nodes if n in self.accounts and self.accounts[n].exhausted]
        log.info("round %d: sampled clients %s of %d connected%s", server_round,
                 [self.accounts[n].client_id for n in chosen], len(nodes),
                 f"; exhausted (not scheduled): {skipped}" if skipped else "")
        config[keys.SERVER_ROUND] = server_round
        self._train_config = config
        messages, bytes_down = [], 0
        for node in chosen:
            account = self.accounts[node]
            node_arrays = self.node_arrays(server_round, account, arrays)
            node_cfg = self.node_config(server_round, account, config)
            bytes_down += sum(a.nbytes for a in node_arrays.to_numpy_ndarrays())
            messages.append(
                Message(RecordDict({keys.ARRAYS: node_arrays, keys.CONFIG: node_cfg}),
                        dst_node_id=node, message_type=MessageType.TRAIN, ttl=self.message_ttl)
            )
        self._bytes_down[server_round] = bytes_down
        self._grid = grid
        if self.secure_aggregation is not None:
            self._global_arrays = [np.asarray(a) for a in arrays.to_numpy_ndarrays()]
            return self._open_secure_sums(server_round, chosen, messages, grid)
        return messages

    def _open_secure_sums(self, server_round: int, chosen: list[int], messages: list[Message],
                          grid: Grid) -> list[Message]:
        """Stages 0–1 of this round's secure sums; the train messages become stage 2."""
        assert self.secure_aggregation is not None
        groups = [g for g in self.secure_groups(server_round, chosen) if g]
        d = sum(a.size for a in self._global_arrays)
        quantisations, floors = [], []
        for group in groups:
            clip, noise_std, shares = self._sum_mechanism(server_round, group[0])
            quantisations.append(quantisation_for(clip, noise_std, d, len(group), self.secure_aggregation.bits,
                                                  self.secure_aggregation.clip_probability))
            floors.append(self.secure_min_survivors(shares))
        self._sums = open_sums(grid, groups, quantisations, floors, self.secure_aggregation,
                               timeout=self.handshake_timeout, ttl=self.message_ttl)
        return collect_messages(self._sums, {m.metadata.dst_node_id: m for m in messages})

    # -------------------------------------------------------- aggregate_train
    def _server_steps(self, metrics: dict[str, float]) -> list[Step]:
        """The charge of a validated reply under the run's DP mode (:mod:`privacy.dp_modes`)."""
        mode = dp_modes.dp_mode(self.dp_mode)
        sigma = float(metrics.get(keys.NOISE_MULTIPLIER, 0.0))
        # an update seen only inside a secure sum of >= r_min inputs is charged sigma*sqrt(r_min/m)
        r_min = self.secure_min_survivors(self.noise_shares) if self.secure_aggregation is not None else None
        charged = mode.charged(sigma, self.noise_shares, r_min)
        if mode.per_record:  # DP-SGD: the q and steps the reply reports, checked against expected_release
            return [(charged, float(metrics[keys.SAMPLE_RATE]), int(metrics[keys.LOCAL_STEPS]))]
        return [(charged, 1.0, 1)]

    def server_steps(self, account: ClientAccount, metrics: dict[str, float]) -> list[Step]:
        """The mechanisms a validated reply adds to this client's server-side history
        (default: what its reported σ, q and steps imply under the run's DP mode).
        Strategies whose clients charge a whole-run mechanism once (GDPFed) override it."""
        return self._server_steps(metrics)

    def _check_claimed_epsilon(self, account: ClientAccount, metrics: dict[str, float],
                               steps: list[Step]) -> str | None:
        """The claimed cumulative ε against the server's own recomputation of this run.

        The verified mechanisms of this run alone imply ε_run (server's accountant); a
        client's cumulative ε can only be larger (earlier runs, rounds whose reply was
        lost), never smaller, and never above its budget.
        """
        try:
            implied = epsilon_of([*account.server_history, *steps], account.delta, self.accountant)
        except ValueError as exc:
            return f"its mechanism cannot be accounted ({exc})"
        claimed = metrics[keys.EPSILON_SPENT]
        if claimed < implied * (1.0 - CLAIM_RTOL) - 1e-12:
            return (f"claimed spent eps={claimed:.6g} is below the {implied:.6g} that its reported mechanisms "
                    f"(sigma, q, steps) imply under the server's {self.accountant} accountant")
        if exceeds_budget(implied / (1.0 + CLAIM_RTOL), account.epsilon_budget):
            return f"its reported mechanisms imply eps={implied:.6g}, above its budget {account.epsilon_budget:g}"
        return None

    def accept_replies(self, server_round: int, replies: Iterable[Message],
                       invalid: dict[int, str] | None = None) -> list[AcceptedReply]:
        """Validate every reply; book-keep errors, rejections, drops and privacy spending.
        ``invalid``: nodes whose reply the caller already found unusable, and why."""
        replies = list(replies)
        invalid = invalid or {}
        sampled = set(self._sampled.get(server_round, []))
        replied: set[int] = set()
        accepted: list[AcceptedReply] = []
        rejected: list[dict[str, str]] = []
        for reply in replies:
            if reply.has_error() and reply.error.code in _NODE_GONE_ERRORS:
                continue  # written by the SuperLink for a vanished node: counted as dropped below
            node = reply.metadata.src_node_id
            replied.add(node)
            account = self.accounts.get(node)
            name = account.client_id if account else f"node-{node}"
            if account is None:
                rejected.append({"client": name, "reason": "reply from a node that never did the handshake"})
                continue
            if reply.has_error():
                refusal = reply.error.reason or f"error code {reply.error.code}"
                if refusal.startswith(keys.BUDGET_EXHAUSTED):
                    account.exhausted = True
                account.rejections.append((server_round, refusal))
                rejected.append({"client": name, "reason": refusal})
                log.warning("round %d: client %s replied with an error: %s", server_round, name, refusal)
                continue
            reason: str | None = invalid.get(node) or validate_train_reply(
                reply.content, self.expected_specs(server_round, account), account.declared(),
                self.expected_release(server_round, account))
            report = None if reason else TrainReport.decode(reply.content.metric_records[keys.METRICS])
            metrics = report.as_dict() if isinstance(report, TrainReport) else {}
            steps: list[Step] = self.server_steps(account, metrics) if reason is None else []
            reason = reason or self._check_claimed_epsilon(account, metrics, steps)
            if reason:
                account.rejections.append((server_round, reason))
                rejected.append({"client": name, "reason": reason})
                log.warning("round %d: rejected reply of client %s: %s", server_round, name, reason)
                continue
            meta = dict(reply.content[keys.META]) if keys.META in reply.content.config_records else {}
            account.epsilon_spent = metrics[keys.EPSILON_SPENT]
            account.rounds.append(server_round)
            account.server_history.extend(steps)
            account.guarantee_unit = str(meta.get(keys.GUARANTEE_UNIT, account.guarantee_unit))
            account.train_metrics = str(meta.get(keys.TRAIN_METRICS, "off")) == "on"
            if is_spent(account.epsilon_spent, account.epsilon_budget):
                account.exhausted = True
            accepted.append(AcceptedReply(node, account.client_id,
                                          reply.content.array_records[keys.ARRAYS].to_numpy_ndarrays(), metrics,
                                          {k: str(v) for k, v in meta.items()}))
        dropped = sorted(sampled - replied)
        for node in dropped:
            self.accounts[node].dropped_rounds.append(server_round)
            log.warning("round %d: client %s dropped out (no reply)", server_round, self.accounts[node].client_id)
        self.round_log.append(RoundResult(
            round=server_round,
            sampled=[self.accounts[n].client_id for n in sorted(sampled)],
            accepted=[r.client_id for r in accepted],
            rejected=rejected,
            dropped=[self.accounts[n].client_id for n in dropped],
            handshake_seconds=self._handshake_seconds.get(server_round, 0.0),
            bytes_down=self._bytes_down.get(server_round, 0),
            bytes_up=int(sum(a.nbytes for r in accepted for a in r.arrays)),
            # O(sampled) per round: the sampled clients' spend, and statistics over everyone
            epsilon_spent={self.accounts[n].client_id: self.accounts[n].epsilon_spent
                           for n in sorted(sampled) if n in self.accounts},
            spend=spend_statistics(self.accounts.values()),
        ))
        return accepted

    def round_result(self, server_round: int) -> RoundResult | None:
        """This round's result, once its replies were read (``None`` before, or for a round that
        never reached aggregation)."""
        return next((r for r in reversed(self.round_log) if r.round == server_round), None)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate, aggregate with ``aggregate_models``, and report the round."""
        if self.secure_aggregation is not None:
            return self._aggregate_secure(server_round, replies)
        accepted = self.accept_replies(server_round, replies)
        entry = self.round_log[-1]
        if len(accepted) < self.min_accepted:
            why = (f"{len(accepted)} accepted replies, fewer than the minimum of {self.min_accepted} "
                   f"(min-accepted-clients); the global model is unchanged")
            self.failed_rounds[server_round] = why
            entry.fail(why)
            log.error("round %d failed: %s", server_round, why)
            return None, MetricRecord({"num-accepted": len(accepted), "num-rejected": len(entry.rejected),
                                       "num-dropped": len(entry.dropped)})
        start = time.perf_counter()
        aggregated = self.aggregate_models(server_round, accepted)
        entry.aggregated(time.perf_counter() - start, self.round_metrics(server_round))
        arrays = ArrayRecord({name: Array(np.asarray(a)) for name, a in zip(self._global_names, aggregated)})
        spent = [r.metrics[keys.EPSILON_SPENT] for r in accepted]
        losses = [r.metrics.get(keys.TRAIN_LOSS, math.nan) for r in accepted]
        finite_losses = [x for x in losses if math.isfinite(x)]
        metrics = MetricRecord({
            "num-accepted": len(accepted),
            "num-rejected": len(entry.rejected),
            "num-dropped": len(entry.dropped),
            "max-epsilon-spent": float(max(spent)),
            "mean-epsilon-spent": float(np.mean(spent)),
            keys.TRAIN_LOSS: float(np.mean(finite_losses)) if finite_losses else 0.0,
        })
        return arrays, metrics

    # ------------------------------------------------------ secure aggregation
    def secure_min_survivors(self, noise_shares: int) -> int:
        """r_min of a sum whose members split the noise into ``noise_shares`` shares
        (default: ``secagg.min-survivors``, 0 meaning all m shares)."""
        assert self.secure_aggregation is not None
        return self.secure_aggregation.min_survivors or noise_shares

    def _sum_mechanism(self, server_round: int, node: int) -> tuple[float, float, int]:
        """(C, per-client noise std C·σ/√m, m) of the sum ``node`` belongs to."""
        cfg = TrainConfig.decode(self.node_config(server_round, self.accounts[node], self._train_config))
        return cfg.clip, cfg.clip * cfg.noise_multiplier / math.sqrt(cfg.noise_shares), cfg.noise_shares

    def _aggregate_secure(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Stage 3 of the round's secure sums, the checks a sum can take, ``aggregate_sums``."""
        replies = list(replies)
        shapes = [a.shape for a in self._global_arrays]
        modulus = {n: s.quantisation.modulus for s in self._sums for n in s.members}
        inputs: dict[int, list[np.ndarray]] = {}
        invalid: dict[int, str] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error() or node not in modulus:
                continue
            got = masked_input(reply, shapes, modulus[node])
            if isinstance(got, str):
                invalid[node] = got
            else:
                inputs[node] = got
        accepted = self.accept_replies(server_round, replies, invalid)
        entry = self.round_log[-1]
        kept = {r.node_id for r in accepted}
        start = time.perf_counter()
        assert self._grid is not None
        results = release_sums(self._grid, self._sums, {n: v for n, v in inputs.items() if n in kept}, shapes,
                               timeout=self.handshake_timeout, ttl=self.message_ttl)
        released, report = [], []
        for result, state in zip(results, self._sums):
            clip, noise_std, _ = self._sum_mechanism(server_round, state.members[0])
            why = check_sum(result, clip, noise_std, state.quantisation.step)
            if why:
                log.warning("round %d: secure sum %d not used: %s", server_round, result.index, why)
            else:
                released.append(result)
            report.append({"members": [self.accounts[n].client_id for n in result.members],
                           "survivors": len(result.survivors), "released": why is None, "reason": why or "",
                           "clip_range": state.quantisation.clipping_range, "bits": self.secure_aggregation.bits
                           if self.secure_aggregation else 0, "modulus_bits": state.quantisation.modulus.bit_length() - 1})
        entry.secure_sums = report
        entry.bytes_up = int(sum(a.nbytes for n in kept if n in inputs for a in inputs[n]))
        if not released or sum(len(r.survivors) for r in released) < self.min_accepted:
            why = "no secure sum was released; the global model is unchanged" if not released else (
                f"released sums hold fewer than the minimum of {self.min_accepted} inputs (min-accepted-clients)")
            self.failed_rounds[server_round] = why
            entry.fail(why)
            entry.aggregation_seconds = time.perf_counter() - start
            log.error("round %d failed: %s", server_round, why)
            return None, MetricRecord({"num-accepted": len(accepted), "num-rejected": len(entry.rejected),
                                       "num-dropped": len(entry.dropped)})
        aggregated = self.aggregate_sums(server_round, released)
        entry.aggregated(time.perf_counter() - start, self.round_metrics(server_round))
        arrays = ArrayRecord({name: Array(np.asarray(a)) for name, a in zip(self._global_names, aggregated)})
        spent = [r.metrics[keys.EPSILON_SPENT] for r in accepted]
        return arrays, MetricRecord({
            "num-accepted": len(accepted), "num-rejected": len(entry.rejected),
            "num-dropped": len(entry.dropped), "num-summed": sum(len(r.survivors) for r in released),
            "max-epsilon-spent": float(max(spent)), "mean-epsilon-spent": float(np.mean(spent)),
        })
