"""``privet audit --runtime flower``: canary clients inside a real run of the configured strategy.

::

    privet audit CONFIG.toml --runtime flower --canaries 300 --out results/audit-flower

The in-process games (:mod:`privet.audit_cmd`) run the client's mechanism objects on their own.
This audit runs **the run itself**: :func:`server.app.run_experiment` (what ``privet run --backend
inprocess`` runs: the configured strategy, its sampling, handshake, aggregation, evaluation and
results) on an in-process Flower grid whose every node is the real ClientApp (:data:`client.app.app`,
its mods included), each message crossing Flower's wire format (protobuf) both ways. Beside the
``num-clients`` real clients of the config it starts ``--canaries`` **canary clients**: nodes whose own
node config (``audit-canary-seed``, ``-sign``, ``-norm``; :func:`client.work.canary_update`), never
anything the server sends, makes their round release S·B·u instead of training: u a random unit
direction over the whole model drawn from the canary's secret seed, B = 2C (clipping acts) and S = ±1
the auditor's secret coin. Each canary runs the whole client round (:mod:`client.round`): its own
ledger, calibration, budget check, noise source and charge; its budget and δ are those of the
audited client (``--client``), given in its node config as a deployed site's are.

Two adversaries of the threat model are attacked, each against the charge of the canaries' real
ledgers as they stand after the run (read from the nodes' state):

``upload`` (white-box, the server's view)
    Every train reply a canary sends, as the server's strategy receives it (recorded where the
    strategy's grid hands it over): the canary's score is Σ_rounds ⟨upload − global model sent, u⟩/C.
    Where ``noise-source = "seeded"`` the server, which knows the run seed and the canary's
    partition id, regenerates the canary's noise (:func:`client.seeds.client_seed`) and subtracts
    it where that explains the upload.
``final-model`` (black-box)
    Only the released global model (``model.npz``): the score is ⟨final − initial model, u⟩/C,
    with everyone else's noise and training in it. Where ``noise-source = "seeded"`` the server also
    regenerates every client's noise, weighted as in FedAvg's mean (n_k / Σ n, public), and removes it
    where that explains the change.

Memory: one observation vector per canary (K × the model's size in float64): small models.

The statistics are :func:`privacy.mechanism_audit.assess` (Steinke et al.'s one-run bound, the
threshold tests, Andrew et al.'s one-shot cosines), as the in-process audit's. Audited: client-level
``update`` mode (:class:`privacy.mechanisms.WholeUpdate`) with its uploads seen one by one; every
other mechanism is refused with one line naming what is not supported (the in-process games cover
them). A flag is a lower bound above the charge: the command exits 1 with one line per flagged view.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from flwr.app import Message
from flwr.clientapp import ClientApp
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage

from privacy.auditing import DEFAULT_CONFIDENCE, canary_cosines
from privacy.ledger import PrivacyLedger
from privacy.mechanism_audit import Observation, assess
from privacy.mechanisms import WholeUpdate, gaussian_noise_like
from privet.audit_flower_report import FlowerAudit, FlowerAuditReport
from privet.audit_games import explained
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys

__all__ = ["DEFAULT_CANARIES", "audit_flower", "cmd_audit_flower"]

#: Canary clients by default (each a node of the run: the run's cost grows with them).
DEFAULT_CANARIES: Final = 300
#: A canary's update norm before clipping, in units of C (clipping must act).
CANARY_NORM: Final = 2.0
#: The run id of the audited run (the canaries' ledgers record it).
RUN_ID: Final = 1

log = logging.getLogger("privet.audit")


# --------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class _Reply:
    """One accepted train reply of any client, as far as a black-box attack on the released model uses it."""

    server_round: int
    partition_id: int
    num_examples: float
    noise_multiplier: float
    like: tuple[tuple[tuple[int, ...], str], ...]  # the upload's layer shapes and dtypes


def _over_the_wire(msg: Message) -> Message:
    """``msg`` serialised to Flower's protobuf and read back, as a SuperNode and the SuperLink exchange it."""
    proto = ProtoMessage()
    proto.ParseFromString(message_to_proto(msg).SerializeToString())
    return message_from_proto(proto)


def _number(value: object, default: float) -> float:
    """A scalar record value as a float (``default`` for a missing or non-scalar one)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


class _AuditGrid(InProcessGrid):
    """The in-process grid (:class:`privet.inprocess.InProcessGrid`), every message crossing Flower's wire
    format, and the server's view of the canaries recorded where the strategy receives it.
    """

    def __init__(self, client_app: ClientApp, node_configs: Sequence[dict[str, Any]], run_config: dict[str, Any],
                 plan: _Plan) -> None:
        super().__init__(client_app, node_configs, run_config, run_id=RUN_ID)
        self.plan = plan
        self.canary_nodes = list(self.contexts)[plan.real_clients:]  # node ids follow the node configs' order
        #: per canary, Σ_rounds (upload − global model sent), the seeded noise removed where the server can
        self.observed: dict[int, np.ndarray | None] = {node: None for node in self.canary_nodes}
        self.sigmas: list[float] = []  # σ of every canary upload
        self.initial: list[np.ndarray] | None = None
        self.replies: list[_Reply] = []
        self.format_error: str | None = None

    def _call(self, msg: Message) -> Message:
        reply = _over_the_wire(super()._call(_over_the_wire(msg)))
        if msg.metadata.message_type != "train" or not msg.content.array_records:
            return reply
        model = msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays()
        config = msg.content.config_records.get(keys.CONFIG)
        server_round = int(_number(config.get(keys.SERVER_ROUND) if config is not None else None, 0.0))
        if self.initial is None and server_round == 1:
            self.initial = [np.array(w) for w in model]
        node = msg.metadata.dst_node_id
        if reply.has_error() or keys.ARRAYS not in reply.content.array_records:
            return reply
        metrics = reply.content.metric_records.get(keys.METRICS)
        sigma = _number(metrics.get(keys.NOISE_MULTIPLIER) if metrics is not None else None, math.nan)
        upload = reply.content.array_records[keys.ARRAYS].to_numpy_ndarrays()
        n = _number(metrics.get(keys.NUM_EXAMPLES) if metrics is not None else None, math.nan)
        partition = int(_number(self.contexts[node].node_config.get(keys.NODE_PARTITION_ID), -1.0))
        like = tuple((np.shape(u), str(np.asarray(u).dtype)) for u in upload)
        self.replies.append(_Reply(server_round, partition, n, sigma, like))
        if node in self.observed:
            self._observe(node, server_round, partition, model, upload, sigma, like)
        return reply

    def _observe(self, node: int, server_round: int, partition: int, model: list[np.ndarray],
                 upload: list[np.ndarray], sigma: float, like: tuple[tuple[tuple[int, ...], str], ...]) -> None:
        """Add one canary upload to its white-box observation."""
        if [np.shape(u) for u in upload] != [np.shape(w) for w in model]:
            self.format_error = (f"--runtime flower scores uploads of the whole model; a canary's round {server_round} "
                                 f"upload has layers {[np.shape(u) for u in upload]} (another upload format): use "
                                 "the in-process games")
            return
        seen = _flat(upload) - _flat(model)
        if self.plan.noise_source == "seeded":  # the server regenerates the noise where that explains the upload
            seen = explained(seen, _replayed(self.plan, partition, server_round, sigma, like))
        previous = self.observed[node]
        self.observed[node] = seen if previous is None else previous + seen
        self.sigmas.append(sigma)


# --------------------------------------------------------------------------- the audit
@dataclass(frozen=True)
class _Plan:
    run_config: dict[str, Any]
    strategy: str
    dp_mode: str
    budget: float
    delta: float
    noise_source: str
    clip: float
    rounds: int
    run_seed: int
    noise_shares: int
    mechanism: str
    real_clients: int


def _plan(run_config: dict[str, Any], client: int) -> _Plan:
    """What the run will do, checked to be auditable here (CliError: one line naming what is not)."""
    from client.profile import resolve_profile
    from privet.run_config import CliError
    from protocol.train_config import TrainConfig
    from server.config import ConfigError, RunConfig
    from server.registry import train_config
    from strategies.catalogue import CATALOGUE

    try:
        cfg = RunConfig.from_flower(run_config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if not 0 <= client < cfg.num_clients:
        raise CliError(f"--client must be in [0, {cfg.num_clients}) ('num-clients'); found {client}")
    if CATALOGUE[cfg.strategy].task != keys.TASK_MODEL:
        raise CliError(f"--runtime flower audits model-training strategies; '{cfg.strategy}' is not one (use the "
                       "in-process games: privet audit without --runtime)")
    if cfg.secure_aggregation != "none":
        raise CliError(f"--runtime flower: 'secure-aggregation' = '{cfg.secure_aggregation}' is not audited in a "
                       "real run yet (the server sees only sums); use the in-process games")
    try:
        profile = resolve_profile({keys.NODE_PARTITION_ID: client, keys.NODE_NUM_PARTITIONS: cfg.num_clients},
                                  run_config)
        train = TrainConfig.decode(train_config(cfg))
        probe = train.mechanism(num_examples=1, delta=profile.delta)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if train.group_round or probe.kind != WholeUpdate.kind:
        groups = ", GDPFed groups" if train.group_round else ""
        raise CliError(f"--runtime flower audits client-level 'update' mode (each upload seen alone); this config "
                       f"runs mechanism '{probe.kind}' (dp-mode '{train.dp_mode}'{groups}): use the in-process "
                       "games (privet audit without --runtime)")
    if not math.isfinite(profile.epsilon_budget):
        raise CliError(f"client {client} has no finite budget ('budget-distribution'): nothing to audit")
    return _Plan(run_config, cfg.strategy, train.dp_mode, profile.epsilon_budget, profile.delta,
                 profile.noise_source, float(probe.clip), train.num_rounds, int(train.seed),
                 int(getattr(probe, "noise_shares", 1)), probe.kind, cfg.num_clients)


def _canary_configs(plan: _Plan, secrets: np.ndarray, seeds: np.ndarray, ledgers: Path) -> list[dict[str, Any]]:
    """The canaries' node configs: the audited client's budget, δ and noise source, a durable ledger file
    in ``ledgers`` each, and the canary keys.
    """
    n, k = plan.real_clients, len(secrets)
    configs = []
    for j in range(k):
        nc: dict[str, Any] = {
            keys.NODE_PARTITION_ID: n + j, keys.NODE_NUM_PARTITIONS: n + k, keys.NODE_CLIENT_ID: f"canary-{j}",
            keys.NODE_EPSILON: float(plan.budget), keys.NODE_DELTA: float(plan.delta),
            keys.NODE_NOISE_SOURCE: plan.noise_source, keys.NODE_LEDGER_PATH: str(ledgers / f"canary-{j}.json"),
            keys.NODE_AUDIT_CANARY_SEED: int(seeds[j]), keys.NODE_AUDIT_CANARY_SIGN: int(secrets[j]),
            keys.NODE_AUDIT_CANARY_NORM: CANARY_NORM * plan.clip}
        if plan.noise_source == "seeded":
            nc[keys.NODE_ALLOW_SEEDED_NOISE] = True  # the audited config's choice, which the audit exposes
        configs.append(nc)
    return configs


def _flat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def _replayed(plan: _Plan, partition_id: int, server_round: int, sigma: float,
              like: Sequence[tuple[tuple[int, ...], str]]) -> np.ndarray:
    """A client's noise of one round as a server that knows the run seed regenerates it (σ is public)."""
    from client.seeds import client_seed
    from privacy.randomness import noise_source

    replay = noise_source("seeded", client_seed(plan.run_seed, partition_id, server_round))
    std = sigma * plan.clip / math.sqrt(plan.noise_shares)
    return _flat(gaussian_noise_like([np.zeros(shape, dtype=dtype) for shape, dtype in like], std, replay))


def _replayed_mean(plan: _Plan, replies: Sequence[_Reply]) -> np.ndarray:
    """Every client's regenerated noise in the rounds' FedAvg means Σ_t Σ_k (n_k / Σ n) z_k,t (n_k is public).

    Right only where the strategy's aggregate is that mean; the caller uses it only where it explains the
    released model's change.
    """
    total: np.ndarray | None = None
    for t in sorted({r.server_round for r in replies}):
        members = [r for r in replies if r.server_round == t]
        count = sum(r.num_examples for r in members)
        for r in members:
            part = r.num_examples / count * _replayed(plan, r.partition_id, t, r.noise_multiplier, r.like)
            total = part if total is None else total + part
    return np.zeros(0) if total is None else total


def _ledger(grid: InProcessGrid, node: int) -> PrivacyLedger:
    """A canary's ledger after the run: its durable file (``ledger-path``), checked against its node state."""
    from client.ledger_store import STATE_KEY

    path = Path(str(grid.contexts[node].node_config[keys.NODE_LEDGER_PATH]))
    state = grid.contexts[node].state
    if not path.exists():  # never charged
        if STATE_KEY in state:
            raise RuntimeError(f"canary node {node} keeps a ledger in its state but none in {path}")
        return PrivacyLedger(math.inf, 0.5)
    ledger = PrivacyLedger.load(path)
    if STATE_KEY not in state or PrivacyLedger.from_json(str(state[STATE_KEY]["json"])).charges() != ledger.charges():
        raise RuntimeError(f"canary node {node}: its ledger file {path} and its node state disagree")
    return ledger


def _final_model(results: Path, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    with np.load(results / "model.npz") as npz:
        arrays = [np.asarray(npz[name]) for name in npz.files]
    if [a.shape for a in arrays] != [np.shape(w) for w in like]:
        raise RuntimeError(f"the released model's layers {[a.shape for a in arrays]} are not the model's "
                           f"{[np.shape(w) for w in like]}")
    return arrays


def audit_flower(config: str | None = None, sets: Sequence[str] = (), *, out: str | Path | None = None,
                 client: int = 0, canaries: int = DEFAULT_CANARIES, confidence: float = DEFAULT_CONFIDENCE,
                 seed: int | None = None) -> FlowerAuditReport:
    """Run the configured strategy with canary clients and audit the canaries (module docstring).

    Parameters
    ----------
    config, sets : str, sequence of str
        As ``privet run``: an experiment TOML and ``key=value`` overrides.
    out : path, optional
        The audited run's results folder (created; refused if it holds a run already): the run's own
        results, ``audit.json``, and the audit's section in its ``summary.json``, ``privacy_report.md``
        and ``report.html`` (:func:`server.results.write_audit`). Without it the run writes to a
        temporary folder, removed at the end.
    client : int
        The audited client's partition id: every canary holds its budget and δ.
    canaries : int
        Canary clients started beside the config's ``num-clients``.
    confidence : float
        Of the lower bounds and the flag.
    seed : int, optional
        The auditor's own randomness (the canaries' coins and direction seeds); never the clients' noise.

    Raises
    ------
    privet.run_config.CliError
        For a bad or unsupported configuration or option (one line naming it), or a run that failed.
    """
    from client.app import app as client_app
    from privet.run_config import CliError, check_out_dir, load_experiment, validate
    from server.app import run_experiment
    from server.config import RunConfig
    from server.results import write_audit

    if canaries < 2:
        raise CliError(f"--canaries must be an integer >= 2; found {canaries}")
    if not 0.5 <= confidence < 1:
        raise CliError(f"--confidence must be in [0.5, 1); found {confidence}")
    run_config = load_experiment(config, list(sets), None)
    validate(run_config)
    if out is not None:
        check_out_dir(Path(out))
        if (Path(out) / "summary.json").exists():
            raise CliError(f"--out {out} already holds a run's results (summary.json); the audited run writes its "
                           "own: use another --out")
    plan = _plan(run_config, client)
    rng = np.random.default_rng(seed)
    secrets = rng.choice(np.array([-1, 1]), size=canaries)
    seeds = rng.integers(0, 2**63 - 1, size=canaries, dtype=np.int64)
    memory = Path("/dev/shm")  # the canaries' ledger files: fsync'ed on every charge, cheap in memory
    with tempfile.TemporaryDirectory(prefix="privet-audit-flower-", dir=memory if memory.is_dir() else None) as scratch:
        ledgers = Path(scratch) / "ledgers"
        node_configs = [*simulation_node_configs(plan.real_clients), *_canary_configs(plan, secrets, seeds, ledgers)]
        results = Path(out) if out is not None else Path(scratch) / "run"
        run_config = {**run_config, "out-dir": str(results)}
        grid = _AuditGrid(client_app, node_configs, run_config, plan)
        started = time.perf_counter()
        quiet = [logging.getLogger(name) for name in ("flwr", "privet")]  # a line per canary round is noise here
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.WARNING)
        try:
            run_experiment(grid, run_config, run_id=RUN_ID)
        except Exception as exc:  # noqa: BLE001 - a failed run is one line, its results say more
            raise CliError(f"the audited run failed: {type(exc).__name__}: {exc} (results in {results})") from None
        finally:
            for logger, level in zip(quiet, levels, strict=True):
                logger.setLevel(level)
        run_seconds = time.perf_counter() - started
        if grid.initial is None:
            raise CliError("the audited run sent no round-1 model: nothing was observed")
        final = _final_model(results, grid.initial)
        report = _report(plan, grid, secrets, seeds, final, confidence=confidence, client=client,
                         run_seconds=run_seconds, results=str(results) if out is not None else "(temporary)",
                         settings={"canaries": canaries, "confidence": confidence, "seed": seed, "config": config,
                                   "set": list(sets), "canary_norm": CANARY_NORM})
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "audit.json").write_text(json.dumps(report.to_dict(), indent=1))
        write_audit(out, report.summary_section(), RunConfig.from_flower(run_config))
    return report


def _report(plan: _Plan, grid: _AuditGrid, secrets: np.ndarray, seeds: np.ndarray,
            final: list[np.ndarray], *, confidence: float, client: int, run_seconds: float, results: str,
            settings: dict[str, Any]) -> FlowerAuditReport:
    """Both views' observations, assessed against the canaries' ledgers."""
    from client.work import canary_direction

    assert grid.initial is not None
    if grid.format_error:
        from privet.run_config import CliError

        raise CliError(grid.format_error)
    canary_nodes = grid.canary_nodes
    shapes = [np.shape(w) for w in grid.initial]
    ledgers = [_ledger(grid, node) for node in canary_nodes]
    charged = max({tuple(led.charges()): led for led in ledgers}.values(), key=lambda led: (led.spent(),
                                                                                              len(led.charges())))
    change = _flat(final) - _flat(grid.initial)
    if plan.noise_source == "seeded":  # every client's noise regenerated, in the FedAvg means of the rounds
        change = explained(change, _replayed_mean(plan, grid.replies))
    k = len(canary_nodes)
    upload_scores, upload_cosines, final_scores, final_cosines = (np.zeros(k) for _ in range(4))
    for j, node in enumerate(canary_nodes):  # one direction at a time: memory is the K observations
        u = _flat(canary_direction(int(seeds[j]), shapes))
        seen = grid.observed[node]
        if seen is not None:
            upload_scores[j] = seen @ u / plan.clip
            (upload_cosines[j],) = canary_cosines(seen, u[None, :])
        final_scores[j] = change @ u / plan.clip
        (final_cosines[j],) = canary_cosines(change, u[None, :])
    views = {"upload": (upload_scores, upload_cosines, len(grid.sigmas)),
             "final-model": (final_scores, final_cosines, plan.rounds)}
    sigmas = grid.sigmas
    releases = max(led.releases_in_run(RUN_ID) for led in ledgers)
    audits = []
    for view, (scores, cosines, count) in views.items():
        started = time.perf_counter()
        obs = Observation(secrets, scores, cosines, tuple(charged.charges()), "replace-one", int(count))
        result = assess(obs, f"{plan.mechanism} ({view})", delta=charged.delta, confidence=confidence,
                        accountant=charged.conversion(), started=started)
        audits.append(FlowerAudit(view=view, mechanism=plan.mechanism, result=result,
                                  noise_multiplier=float(np.median(sigmas)) if sigmas else math.nan, clip=plan.clip,
                                  releases_per_canary=releases, rounds=plan.rounds, noise_source=plan.noise_source))
    return FlowerAuditReport(plan.strategy, plan.dp_mode, client, plan.budget, plan.real_clients, len(canary_nodes),
                             tuple(audits), tuple(led.spent() for led in ledgers), run_seconds, results, settings)


# --------------------------------------------------------------------------- the command
def cmd_audit_flower(args: Any) -> int:
    """``privet audit --runtime flower``: print the report; 1 with the flagged line(s) on stderr.

    ``args`` carries ``privet audit``'s options (config, set, out, client, canaries, confidence, seed).
    """
    import sys

    from privet.run_config import CliError

    try:
        report = audit_flower(args.config, args.set or [], out=args.out, client=args.client,
                              canaries=args.canaries, confidence=args.confidence, seed=args.seed)
    except CliError as exc:
        print(f"privet: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()), flush=True)
    if args.out:
        print(f"audit.json: {Path(args.out) / 'audit.json'}")
    for flagged in report.flagged:
        print(f"privet: audit: {flagged.line()}", file=sys.stderr)
    return 1 if report.flagged else 0
