"""``privet audit``: the empirical privacy of a run config's mechanisms, beside what the ledgers charged.

::

    privet audit                          the embedded default experiment
    privet audit CONFIG.toml --set dp-mode=update --out results/audit
    privet audit --canaries 4000 --confidence 0.99

The audit takes the same configuration as ``privet run`` (defaults < CONFIG < ``--set``, validated
before anything starts), works out which of privet's client mechanisms that run would use, and
runs each of them **in this process** on canaries, through the very objects and functions the
ClientApp runs (:mod:`client.round`): the round's :class:`protocol.train_config.TrainConfig`
(from :func:`server.registry.train_config`, GDPFed's per-node one from the strategy's own
``node_config``), its mechanism (:meth:`TrainConfig.mechanism`), the plan against a fresh
:class:`privacy.ledger.PrivacyLedger` of the client's budget (privet's own calibration: σ is never
recomputed here), the budget check, :meth:`Mechanism.run` with the client's noise source
(:func:`client.seeds.noise_for`), and :meth:`PrivacyLedger.record_release`. Not run: Flower's
messaging, the data set and model of the config, the site floors; the canary "model" is a
stand-in (below). The statistics are :mod:`privacy.auditing`'s via
:func:`privacy.mechanism_audit.assess`: Steinke et al.'s one-run bound and the Clopper–Pearson
threshold tests (a lower bound on ε at ``confidence``), and Andrew et al.'s one-shot estimate.

What each game observes (the adversary of the threat model; white-box: it knows the canary
directions, every public parameter, the run seed and every client's partition id, and deviates
by asking for ``extension`` times the T rounds the run declared):

``update`` (client level)
    Each canary is a client whose update is S·2C·u (u a random unit direction in a stand-in
    update of ``STAND_IN_DIM`` coordinates, S = ±1 secret); it uploads what
    :class:`~privacy.mechanisms.WholeUpdate` releases. The server sees every upload.
``secure-sum`` (client level)
    r_min canary clients (orthonormal directions) per sum, each uploading its
    :class:`~privacy.mechanisms.SecureSumShare`; the server sees only the sum (SecAgg+'s
    unmasking is not run: its output is that sum).
``group-sum`` (client level, GDPFed family)
    One canary of group m per sum, sampled with probability q_m each round (a coin the server
    does not see: the charge's amplification assumes it), beside r_m − 1 members with zero
    updates; every member adds its :class:`~privacy.mechanisms.GroupShare` of the noise. The
    server sees the group sum. The extended run is refused by the canary after the T releases
    it paid for. Where q_m = 1 (no amplification charged) the server also knows which sums the
    canary is in, and scores those only.
``dpsgd`` (record level)
    One client, one run (Steinke et al.): its shard of n records holds m canary records, record
    i with feature 3C on coordinate i of a logistic regression (privet's ``logreg``) and label
    (1 + S_i)/2; the rest are zero-feature fillers. :func:`client.training.train_dpsgd` trains on
    it with the config's q, steps, clip, learning rate and momentum. The server sees each round's
    upload (the model), not the steps inside it.

In every game the server also tries to **regenerate the noise** as a server that knows the run
seed can where ``noise-source = "seeded"`` (:func:`client.seeds.client_seed`): it replays each
client's seeded source, and uses the replay where it explains the upload (the residual is
smaller than the upload). With privet's default ``csprng`` the replay explains nothing.

The flag: a lower bound above the charged ε (at δ, or at a δ' of the privacy profile);
``privet audit`` then exits with status 1 and one line naming the mechanism and both figures.
An audit that is not flagged proves nothing beyond "this attack did not refute the charge".
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from privacy.auditing import DEFAULT_CONFIDENCE, canary_cosines
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger
from privacy.mechanism_audit import AuditResult, Observation, assess
from privacy.mechanisms import LocalWork, Mechanism, Privatizer, Release, Upload, gaussian_noise_like
from privacy.randomness import NoiseSource, noise_source

__all__ = ["AuditReport", "MechanismAudit", "audit", "add_parser", "client_release", "cmd_audit"]

#: Coordinates of the stand-in update of the client-level games (the projection of isotropic
#: Gaussian noise on a canary's direction does not depend on it; the one-shot cosines do).
STAND_IN_DIM: Final = 256
#: The canary's update norm before clipping, in units of C (clipping must act).
CANARY_NORM: Final = 2.0
#: A DP-SGD canary record's feature, in units of C (its gradient's norm exceeds C while the
#: model's probability of its label stays below about 0.76).
RECORD_FEATURE: Final = 3.0
#: Default canaries (client-level: canary clients; record-level: canary records in one shard).
DEFAULT_CANARIES: Final = 1000
#: The deviating server asks for this many times the T rounds the run declared.
DEFAULT_EXTENSION: Final = 2
#: The run id of the audit's ledgers.
RUN_ID: Final = 1

#: A test-only hook: wraps the mechanism each client round would run (None in every real use).
MechanismHook = Callable[[Mechanism], Mechanism]


class AuditConfigError(ValueError):
    """The configuration cannot be audited (one line naming the key)."""


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class MechanismAudit:
    """One mechanism's audit: the statistics and what the game ran and observed.

    Attributes
    ----------
    game : str
        ``update``, ``secure-sum``, ``group-sum`` or ``dpsgd`` (module docstring).
    level : str
        ``client`` or ``record``: what one canary is.
    mechanism : str
        The client mechanism's kind (:attr:`privacy.mechanisms.Mechanism.kind`).
    observes : str
        What the game's adversary sees.
    result : AuditResult
        The bounds, the estimate, the charge and the flag.
    noise_multiplier, sample_rate, clip : float
        σ sent, q of one release, C (as the client's plan set them).
    steps, rounds_declared, rounds_requested, releases_per_canary : int
        Steps per release, T, the rounds the server asked for, the most releases one canary made.
    noise_source : str
        The clients' DP randomness (the config's ``noise-source``).
    """

    game: str
    level: str
    mechanism: str
    observes: str
    result: AuditResult
    noise_multiplier: float
    sample_rate: float
    clip: float
    steps: int
    rounds_declared: int
    rounds_requested: int
    releases_per_canary: int
    noise_source: str

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the charge."""
        return self.result.flagged

    def line(self) -> str:
        """One line naming the mechanism and both figures (:meth:`AuditResult.line`)."""
        return self.result.line()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record."""
        r = self.result
        return {"game": self.game, "level": self.level, "mechanism": self.mechanism, "observes": self.observes,
                "flagged": self.flagged, "line": self.line(), "lower_bound": _finite(r.lower_bound),
                "one_run_bound": _finite(r.one_run_bound), "threshold_bound": _finite(r.threshold_bound),
                "one_shot_epsilon": _finite(r.one_shot_epsilon), "charged_epsilon": r.charged_epsilon,
                "delta": r.delta, "confidence": r.confidence, "canaries": r.canaries, "releases": r.releases,
                "violation": r.violation, "profile": [list(p) for p in r.profile],
                "charged_history": [list(s) for s in r.history], "relation": r.relation, "seconds": r.seconds,
                "noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate, "clip": self.clip,
                "steps": self.steps, "rounds_declared": self.rounds_declared,
                "rounds_requested": self.rounds_requested, "releases_per_canary": self.releases_per_canary,
                "noise_source": self.noise_source}


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True)
class AuditReport:
    """Every audited mechanism of one run config, and what was not audited (with why)."""

    strategy: str
    dp_mode: str
    client: int
    epsilon_budget: float
    audits: tuple[MechanismAudit, ...]
    not_audited: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def flagged(self) -> tuple[MechanismAudit, ...]:
        """The audits whose lower bound exceeds the charge."""
        return tuple(a for a in self.audits if a.flagged)

    def lines(self) -> list[str]:
        """The text report."""
        out = [f"privet audit: {self.strategy}, dp-mode {self.dp_mode}, client {self.client} "
               f"(budget eps={self.epsilon_budget:g}); canary games in this process through privet's client "
               "mechanisms (privet/audit_cmd.py)"]
        for a in self.audits:
            out.append(f"  {a.game} ({a.level} level, mechanism {a.mechanism}, sigma={a.noise_multiplier:.4g}, "
                       f"q={a.sample_rate:.4g}, steps={a.steps}, C={a.clip:g}, T={a.rounds_declared}, server asked "
                       f"for {a.rounds_requested} rounds, a canary released at most {a.releases_per_canary}; "
                       f"noise {a.noise_source})")
            out.append(f"    observes: {a.observes}")
            if a.releases_per_canary == 0:
                out.append("    no canary client released anything (each refused every round): nothing was observed")
            out.append(f"    {a.line()}")
        out += [f"  not audited: {why}" for why in self.not_audited]
        out.append("A lower bound at the stated confidence: above the charge refutes it; below it proves nothing "
                   "beyond 'this attack did not break it'.")
        return out

    def to_dict(self) -> dict[str, Any]:
        """``audit.json``."""
        return {"strategy": self.strategy, "dp_mode": self.dp_mode, "client": self.client,
                "epsilon_budget": _finite(self.epsilon_budget), "flagged": bool(self.flagged),
                "audits": [a.to_dict() for a in self.audits], "not_audited": list(self.not_audited),
                "settings": self.settings}


# --------------------------------------------------------------------------- the client's round
def client_release(mechanism: Mechanism, ledger: PrivacyLedger, *, run_id: int, server_round: int,
                   work: LocalWork, noise: NoiseSource) -> tuple[Upload, Release] | None:
    """The privacy steps of one client round, in :func:`client.round._round`'s order; None: refused.

    Returns the upload and the release as charged.

    plan against the ledger (refused on exhaustion or no σ) → refuse a release the ledger could
    not charge → run → settle → charge (refused, the upload discarded, if the charge fails).
    """
    try:
        release = mechanism.plan(ledger, run_id)
    except (PrivacyBudgetExhausted, ValueError):
        return None
    if mechanism.private and ledger.would_exceed_release(release.charges, run_id, mechanism.ledger_mode):
        return None
    upload = mechanism.run(work, release, noise)
    release = mechanism.settle(release, upload)
    try:
        ledger.record_release(release.charges, server_round=server_round, run_id=run_id, mode=mechanism.ledger_mode)
    except PrivacyBudgetExhausted:
        return None
    return upload, release


@dataclass
class CanaryWork:
    """A client's local work whose trained model is the received one plus a fixed update (the canary)."""

    received: list[np.ndarray]
    update: list[np.ndarray]

    def train(self, privatize: Privatizer | None) -> Upload:
        """"Training" adds the canary update; ``privatize`` is the mechanism's."""
        trained = [r + u for r, u in zip(self.received, self.update, strict=True)]
        if privatize is None:
            return Upload(trained)
        upload, diagnostics = privatize(self.received, trained)
        return Upload(upload, diagnostics)

    def train_dpsgd(self, clip: float, noise_multiplier: float, noise: NoiseSource) -> Upload:
        """Not a DP-SGD work (the record-level game trains a real model)."""
        raise ValueError("a client-level canary has no DP-SGD work")


# --------------------------------------------------------------------------- the setup
@dataclass(frozen=True)
class _Setup:
    run_config: dict[str, Any]
    cfg: Any  # server.config.RunConfig
    strategy: Any  # strategies.base.PrivacyAwareFedAvg
    profile: Any  # client.profile.ClientProfile
    train: Any  # protocol.train_config.TrainConfig of the audited client
    secure_floor: int | None
    group: bool


def _setup(run_config: dict[str, Any], client: int) -> _Setup:
    from client.profile import resolve_profile
    from protocol.train_config import TrainConfig
    from server.config import ConfigError, RunConfig
    from server.registry import build_strategy, train_config
    from strategies.gdpfed import GDPFedStrategy

    try:
        cfg = RunConfig.from_flower(run_config)
    except ConfigError as exc:
        raise AuditConfigError(str(exc)) from None
    if not 0 <= client < cfg.num_clients:
        raise AuditConfigError(f"--client must be in [0, {cfg.num_clients}) ('num-clients'); found {client}")
    config = {k: v for k, v in run_config.items() if k != "roster"}  # the audit runs no secure-sum protocol
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)  # Flower's notes on evaluation settings are not the audit's
    try:
        strategy = build_strategy(RunConfig.from_flower(config))
        profile = resolve_profile({"partition-id": client, "num-partitions": cfg.num_clients}, run_config)
    except ValueError as exc:  # a strategy's or a budget's setting, named in the message
        raise AuditConfigError(str(exc)) from None
    finally:
        flwr_log.setLevel(level)
    record = train_config(cfg)
    group = isinstance(strategy, GDPFedStrategy)
    if group:
        record = _group_config(strategy, cfg, run_config, client, record)
    train = TrainConfig.decode(record)
    secure = strategy.secure_aggregation is not None  # the strategy's rounds run inside secure sums
    floor = max(strategy.secure_min_survivors(train.noise_shares), profile.floors.min_sum_size) if secure else None
    return _Setup(run_config, cfg, strategy, profile, train, floor, group)


def _group_config(strategy: Any, cfg: Any, run_config: dict[str, Any], client: int, record: Any) -> Any:
    """GDPFed's per-node train config of ``client``: the strategy's own plan and ``node_config``."""
    from types import SimpleNamespace

    from client.profile import resolve_profile
    from protocol.train_config import TrainConfig
    from strategies.gdpfed import plan_groups

    budgets = []
    for pid in range(cfg.num_clients):
        p = resolve_profile({"partition-id": pid, "num-partitions": cfg.num_clients}, run_config)
        budgets.append((p.epsilon_budget, p.delta))
    base = TrainConfig.decode(record)
    try:
        plan, assign = plan_groups(strategy.variant, strategy.params, budgets, base.num_rounds, base.clip,
                                   lr=base.learning_rate, local_steps=base.local_steps or base.local_epochs,
                                   accountant=strategy.accountant)
    except ValueError as exc:
        raise AuditConfigError(str(exc)) from None
    strategy.plan = plan
    strategy.group_of = {pid: m for pid, m in enumerate(assign)}
    return strategy.node_config(1, SimpleNamespace(node_id=client), record)


def _ledger(setup: _Setup) -> PrivacyLedger:
    """The client's ledger at the start of the run (fresh: the audit ignores ``ledger-dir``)."""
    return PrivacyLedger(setup.profile.epsilon_budget, setup.profile.delta, accountant=setup.train.accountant)


def _noise(setup: _Setup, partition_id: int, server_round: int) -> NoiseSource:
    from client.seeds import client_seed, noise_for

    profile = replace(setup.profile, partition_id=partition_id, client_id=str(partition_id))
    return noise_for(profile, client_seed(setup.train.seed, partition_id, server_round))


def _replay(setup: _Setup, partition_id: int, server_round: int) -> NoiseSource:
    """What a server that knows the run seed regenerates as ``partition_id``'s noise of ``server_round``."""
    from client.seeds import client_seed

    return noise_source("seeded", client_seed(setup.train.seed, partition_id, server_round))


def _mechanism(setup: _Setup, num_examples: int, hook: MechanismHook | None) -> Mechanism:
    mechanism = setup.train.mechanism(num_examples=num_examples, delta=setup.profile.delta,
                                      secure_floor=setup.secure_floor)
    return hook(mechanism) if hook is not None else mechanism


def _num_examples(setup: _Setup) -> int:
    from client.model_task import count_local_examples
    from protocol.run_settings import RunSettings

    return int(count_local_examples(setup.profile, RunSettings.of(setup.run_config)))


# --------------------------------------------------------------------------- client-level games
def _unit_rows(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    basis, _ = np.linalg.qr(rng.standard_normal((dim, count)))
    return np.asarray(basis.T, dtype=np.float64)


def _charged(ledgers: Sequence[PrivacyLedger]) -> PrivacyLedger:
    """The canary ledger that charged the most (one per distinct history: the canaries' agree but for refusals)."""
    distinct = {tuple(ledger.history): ledger for ledger in ledgers}
    return max(distinct.values(), key=lambda ledger: (ledger.spent(), len(ledger.history)))


def _client_level(setup: _Setup, game: str, *, canaries: int, extension: int, rng: np.random.Generator,
                  hook: MechanismHook | None) -> tuple[Observation, dict[str, Any]]:
    """Canary clients through the configured client-level mechanism (module docstring)."""
    train = setup.train
    num_examples = 1  # the client-level mechanisms' charge does not depend on n
    template = _ledger(setup)
    probe = _mechanism(setup, num_examples, hook)
    shares_per_sum = {"update": 1, "secure-sum": setup.secure_floor or 1, "group-sum": train.noise_shares}[game]
    per_sum = 1 if game == "group-sum" else shares_per_sum  # canaries in one sum
    if per_sum > STAND_IN_DIM:
        raise AuditConfigError(f"a sum of {per_sum} canaries needs more than {STAND_IN_DIM} coordinates")
    sums = -(-canaries // per_sum)
    total = sums * per_sum
    rounds = train.num_rounds * extension
    rate = train.group_sample_rate if game == "group-sum" else 1.0
    clip = probe.clip
    secrets = rng.choice(np.array([-1, 1]), size=total)
    directions = np.zeros((total, STAND_IN_DIM))
    observed = np.zeros((total, STAND_IN_DIM))
    ledgers: list[PrivacyLedger] = []
    sent: list[float] = []
    releases = made_most = 0
    received = [np.zeros(STAND_IN_DIM, dtype=np.float64)]
    zero = [np.zeros(STAND_IN_DIM, dtype=np.float64)]
    for j in range(sums):
        members = range(j * per_sum, (j + 1) * per_sum)
        directions[members.start:members.stop] = _unit_rows(rng, per_sum, STAND_IN_DIM)
        own = {i: copy.deepcopy(template) for i in members}  # each canary client's own ledger
        released = np.zeros(STAND_IN_DIM)
        for t in range(1, rounds + 1):
            total_sum, replayed = np.zeros(STAND_IN_DIM), np.zeros(STAND_IN_DIM)
            shares = 0
            for i in members:  # partition id i: every client of the game has its own
                if game == "group-sum" and rng.random() >= rate:
                    continue  # not sampled this round (the server does not see this coin)
                mechanism = _mechanism(setup, num_examples, hook)
                work = CanaryWork(received, [CANARY_NORM * clip * secrets[i] * directions[i]])
                done = client_release(mechanism, own[i], run_id=RUN_ID, server_round=t, work=work,
                                      noise=_noise(setup, i, t))
                if done is None:
                    continue  # refused: nothing released
                upload, release = done
                sent.append(release.noise_multiplier)
                total_sum += upload.arrays[0] - received[0]
                replayed += _replayed_noise(setup, mechanism, release.noise_multiplier, i, t)
                shares += 1
            if game == "group-sum":  # the other members' shares: the sum always carries r_m of them
                for k in range(shares_per_sum - shares):
                    pid = total + j * shares_per_sum + k
                    mechanism = _mechanism(setup, num_examples, hook)
                    sigma = mechanism.noise_multiplier
                    other = mechanism.run(CanaryWork(received, zero), mechanism.release(sigma), _noise(setup, pid, t))
                    total_sum += other.arrays[0] - received[0]
                    replayed += _replayed_noise(setup, mechanism, sigma, pid, t)
                if shares == 0 and rate >= 1:
                    continue  # no amplification is charged: the server may know the canary was not in this sum
            elif shares == 0 or (game == "secure-sum" and shares < shares_per_sum):
                continue  # too few survivors: the secure sum releases nothing
            residual = total_sum - replayed
            released += residual if np.linalg.norm(residual) < np.linalg.norm(total_sum) else total_sum
            releases += 1
        made_most = max([made_most, *(o.releases_in_run(RUN_ID) for o in own.values())])
        observed[members.start:members.stop] = released
        ledgers += own.values()
    scores = np.einsum("ij,ij->i", observed, directions) / clip
    ledger = _charged(ledgers)
    obs = Observation(secrets, scores, canary_cosines(observed, directions), tuple(ledger.history),
                      "replace-one", releases)
    extras = {"noise_multiplier": float(np.median(sent)) if sent else float(train.noise_multiplier),
              "sample_rate": rate, "clip": clip, "steps": train.num_rounds if game == "group-sum" else 1,
              "rounds_requested": rounds,
              "releases_per_canary": made_most, "mechanism": probe.kind, "accountant": ledger.conversion()}
    return obs, extras


def _replayed_noise(setup: _Setup, mechanism: Mechanism, sigma: float, partition_id: int, server_round: int
                    ) -> np.ndarray:
    """The noise a client added, as a server that knows the run seed regenerates it (σ is public)."""
    shares = int(getattr(mechanism, "noise_shares", 1))
    std = sigma * mechanism.clip / math.sqrt(shares)
    (draw,) = gaussian_noise_like([np.zeros(STAND_IN_DIM)], std, _replay(setup, partition_id, server_round))
    return np.asarray(draw, dtype=np.float64)


# --------------------------------------------------------------------------- record level
def _record_level(setup: _Setup, *, canaries: int, extension: int, rng: np.random.Generator,
                  hook: MechanismHook | None) -> tuple[Observation, dict[str, Any]]:
    """One client's DP-SGD run on a shard holding canary records (module docstring)."""
    import torch

    from client.training import LocalTrainingConfig
    from client.work import ModelWork
    from privacy.mechanisms import dpsgd_expected_batch
    from tasks.datasets import ArrayDataset
    from tasks.model_names import resolve_grad_sample_mode
    from tasks.models import build_model, get_weights, set_weights

    train = setup.train
    n = _num_examples(setup)
    examples, _ = train.dpsgd_workload(n)
    m = min(canaries, examples)
    ledger = _ledger(setup)
    clip = train.clip
    secrets = rng.choice(np.array([-1, 1]), size=m)
    x = np.zeros((examples, 1, 1, m), dtype=np.float32)
    x[np.arange(m), 0, 0, np.arange(m)] = RECORD_FEATURE * clip
    y = np.arange(examples, dtype=np.int64) % 2  # fillers: alternating labels (the bias stays balanced)
    y[:m] = (1 + secrets) // 2
    data = ArrayDataset(x, y, num_classes=2, name="canary-shard")
    model = build_model("logreg", input_shape=(1, 1, m), num_classes=2, seed=0)
    mode = resolve_grad_sample_mode(train.grad_sample_mode, "logreg")
    rounds = train.num_rounds * extension
    released = np.zeros((2, m))
    sigma, rate, steps = float(train.noise_multiplier), 0.0, 0
    releases = 0
    pid = setup.profile.partition_id
    for t in range(1, rounds + 1):
        before = [w.copy() for w in get_weights(model)]
        mechanism = _mechanism(setup, n, hook)
        local = LocalTrainingConfig(epochs=train.local_epochs, steps=train.local_steps, batch_size=train.batch_size,
                                    learning_rate=train.learning_rate, momentum=train.momentum, seed=t)
        torch.manual_seed(t)
        done = client_release(mechanism, ledger, run_id=RUN_ID, server_round=t,
                              work=ModelWork(model, data, local, mode), noise=_noise(setup, pid, t))
        if done is None:
            set_weights(model, before)  # refused: the model it trained (if any) is never sent
            continue
        upload, release = done
        releases += 1
        sigma, rate, steps = release.noise_multiplier, release.sample_rate, release.steps
        seen = upload.arrays[0].astype(np.float64) - before[0]
        replayed = _replayed_dpsgd(setup, t, examples, (2, m), sigma * clip, rate, steps, train,
                                   dpsgd_expected_batch(examples, train.batch_size))
        residual = seen - replayed
        released += residual if np.linalg.norm(residual) < np.linalg.norm(seen) else seen
        set_weights(model, upload.arrays)  # the server sends the upload back as the next model
    scores = (released[1] - released[0]) / clip
    directions = np.zeros((m, 2 * m))
    directions[np.arange(m), m + np.arange(m)] = 1.0
    directions[np.arange(m), np.arange(m)] = -1.0
    cos = canary_cosines(np.concatenate([released[0], released[1]]), directions)
    obs = Observation(secrets, scores, cos, tuple(ledger.history), "replace-one", releases)
    extras = {"noise_multiplier": sigma, "sample_rate": rate, "clip": clip, "steps": steps,
              "rounds_requested": rounds, "releases_per_canary": releases, "mechanism": mechanism.kind,
              "accountant": ledger.conversion(), "records": examples}
    return obs, extras


def _replayed_dpsgd(setup: _Setup, server_round: int, n: int, shape: tuple[int, int], std: float, rate: float,
                    steps: int, train: Any, expected_batch: int) -> np.ndarray:
    """The weight change that a seeded client's DP-SGD noise alone makes, regenerated from the run seed.

    The source is drawn in :func:`client.training.train_dpsgd`'s order (each step: the Poisson
    coin flips, then the weight's and the bias's noise); SGD with momentum β is linear, so the
    noise of step t moves the weights by −η z_t (1 − β^(S−t)) / ((1 − β) B).
    """
    replay = _replay(setup, setup.profile.partition_id, server_round)
    beta, lr = train.momentum, train.learning_rate
    total = np.zeros(shape)
    for t in range(steps):
        replay.uniform(n)
        z = replay.normal(shape, std).astype(np.float32).astype(np.float64)
        replay.normal((shape[0],), std)
        remaining = steps - t
        factor = remaining if beta == 0 else (1 - beta ** remaining) / (1 - beta)
        total -= lr * factor * z / expected_batch
    return total


# --------------------------------------------------------------------------- the audit
GAME_OBSERVES: Final[dict[str, str]] = {
    "update": "every upload of each canary client (one Gaussian release per round, seen alone)",
    "secure-sum": "only the sum of r_min canary clients' uploads, per round (the secure sum's output)",
    "group-sum": "only the group's sum of r_m noise shares per round, the canary in it with probability q_m "
                 "(the server does not see who was sampled; at q_m = 1 it knows which sums hold the canary)",
    "dpsgd": "each round's uploaded model of one client whose shard holds the canary records (not the steps)",
}


def _game_of(kind: str) -> str | None:
    """The canary game of a client mechanism's kind (None: no game for it yet)."""
    from privacy.mechanisms import DPSGD, GroupShare, SecureSumShare, WholeUpdate

    return {WholeUpdate.kind: "update", SecureSumShare.kind: "secure-sum", GroupShare.kind: "group-sum",
            DPSGD.kind: "dpsgd"}.get(kind)


#: What one canary is in each game.
GAME_LEVEL: Final[dict[str, str]] = {"update": "client", "secure-sum": "client", "group-sum": "client",
                                     "dpsgd": "record"}


def _games(setup: _Setup) -> tuple[list[str], list[str]]:
    """The games the config's mechanisms call for, and what is not audited (with why)."""
    from strategies.dpfedc import DPFedC

    train, cfg = setup.train, setup.cfg
    if isinstance(setup.strategy, DPFedC):
        return [], [f"{cfg.strategy}: DP-FedC's centroid release (clustering task) has no canary game yet"]
    if cfg.secure_aggregation == "secagg+ddg":
        return [], ["secagg+ddg: the distributed discrete Gaussian sum has no canary game yet"]
    probe = train.mechanism(num_examples=1, delta=setup.profile.delta, secure_floor=setup.secure_floor)
    if not probe.private:
        return [], [f"dp-mode '{train.dp_mode}': no private mechanism, nothing to audit (the ledger charges "
                    "eps = inf)"]
    game = _game_of(probe.kind)
    if game is None:
        return [], [f"mechanism {probe.kind}: no canary game yet"]
    skipped: list[str] = []
    if setup.group and cfg.secure_aggregation == "none":
        skipped.append("group-sum: without secure aggregation the server also sees each upload, which the "
                       "group's charge does not cover (declared in every GDPFed report)")
    if train.personalization:
        skipped.append(f"personalization '{train.personalization}': the personal part is not modelled")
    return [game], skipped


def audit(config: str | None = None, sets: Sequence[str] = (), *, out: str | Path | None = None,
          client: int = 0, canaries: int = DEFAULT_CANARIES, confidence: float = DEFAULT_CONFIDENCE,
          extension: int = DEFAULT_EXTENSION, seed: int | None = None,
          mechanism_hook: MechanismHook | None = None) -> AuditReport:
    """Audit the mechanisms of a run config (module docstring); writes ``audit.json`` into ``out`` if given.

    Parameters
    ----------
    config, sets : str, sequence of str
        As ``privet run``: an experiment TOML and ``key=value`` overrides.
    out : path, optional
        Where ``audit.json`` goes (created).
    client : int
        The audited client's partition id (its budget, its group).
    canaries : int
        Canary clients (client level) or canary records (record level, at most the shard).
    confidence : float
        Of the lower bounds and the flag.
    extension : int
        The server asks for ``extension`` times the declared T rounds (>= 1).
    seed : int, optional
        The auditor's own randomness (secrets, directions, sampling coins); never the clients' noise.
    mechanism_hook : callable, optional
        **Tests only**: wraps the mechanism of every client round, to check that a broken one is caught.

    Raises
    ------
    privet.cli.CliError
        For a bad configuration or option (one line naming it).
    """
    from privet.run_config import CliError, check_out_dir, load_experiment, validate

    if canaries < 2:
        raise CliError(f"--canaries must be an integer >= 2; found {canaries}")
    if not 0.5 <= confidence < 1:
        raise CliError(f"--confidence must be in [0.5, 1); found {confidence}")
    if extension < 1:
        raise CliError(f"--extension must be an integer >= 1; found {extension}")
    run_config = load_experiment(config, list(sets), None)
    validate(run_config)
    if out is not None:
        check_out_dir(Path(out))
    try:
        setup = _setup(run_config, client)
        games, skipped = _games(setup)
    except AuditConfigError as exc:
        raise CliError(str(exc)) from None
    rng = np.random.default_rng(seed)
    audits = []
    for game in games:
        started = time.perf_counter()
        if GAME_LEVEL[game] == "record":
            obs, extras = _record_level(setup, canaries=canaries, extension=extension, rng=rng, hook=mechanism_hook)
        else:
            obs, extras = _client_level(setup, game, canaries=canaries, extension=extension, rng=rng,
                                        hook=mechanism_hook)
        result = assess(obs, game, delta=setup.profile.delta, confidence=confidence, accountant=extras["accountant"],
                        started=started)
        audits.append(MechanismAudit(
            game=game, level=GAME_LEVEL[game], mechanism=extras["mechanism"],
            observes=GAME_OBSERVES[game], result=result, noise_multiplier=float(extras["noise_multiplier"]),
            sample_rate=float(extras["sample_rate"]), clip=float(extras["clip"]), steps=int(extras["steps"]),
            rounds_declared=setup.train.num_rounds, rounds_requested=int(extras["rounds_requested"]),
            releases_per_canary=int(extras["releases_per_canary"]), noise_source=setup.profile.noise_source))
    report = AuditReport(setup.cfg.strategy, setup.train.dp_mode, client, setup.profile.epsilon_budget,
                         tuple(audits), tuple(skipped),
                         {"canaries": canaries, "confidence": confidence, "extension": extension, "seed": seed,
                          "stand_in_dim": STAND_IN_DIM, "config": config, "set": list(sets)})
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "audit.json").write_text(json.dumps(report.to_dict(), indent=1, default=_json_default))
    return report


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


# --------------------------------------------------------------------------- the command
AUDIT_HELP = """\
Measure each privacy mechanism of a run config empirically: run it on canaries (in this
process, through privet's own client mechanisms, calibration and ledger; no Flower run),
attack what the threat model's adversary sees, and print per mechanism the empirical eps
(a lower bound at --confidence, and Andrew et al.'s one-shot estimate) beside the eps the
ledger charged. Exit status 1, with one line naming the mechanism and both figures, when a
lower bound exceeds the charge; 2 on a bad configuration. Writes audit.json into --out.

Configuration: as privet run (defaults < CONFIG.toml < --set KEY=VALUE).

examples:
  privet audit
  privet audit --set dp-mode=update --set num-server-rounds=2 --out results/audit
  privet audit experiments/baselines/udp-fedavg.toml --canaries 4000"""


def add_parser(sub: Any) -> None:
    """Register ``privet audit`` on the CLI's subparsers."""
    parser = sub.add_parser("audit", help="measure each mechanism's privacy empirically (a lower bound on eps)",
                            description=AUDIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="experiment TOML (keys of [tool.flwr.app.config])")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config key (repeatable)")
    parser.add_argument("--out", help="folder for audit.json")
    parser.add_argument("--client", type=int, default=0, help="partition id of the audited client (default 0)")
    parser.add_argument("--canaries", type=int, default=DEFAULT_CANARIES,
                        help=f"canary clients, or canary records at record level (default {DEFAULT_CANARIES})")
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE,
                        help=f"of the lower bounds (default {DEFAULT_CONFIDENCE})")
    parser.add_argument("--extension", type=int, default=DEFAULT_EXTENSION,
                        help=f"the server asks for this many times the declared rounds (default {DEFAULT_EXTENSION})")
    parser.add_argument("--seed", type=int, help="the auditor's own randomness (never the clients' noise)")
    parser.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """``privet audit``: print the report; 1 with the flagged line(s) on stderr when a charge is refuted.

    A bad configuration or option: one line, status 2 (as :func:`privet.cli.main` prints a ``CliError``;
    caught here too, so that ``python -m privet.cli``, whose ``CliError`` is ``__main__``'s, says the same).
    """
    from privet.run_config import CliError

    try:
        report = audit(args.config, args.set or [], out=args.out, client=args.client, canaries=args.canaries,
                       confidence=args.confidence, extension=args.extension, seed=args.seed)
    except CliError as exc:
        print(f"privet: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()), flush=True)
    if args.out:
        print(f"audit.json: {Path(args.out) / 'audit.json'}")
    for flagged in report.flagged:
        print(f"privet: audit: {flagged.line()}", file=sys.stderr)
    return 1 if report.flagged else 0
