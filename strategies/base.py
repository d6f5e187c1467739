"""The shared server side every paper's strategy stands on: the hooks a paper overrides.

``PrivacyAwareFedAvg`` is a Flower ``FedAvg`` whose unchanged round loop (``Strategy.start``)
gains, through three collaborators it holds rather than inherits:

* a **client registry** (:class:`strategies.clients.ClientRegistry`): the budget handshake with
  every node seen for the first time, the accounts, refusals, and who is still eligible;
* a **reply book** (:class:`strategies.reply_book.ReplyBook`): every reply validated and
  verified before anything is aggregated (a bad one is dropped with a logged reason and the
  round goes on), the privacy bookkeeping, and one result per round;
* **secure sums** (:class:`strategies.secure_rounds.SecureRounds`), where the run asks for them.

What the server expects of a client's reply is the mechanism it asked that client to run
(:meth:`mechanism`, one object of :mod:`privacy.mechanisms`, the same rule the client uses:
:meth:`protocol.train_config.TrainConfig.mechanism`): the σ it fixed, q and the steps it derives
from public figures, and what the release charges, from which it recomputes each client's ε.

A paper overrides ``aggregate_models`` (its aggregation rule) and, where it needs them,
``node_arrays``, ``node_config``, ``expected_specs``, ``sample``, ``secure_groups``,
``aggregate_sums``, ``refuse_declaration``, ``budget_query`` and ``round_metrics``; the caller's
config is never mutated.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, TypedDict

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from privacy.accountants import DEFAULT_ACCOUNTANT, Charge
from privacy.mechanisms import ExpectedRelease, Mechanism
from protocol import keys
from protocol.budget_query import BudgetQuery
from protocol.dpfedc import DPFedCRound
from protocol.keys import DP_MODES
from protocol.roster import Roster
from protocol.train_config import TrainConfig
from strategies.clients import Admission, ClientAccount, ClientRegistry, Refusal
from strategies.layers import weighted_mean
from strategies.reply_book import AcceptedReply, ReplyBook
from strategies.round_result import RoundResult
from strategies.sampling import seeded_sample
from strategies.secure_rounds import SecureRounds, SumMechanism
from strategies.secure_sum import SecureAggregation, SumResult
from strategies.validation import ArraySpec, specs_of

__all__ = ["AcceptedReply", "ClientAccount", "PrivacyAwareFedAvg", "Refusal", "StrategyOptions"]

log = logging.getLogger("privet.strategy")


class StrategyOptions(TypedDict, total=False):
    """The keyword arguments every privet strategy takes (:class:`PrivacyAwareFedAvg`).

    A subclass declares its own parameters and passes these on typed
    (``**options: Unpack[StrategyOptions]``), so a misspelt or mistyped option is an error for
    mypy and at construction, as with Flower's own strategies.
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
    roster: Roster | None


class PrivacyAwareFedAvg(FedAvg):
    """FedAvg with a budget handshake, budget-aware sampling, verified replies and privacy bookkeeping.

    Parameters
    ----------
    dp_mode : str or None
        ``"dpsgd"``, ``"update"`` or ``"none"``: what clients run; ``None``: the class's
        :attr:`default_dp_mode`.
    noise_shares : int
        m of the ``update`` mode (noise N(0, σ²C²/m) per client).
    accountant : str
        ``"rdp"`` or ``"prv"`` for the server-side recomputation.
    seed : int
        Root seed of the per-round sampling.
    availability_timeout : float
        Seconds to wait for ``min_available_nodes`` before a round proceeds with those connected.
    handshake_timeout : float
        Seconds to wait for handshake replies (the run config's ``round-timeout``).
    max_examples : int
        The run's ``max-examples-per-client`` (0: none): a larger declared count is refused.
    max_epsilon_ratio : float
        Where clients are weighted by their declared ε (:attr:`weights_by_epsilon`), a declaration
        above this many times the median declared ε is refused at the handshake.
    min_accepted : int
        A round with fewer accepted replies fails: no new global model (``min-accepted-clients``).
    message_ttl : float or None
        Time-to-live of every train message: a client refuses an older one before spending anything.
    secure_aggregation : SecureAggregation or None
        Run every round's aggregation as secure sums (:mod:`strategies.secure_sum`): the server
        learns only Σ of each sum's privatised updates, and each member charges σ·√(r_min/m).
    roster : Roster or None
        The federation roster (:mod:`protocol.roster`): nodes are registered only under the client id
        their roster key signs for, and secure sums authenticate every member's keys.

    Other parameters: see ``flwr.serverapp.strategy.FedAvg``.
    """

    #: Whether clients are weighted by their declared ε (WeiAvg, PFA).
    weights_by_epsilon: ClassVar[bool] = False
    #: What its clients run when constructed without ``dp_mode`` (the method's own mode).
    default_dp_mode: ClassVar[str] = keys.DP_SGD
    #: A sentence the report adds to every client's guarantee (GDPFed: who saw the sums).
    guarantee_note: str = ""
    #: Whether its clients pre-charge the whole run at their first release (GDPFed's group share):
    #: a budget spent by that charge does not end their run (they refuse beyond the T they paid for).
    charges_run_once: ClassVar[bool] = False

    def __init__(self, *, dp_mode: str | None = None, noise_shares: int = 1, accountant: str = DEFAULT_ACCOUNTANT,
                 seed: int = 0, fraction_train: float = 1.0, min_train_nodes: int = 2, min_available_nodes: int = 2,
                 availability_timeout: float = 300.0, handshake_timeout: float = 600.0,
                 message_ttl: float | None = None, min_accepted: int = 1, max_examples: int = 0,
                 max_epsilon_ratio: float = 0.0, secure_aggregation: SecureAggregation | None = None,
                 roster: Roster | None = None) -> None:
        dp_mode = dp_mode or self.default_dp_mode
        if dp_mode not in DP_MODES:
            raise ValueError(f"'{keys.DP_MODE}' must be one of {', '.join(DP_MODES)}; found {dp_mode!r}")
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train must be in (0, 1]; found {fraction_train}")
        if noise_shares < 1:
            raise ValueError(f"noise_shares must be >= 1; found {noise_shares}")
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0, min_train_nodes=min_train_nodes,
                         min_evaluate_nodes=0, min_available_nodes=min_available_nodes)
        self.dp_mode, self.noise_shares, self.accountant, self.seed = dp_mode, noise_shares, accountant, seed
        self.availability_timeout = availability_timeout
        self.message_ttl = message_ttl
        self.registry = ClientRegistry(Admission(max_examples, max_epsilon_ratio, self.weights_by_epsilon,
                                                 self.refuse_declaration), handshake_timeout, roster)
        self.book = ReplyBook(self.registry, accountant, min_accepted)
        self.secure_aggregation = secure_aggregation
        self.sums = SecureRounds(secure_aggregation, handshake_timeout, message_ttl, roster) \
            if secure_aggregation else None
        self.global_specs: list[ArraySpec] = []
        self.global_names: list[str] = []
        self.global_arrays: list[np.ndarray] = []
        #: The round's train config as sent to every client (before per-node additions).
        self.train_config = ConfigRecord()
        self._grid: Grid | None = None

    # ------------------------------------------------------------ what reports read
    @property
    def accounts(self) -> dict[int, ClientAccount]:
        """Registered clients by node id."""
        return self.registry.accounts

    @property
    def refused(self) -> dict[int, Refusal]:
        """Nodes refused at the handshake, and why."""
        return self.registry.refused

    @property
    def failed_rounds(self) -> dict[int, str]:
        """Rounds that produced no new global model, and why."""
        return self.book.failed_rounds

    @property
    def round_log(self) -> list[RoundResult]:
        """One result per round that reached aggregation."""
        return self.book.round_log

    def round_result(self, server_round: int) -> RoundResult | None:
        """This round's result, once its replies were read."""
        return self.book.result(server_round)

    # ------------------------------------------------------------------ hooks
    def node_arrays(self, server_round: int, account: ClientAccount, arrays: ArrayRecord) -> ArrayRecord:
        """The arrays sent to one client (default: the global model)."""
        return arrays

    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        """The config sent to one client (default: the shared one); a copy if it changes anything."""
        return config

    def expected_specs(self, server_round: int, account: ClientAccount) -> list[ArraySpec]:
        """What this client's upload must look like (default: the global model's; none inside a secure
        sum, whose masked input is checked on its own).
        """
        return [] if self.secure_aggregation else self.global_specs

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """The paper's aggregation rule. Default: FedAvg, Σ n_k w_k / Σ n_k (McMahan et al.)."""
        return weighted_mean([r.arrays for r in replies], [r.num_examples for r in replies])

    def secure_groups(self, server_round: int, chosen: list[int]) -> list[list[int]]:
        """The disjoint subsets of the round's clients that are each summed securely (default: one)."""
        return [list(chosen)]

    def secure_min_survivors(self, noise_shares: int) -> int:
        """r_min of a sum whose members split the noise into ``noise_shares`` shares
        (default: ``secagg.min-survivors``, 0 meaning all m shares).
        """
        assert self.secure_aggregation is not None
        return self.secure_aggregation.min_survivors or noise_shares

    def aggregate_sums(self, server_round: int, sums: list[SumResult]) -> list[np.ndarray]:
        """The new global model from released secure sums (default: the global model plus the plain
        mean of every survivor's privatised update, Σ_s Σ_i ỹ_i / Σ_s r_s: a secure sum hides the
        example counts FedAvg would weight by).
        """
        count = sum(len(r.survivors) for r in sums)
        total = [sum(np.asarray(r.total[j]) for r in sums if r.total is not None)
                 for j in range(len(self.global_arrays))]
        return [(g.astype(np.float64) + np.asarray(t) / count).astype(g.dtype)
                for g, t in zip(self.global_arrays, total, strict=True)]

    def budget_query(self) -> BudgetQuery:
        """What a client needs to know about the run to answer the handshake (:mod:`protocol.budget_query`)."""
        return BudgetQuery(accountant=self.accountant)

    def refuse_declaration(self, account: ClientAccount) -> str | None:
        """Why this strategy cannot use a well-formed declaration (None: it can), refused at the handshake."""
        return None

    def expected_num_examples(self, account: ClientAccount) -> int:
        """The example count a train reply must claim (default: the handshake's)."""
        return account.num_examples

    def round_metrics(self, server_round: int) -> dict[str, float]:
        """Extra per-round diagnostics a subclass wants in the results (default: none)."""
        return {}

    def sample(self, server_round: int, eligible: list[int], attempt: int = 0) -> list[int]:
        """``max(min_train_nodes, ⌊fraction·|eligible|⌋)`` clients, seeded per round (and ``attempt``),
        drawn over positions in client-id order: the same seed samples the same clients whatever node
        ids the backend gave them.
        """
        if not eligible:
            return []
        size = min(len(eligible), max(self.min_train_nodes, int(self.fraction_train * len(eligible))))
        return seeded_sample(eligible, size, [self.seed, server_round] + ([attempt] if attempt else []),
                             order=self.client_order)

    def client_order(self, node: int) -> tuple[int, str]:
        """Sort key of a registered node by its client id (numeric ids in numeric order)."""
        client_id = self.accounts[node].client_id
        return len(client_id), client_id

    # ------------------------------------------------- the mechanism it asked for
    def mechanism(self, server_round: int, account: ClientAccount) -> Mechanism:
        """The mechanism this client runs in ``server_round`` under the config it is sent.

        Raises
        ------
        ValueError
            If the config is one no client can run (each refuses it).
        """
        record = self.node_config(server_round, account, self.train_config)
        cfg = TrainConfig.decode(record)
        clustering = DPFedCRound.decode(record) if cfg.task == keys.TASK_CLUSTERING else None
        floor = self.secure_min_survivors(cfg.noise_shares) if self.secure_aggregation is not None else None
        ddg = self.sums.ddg_sum(server_round, account.node_id) if self.sums is not None else None
        return cfg.mechanism(num_examples=account.num_examples, delta=account.delta, secure_floor=floor,
                             clustering=clustering, ddg=ddg)

    def expected_release(self, server_round: int, account: ClientAccount) -> ExpectedRelease:
        """What the server derives about this client's reply: its mechanism's σ (if fixed), q and steps."""
        n = self.expected_num_examples(account)
        try:
            return self.mechanism(server_round, account).expected(n)
        except ValueError:  # a config no client can run (each refuses it): nothing more to derive
            return ExpectedRelease(n)

    def server_steps(self, server_round: int, account: ClientAccount, metrics: dict[str, float]) -> list[Charge]:
        """The charge of a verified reply: its mechanism's release at the σ it reports, as the
        ``k``-th release of the run (GDPFed charges its run once; beyond T it allows none).

        Where the round's config derives no mechanism (none was configured), the reply's own
        (σ, q, steps) are all the server has: it books them as claimed.
        """
        sigma = float(metrics.get(keys.NOISE_MULTIPLIER, 0.0))
        try:
            mechanism = self.mechanism(server_round, account)
        except ValueError:
            return [(sigma, float(metrics[keys.SAMPLE_RATE]), int(metrics[keys.LOCAL_STEPS]))]
        return list(mechanism.release(sigma, len(account.rounds)).charges)

    # --------------------------------------------------------------- summary
    def summary(self) -> None:
        """What the strategy is configured to do, as a tree (Flower's style)."""
        lines = [f"{type(self).__name__}:", f"  ├── dp-mode: {self.dp_mode} (noise shares {self.noise_shares})",
                 f"  ├── accountant: {self.accountant}, sampling seed {self.seed}",
                 f"  ├── fraction-train: {self.fraction_train:g} (at least {self.min_train_nodes} clients)",
                 f"  ├── a round needs {self.book.min_accepted} accepted replies",
                 f"  └── aggregation: {self.aggregation_note()}"]
        for line in lines:
            log.info("%s", line)

    def aggregation_note(self) -> str:
        """How this strategy's rounds are aggregated (one phrase)."""
        if self.secure_aggregation is None:
            return "plaintext replies"
        secure = self.secure_aggregation
        if secure.ddg:
            return (f"secure sums of distributed discrete Gaussian shares (SecAgg+ mod 2^{secure.bits}, Shamir "
                    f"threshold {secure.threshold:g} of the members)")
        return (f"secure sums (SecAgg+, {self.secure_aggregation.bits}-bit quantisation, Shamir threshold "
                f"{self.secure_aggregation.threshold:g} of the members)")

    # -------------------------------------------------------- configure_train
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Handshake new nodes, sample eligible ones, build one message per node."""
        self.global_specs, self.global_names = specs_of(arrays), list(arrays.keys())
        self.global_arrays = [np.asarray(a) for a in arrays.to_numpy_ndarrays()]
        self._grid = grid
        nodes = self.registry.wait_for_nodes(grid, self.min_available_nodes, self.availability_timeout)
        seconds = self.registry.handshake(grid, nodes, self.budget_query())
        chosen = self.sample(server_round, self.registry.eligible(nodes))
        self.book.open_round(server_round, chosen, seconds)
        skipped = [self.accounts[n].client_id for n in nodes if n in self.accounts and self.accounts[n].exhausted]
        log.info("round %d: sampled clients %s of %d connected%s", server_round,
                 [self.accounts[n].client_id for n in chosen], len(nodes),
                 f"; exhausted (not scheduled): {skipped}" if skipped else "")
        self.train_config = ConfigRecord({**dict(config), keys.SERVER_ROUND: server_round})
        messages = []
        for node in chosen:
            account = self.accounts[node]
            node_arrays = self.node_arrays(server_round, account, arrays)
            node_cfg = self.node_config(server_round, account, self.train_config)
            self.book.add_bytes_down(server_round, sum(a.nbytes for a in node_arrays.to_numpy_ndarrays()))
            messages.append(Message(RecordDict({keys.ARRAYS: node_arrays, keys.CONFIG: node_cfg}), dst_node_id=node,
                                    message_type=MessageType.TRAIN, ttl=self.message_ttl))
        if self.sums is None:
            return messages
        groups = [g for g in self.secure_groups(server_round, chosen) if g]
        return self.sums.open(grid, server_round, groups, [self._sum_mechanism(server_round, g[0]) for g in groups],
                              self.global_arrays, {m.metadata.dst_node_id: m for m in messages})

    def _sum_mechanism(self, server_round: int, node: int) -> SumMechanism:
        cfg = TrainConfig.decode(self.node_config(server_round, self.accounts[node], self.train_config))
        return SumMechanism(cfg.clip, cfg.noise_multiplier, cfg.noise_shares, self.secure_min_survivors(cfg.noise_shares))

    # -------------------------------------------------------- aggregate_train
    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Read the replies (:class:`ReplyBook`), aggregate with the paper's rule, report the round."""
        replies = list(replies)
        if self.sums is not None:
            return self._aggregate_secure(server_round, replies)
        accepted = self.book.accept(server_round, replies, self)
        failed = self.book.too_few(server_round, len(accepted))
        if failed is not None:
            return None, failed
        start = time.perf_counter()
        aggregated = self.aggregate_models(server_round, accepted)
        return self._new_model(server_round, start, aggregated, accepted)

    def _aggregate_secure(self, server_round: int,
                          replies: list[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Stage 3 of the round's secure sums, the checks a sum can take, ``aggregate_sums``."""
        assert self.sums is not None and self._grid is not None
        inputs, invalid = self.sums.masked_inputs(replies)
        accepted = self.book.accept(server_round, replies, self, invalid)
        entry = self.book.result(server_round)
        assert entry is not None
        kept = {r.node_id for r in accepted}
        start = time.perf_counter()
        released = self.sums.release(self._grid, server_round, {n: v for n, v in inputs.items() if n in kept},
                                     {n: a.client_id for n, a in self.accounts.items()})
        entry.secure_sums, entry.bytes_up = released.report, released.bytes_up
        summed = sum(len(r.survivors) for r in released.sums)
        if not released.sums or summed < self.book.min_accepted:
            entry.aggregation_seconds = time.perf_counter() - start
            return None, self.book.fail(server_round, "no secure sum was released; the global model is unchanged"
                                        if not released.sums else
                                        f"released sums hold fewer than the minimum of {self.book.min_accepted} "
                                        "inputs (min-accepted-clients)")
        aggregated = self.aggregate_sums(server_round, released.sums)
        return self._new_model(server_round, start, aggregated, accepted, {keys.NUM_SUMMED: summed})

    def _new_model(self, server_round: int, start: float, aggregated: Sequence[np.ndarray],
                   accepted: list[AcceptedReply], extra: dict[str, Any] | None = None
                   ) -> tuple[ArrayRecord, MetricRecord]:
        """The round's new global model and its metrics."""
        entry = self.book.result(server_round)
        assert entry is not None
        entry.aggregated(time.perf_counter() - start, self.round_metrics(server_round))
        arrays = ArrayRecord({name: Array(np.asarray(a)) for name, a in zip(self.global_names, aggregated,
                                                                          strict=True)})
        spent = [r.metrics[keys.EPSILON_SPENT] for r in accepted]
        metrics: dict[str, Any] = {keys.NUM_ACCEPTED: len(accepted), keys.NUM_REJECTED: len(entry.rejected),
                                   keys.NUM_DROPPED: len(entry.dropped), **(extra or {}),
                                   keys.MAX_EPSILON_SPENT: float(max(spent)),
                                   keys.MEAN_EPSILON_SPENT: float(np.mean(spent))}
        losses = [x for x in (r.metrics.get(keys.TRAIN_LOSS, math.nan) for r in accepted) if math.isfinite(x)]
        if losses:  # only where clients reported one (their operators opted in): never a made-up 0
            metrics[keys.TRAIN_LOSS] = float(np.mean(losses))
        return arrays, MetricRecord(metrics)
