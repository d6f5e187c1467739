"""GDPFed / GDPFed+ (Xu, Hu & Kotevska 2025, paper 003) and the baselines it compares with.

Algorithm 1, as this module runs it (docs/notes/gdpfed.md §2.4):

    plan (once, after the budget handshake; :func:`strategies.gdpfed_plan.plan_groups`):
        G_m  <- clients grouped by declared ε: the highest threshold of ``group-epsilons`` <= ε_i
        ε_m  <- min_{i∈G_m} ε_i,  δ_m <- min_{i∈G_m} δ_i
        q_m  <- q (GDPFed) | Problem 1 (GDPFed-op/+) | ``sample-rates`` if given
        r_m  <- round(q_m|G_m|) (largest remainder, Σ r_m = round(qn)); q_m <- r_m/|G_m|
        σ_m  <- smallest σ with ε(σ, q_m, T; δ_m) <= ε_m under the run's accountant, the one the
                ledgers charge with (replace-one; privacy.group_calibration.ledger_settings)
        ω_m  <- (1/Σr)·r_m²/Σ r_j²  (Appendix B.2)
    for t = 1..T:
        for each group m:                                  # sample(), node_config()
            S_m^t <- r_m clients of G_m, uniformly without replacement (CSPRNG, never seeded)
            each i ∈ S_m^t: τ local SGD steps, clip Δ to C, add N(0, C²σ_m²/r_m)   (client.group_dp)
            ȳ_m <- Σ_{i∈S_m^t} y_i                          # _group_sum()
            ỹ_m <- Top_k(ȳ_m, k_m)                          # GDPFed+ only (post-processing)
        θ^{t+1} <- θ^t + Σ_m ω_m ỹ_m                        # aggregate_models()

Registered variants (docs/notes/gdpfed.md §2.9, §6): ``dp-fedavg`` (one group at min ε, plain mean),
``gdpfed`` (q_m = q), ``gdpfed-op`` (Problem 1), ``gdpfed-plus`` (Problem 1 + top-k),
``idp-fedavg-scale`` (per-group clip C_m, one noise std s = max_m C_m σ_m for all groups,
so group m's multiplier s/C_m >= σ_m; with ``idp-clips`` empty, C_m ∝ 1/σ_m by IDP's own rule,
:func:`strategies.gdpfed_math.idp_scale_clips`, and s/C_m = σ_m), ``idp-fedavg-sample`` (per-group q_m, one σ =
max_m σ(ε_m, q_m) for all groups) and ``pfa-groups`` (PFA on the three groups: the
strictest group's noisy sum is projected onto the top-``pfa-rank`` subspace of the last
``pfa-history`` noisy sums of the loosest group; the middle group is used as is). PFA's
projection needs only group *sums*, so it composes with secure aggregation (unlike the
original PFA, which needs individual public updates).

Aggregation: per-group sums go through :meth:`GDPFedStrategy._group_sum`, a plaintext sum,
by default: the server is a **trusted aggregator** (it could see individual uploads), which
every result declares. With ``secure-aggregation = "secagg+"`` each group is one secure sum
(:mod:`strategies.secure_sum`) released only with all r_m members, and the server sees
group sums only; it still knows who was sampled, which every result declares too. With
``secure-aggregation = "secagg+ddg"`` each group is one secure sum of distributed discrete Gaussian
shares (Kairouz, Liu & Steinke 2021): every member charges its group's run once by KLS's RDP curve at
the sum's parameters amplified by Poisson sampling at q_m (:class:`privacy.mechanisms.GroupDiscreteGaussianShare`,
:mod:`privacy.poisson_rdp`), and σ_m is calibrated against that charge
(:func:`privacy.group_calibration.ddg_group_noise_multiplier`), so each client spends at most ε_m.

Privacy: each client runs its group's share (:class:`privacy.mechanisms.GroupShare`): it charges
(σ_m, q_m, T) once per run and makes at most T releases in it; the server verifies σ_m, q_m and
T in every reply and recomputes the client's ε from them (the base's ``expected_release`` and
``server_steps``, over the same mechanism). By parallel composition the run is (max_m ε_m, δ)-DP overall
and (ε_m, δ)-DP for group m, client level, under two assumptions the report states: only
group sums are seen, and the sampled set is unknown to the adversary.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Unpack

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from typing_extensions import override

from privacy.group_calibration import ddg_group_noise_multiplier
from protocol import keys
from protocol.train_config import TrainConfig
from strategies.base import AcceptedReply, ClientAccount, PrivacyAwareFedAvg, StrategyOptions
from strategies.gdpfed_config import GDPFedConfig
from strategies.gdpfed_math import lr_at_round, sparsify_top_k
from strategies.gdpfed_plan import VARIANTS, GroupPlan, SigmaRule, group_index, plan_groups
from strategies.secure_sum import SumResult

log = logging.getLogger("privet.strategy")

AGGREGATION = "trusted aggregator"
SECURE_AGGREGATION_NAME = "secure aggregation (SecAgg+, one sum per group)"
TRUST_NOTE = ("assumes the server sees only each group's noisy sum and not who was sampled; this run used a "
              "trusted aggregator (plaintext per-group sums), so the guarantee holds against other clients "
              "and observers of the model, and against the server only if it is trusted with individual "
              "uploads and the sample")
SECURE_TRUST_NOTE = ("assumes the server sees only each group's noisy sum and not who was sampled; this run used "
                     "secure aggregation, so the server saw only the group sums (released only with all r_m noise "
                     "shares), but it chose the sample: against the server the sum of round t is the group's "
                     "mechanism (a Gaussian with multiplier sigma_m, or its discrete Gaussian sum) for every sampled "
                     "member, without the amplification by "
                     "sampling that the charged eps assumes; the charged eps holds against other clients and "
                     "observers of the model")


class GDPFedStrategy(PrivacyAwareFedAvg):
    """Algorithm 1 (module docstring); the variant is a class attribute.

    Parameters
    ----------
    params : GDPFedConfig
        The ``gdpfed.*`` section.
    Other parameters: see PrivacyAwareFedAvg (``dp_mode`` must be ``"update"``).
    """

    variant = VARIANTS["gdpfed"]

    default_dp_mode = keys.DP_UPDATE
    charges_run_once = True

    def __init__(self, params: GDPFedConfig | None = None, **options: Unpack[StrategyOptions]) -> None:
        if options.get("dp_mode", keys.DP_UPDATE) not in (None, keys.DP_UPDATE):
            raise ValueError(f"'dp-mode' must be 'update' (or auto) for {self.variant.name}; "
                             f"found {options.get('dp_mode')!r}")
        super().__init__(**options)
        secure = self.secure_aggregation is not None
        self.aggregation = SECURE_AGGREGATION_NAME if secure else AGGREGATION
        self.guarantee_note = SECURE_TRUST_NOTE if secure else TRUST_NOTE
        self.params = params if params is not None else GDPFedConfig()
        self.plan: GroupPlan | None = None
        self.group_of: dict[int, int] = {}
        self._global: list[np.ndarray] = []
        self._rng = np.random.default_rng(secrets.randbits(128))  # DP randomness: never seeded
        self._public_sums: deque[np.ndarray] = deque(maxlen=self.params.pfa_history)
        self._diagnostics: dict[int, dict[str, float]] = {}
        self._pending_config = ConfigRecord()

    # ------------------------------------------------------------------ plan
    def refuse_declaration(self, account: ClientAccount) -> str | None:
        """Refuse a budget below the first group's threshold, or (after the plan) below its
        group's ε_m (the group's σ_m would exceed that client's budget).
        """
        if self.variant.single_group:
            if self.plan is not None and account.epsilon_budget < self.plan.epsilons[0] * (1 - 1e-9):
                return f"eps={account.epsilon_budget:g} is below the run's calibrated eps={self.plan.epsilons[0]:g}"
            return None
        m = group_index(account.epsilon_budget, self.params.group_epsilons)
        if m is None:
            return (f"eps={account.epsilon_budget:g} is below the first group threshold "
                    f"{self.params.group_epsilons[0]:g} (gdpfed.group-epsilons)")
        if self.plan is not None and account.epsilon_budget < self.plan.epsilons[m] * (1 - 1e-9):
            return f"eps={account.epsilon_budget:g} is below its group's calibrated eps_m={self.plan.epsilons[m]:g}"
        return None

    def _make_plan(self, rounds: int, clip: float, lr: float, local_steps: int) -> None:
        accounts = sorted(self.accounts.values(), key=lambda a: a.node_id)
        plan, assign = plan_groups(self.variant, self.params, [(a.epsilon_budget, a.delta) for a in accounts],
                                   rounds, clip, lr=lr, local_steps=local_steps, accountant=self.accountant,
                                   sigma_rule=self._ddg_sigma_rule(clip))
        self.plan = plan
        self.group_of = {a.node_id: m for a, m in zip(accounts, assign, strict=True)}
        for m in range(len(plan.sizes)):
            log.info("%s group %d: |G|=%d eps=%g q=%.4f (asked %.4f) r=%d sigma=%.4f C=%g omega=%.4g k/d=%g",
                     self.variant.name, m + 1, plan.sizes[m], plan.epsilons[m], plan.sample_rates[m],
                     plan.requested_rates[m], plan.counts[m], plan.sigmas[m], plan.clips[m], plan.weights[m],
                     plan.sparsity[m])

    def _ddg_sigma_rule(self, clip: float) -> SigmaRule | None:
        """σ_m of a ``secagg+ddg`` group: calibrated against the curve step its members charge (None: Gaussian)."""
        secure = self.secure_aggregation
        if secure is None or not secure.ddg:
            return None
        dim = sum(int(np.asarray(a).size) for a in self._global)

        def rule(epsilon: float, delta: float, rate: float, rounds: int, shares: int) -> float:
            return ddg_group_noise_multiplier(epsilon, delta, rate, rounds, clip=clip, dim=dim, bits=secure.bits,
                                              shares=shares, beta=secure.beta,
                                              wrap_probability=secure.wrap_probability)
        return rule

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember θ^t (the aggregation adds to it), then the base round set-up."""
        self._global = [np.asarray(a) for a in arrays.to_numpy_ndarrays()]
        self._pending_config = config
        return super().configure_train(server_round, arrays, config, grid)

    def sample(self, server_round: int, eligible: list[int], attempt: int = 0) -> list[int]:
        """S_m^t: r_m clients of each group, uniformly without replacement, from a CSPRNG."""
        if self.plan is None:
            cfg = TrainConfig.decode(self._pending_config)
            self._make_plan(cfg.num_rounds, cfg.clip, cfg.learning_rate, cfg.local_steps or cfg.local_epochs)
        assert self.plan is not None
        for node in eligible:  # nodes registered after the plan (deployment): their group
            if node not in self.group_of:
                eps = self.accounts[node].epsilon_budget
                self.group_of[node] = 0 if self.variant.single_group else int(
                    group_index(eps, self.params.group_epsilons) or 0)
        chosen: list[int] = []
        for m, r in enumerate(self.plan.counts):
            pool = sorted(n for n in eligible if self.group_of.get(n) == m)
            if len(pool) < r:
                log.warning("round %d: group %d has %d eligible clients, fewer than r_m=%d", server_round, m + 1,
                            len(pool), r)
            picks = self._rng.choice(len(pool), size=min(r, len(pool)), replace=False) if pool else ()
            chosen += [pool[int(i)] for i in picks]
        return sorted(chosen)

    # -------------------------------------------------------------- messages
    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        """The group's mechanism (σ_m, r_m, q_m, T, C_m) and the round's decayed η."""
        assert self.plan is not None
        m = self.group_of[account.node_id]
        base = TrainConfig.decode(config)
        group = replace(base, noise_multiplier=float(self.plan.sigmas[m]), noise_shares=int(self.plan.counts[m]),
                        group_sample_rate=float(self.plan.sample_rates[m]), group_index=m + 1,
                        clip=float(self.plan.clips[m]), num_rounds=int(self.plan.rounds),
                        learning_rate=lr_at_round(base.learning_rate, server_round, self.params.lr_decay))
        return ConfigRecord({**dict(config), **group.encode()})

    # ------------------------------------------------------------ aggregation
    def _group_sum(self, group_replies: Sequence[AcceptedReply]) -> list[np.ndarray]:
        """ȳ_m = Σ_i (θ_i − θ^t) over one group's uploads: a plaintext sum (trusted aggregator).

        With ``secure-aggregation = "secagg+"`` this is not used: each group is one secure sum
        (:meth:`secure_groups`) and :meth:`aggregate_sums` receives ȳ_m without the server
        seeing any single upload.
        """
        total = [np.zeros(g.shape, np.float64) for g in self._global]
        for reply in group_replies:
            for j, (a, g) in enumerate(zip(reply.arrays, self._global, strict=True)):
                total[j] += np.asarray(a, np.float64) - g
        return total

    def post_process(self, server_round: int, m: int, noisy_sum: list[np.ndarray]) -> list[np.ndarray]:
        """ỹ_m from ȳ_m: top-k (GDPFed+), PFA's projection (pfa-groups), or unchanged."""
        assert self.plan is not None
        if self.variant.pfa:
            return self._pfa(m, noisy_sum)
        if self.plan.sparsity[m] < 1.0:
            return sparsify_top_k(noisy_sum, self.plan.sparsity[m])
        return noisy_sum

    def _pfa(self, m: int, noisy_sum: list[np.ndarray]) -> list[np.ndarray]:
        assert self.plan is not None
        top = len(self.plan.sizes) - 1
        flat = np.concatenate([np.ravel(a) for a in noisy_sum])
        if m == top:
            self._public_sums.append(flat)
            return noisy_sum
        if m != 0 or len(self._public_sums) < self.params.pfa_rank:
            return noisy_sum
        _, _, vt = np.linalg.svd(np.stack(list(self._public_sums)), full_matrices=False)
        basis = vt[: self.params.pfa_rank]
        projected = basis.T @ (basis @ flat)
        out, start = [], 0
        for a in noisy_sum:
            out.append(projected[start:start + a.size].reshape(a.shape))
            start += a.size
        return out

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """θ^{t+1} = θ^t + Σ_m ω_m ỹ_m over the groups that replied (plaintext group sums)."""
        assert self.plan is not None
        sums = {}
        for m in range(len(self.plan.sizes)):
            group = [r for r in replies if self.group_of.get(r.node_id) == m]
            if group:
                sums[m] = (len(group), self._group_sum(group))
        return self._step(server_round, sums)

    def secure_groups(self, server_round: int, chosen: list[int]) -> list[list[int]]:
        """One secure sum per budget group: S_m^t."""
        assert self.plan is not None
        return [[n for n in chosen if self.group_of.get(n) == m] for m in range(len(self.plan.sizes))]

    def secure_min_survivors(self, noise_shares: int) -> int:
        """r_m: a group sum carries σ_m only with all r_m noise shares, which is what the
        clients charge (once per run), so a group sum is released only when all r_m survive.
        """
        return noise_shares

    def aggregate_sums(self, server_round: int, sums: list[SumResult]) -> list[np.ndarray]:
        """θ^{t+1} = θ^t + Σ_m ω_m ỹ_m over the released group sums ȳ_m (secure aggregation)."""
        by_group = {self.group_of[r.members[0]]: (len(r.survivors), [np.asarray(a, np.float64) for a in r.total])
                    for r in sums if r.total is not None}
        return self._step(server_round, by_group)

    def _step(self, server_round: int, sums: dict[int, tuple[int, list[np.ndarray]]]) -> list[np.ndarray]:
        """θ^t + η_s·Σ_m ω_m ỹ_m from the group sums ``m -> (inputs, ȳ_m)``; ỹ_m = post_process(ȳ_m).

        η_s is ``gdpfed.server-step`` (1 in the paper's Algorithm 1); a step on released values only.
        """
        assert self.plan is not None
        diag: dict[str, float] = {}
        step = [np.zeros(g.shape, np.float64) for g in self._global]
        order = range(len(self.plan.sizes))
        for m in (reversed(order) if self.variant.pfa else order):  # PFA: the public sum first
            count, total = sums.get(m, (0, []))
            diag[f"gdpfed-group{m + 1}-accepted"] = float(count)
            if not count:
                continue
            y = self.post_process(server_round, m, total)
            for j, a in enumerate(y):
                step[j] += self.plan.weights[m] * a
        self._diagnostics[server_round] = diag
        eta = self.params.server_step
        return [(g.astype(np.float64) + eta * s).astype(g.dtype) for g, s in zip(self._global, step, strict=True)]

    def round_metrics(self, server_round: int) -> dict[str, float]:
        """Accepted replies per group."""
        return self._diagnostics.pop(server_round, {})

    @override
    def summary(self) -> None:
        super().summary()
        log.info("%s: %s; aggregation: %s", self.variant.name, self.params.model_dump(by_alias=True), self.aggregation)

    def describe(self) -> dict[str, Any]:
        """What results.summary.json records about the groups."""
        return {"variant": self.variant.name, "aggregation": self.aggregation,
                "plan": self.plan.as_dict() if self.plan is not None else None}


class DPFedAvg(GDPFedStrategy):
    """Algorithm 2: one group, σ from the strictest ε, sampling q, plain mean of the noisy sum."""

    variant = VARIANTS["dp-fedavg"]


class GDPFed(GDPFedStrategy):
    """GDPFed: per-group σ_m at q_m = q, ω_m reweighting, no sparsification."""

    variant = VARIANTS["gdpfed"]


class GDPFedOp(GDPFedStrategy):
    """GDPFed-op: GDPFed with Problem 1's q_m."""

    variant = VARIANTS["gdpfed-op"]


class GDPFedPlus(GDPFedStrategy):
    """GDPFed+: Problem 1's q_m and per-group magnitude top-k of the noisy sums."""

    variant = VARIANTS["gdpfed-plus"]


class IDPFedAvgScale(GDPFedStrategy):
    """IDP-FedAvg, Scale: per-group clip C_m, one noise std for all groups."""

    variant = VARIANTS["idp-fedavg-scale"]


class IDPFedAvgSample(GDPFedStrategy):
    """IDP-FedAvg, Sample: per-group q_m, one σ for all groups."""

    variant = VARIANTS["idp-fedavg-sample"]


class PFAGroups(GDPFedStrategy):
    """PFA on the three groups, on group sums only (module docstring)."""

    variant = VARIANTS["pfa-groups"]


GDPFED_STRATEGIES: dict[str, type[GDPFedStrategy]] = {
    cls.variant.name: cls
    for cls in (DPFedAvg, GDPFed, GDPFedOp, GDPFedPlus, IDPFedAvgScale, IDPFedAvgSample, PFAGroups)
}
