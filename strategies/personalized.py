"""The personalized baselines of FedCEO's Table 1: PPSGD and CENTAUR.

Both keep a part of every client's model on the client (in its ``context.state``, see
``client/personalization.py``) and share only the rest. Clients clip the update of the
**shared part** to C and add N(0, σ²C²/m) to it before upload (``dp_mode="update"``);
the server averages the shared part (FedAvg, weighted by example counts).

=========  =========================  ============================  ======================
name       personal (never uploaded)  shared (clipped + noised)     paper
=========  =========================  ============================  ======================
ppsgd      additive offset v_k        global parameters u           Bietti et al. 2022
           (model predicts u + v_k)
centaur    head = last Linear layer   body = all other parameters   Shen et al. 2023
=========  =========================  ============================  ======================

Guarantee (both): client-level (ε, δ)-DP **of each upload, for the shared part only**,
against an honest-but-curious server that sees every upload: a Gaussian mechanism of
sensitivity C and multiplier σ/√m per round, charged to the client's ledger as in
``update`` mode. The personal part never leaves the client, so it is not released and
no DP claim covers it (it is trained on the client's raw data; whoever gets the device
gets it). The personalized accuracy each client reports (its personal model on its local
held-out 20%) is sent in the clear, like every evaluation metric in this system.

Evaluation: these methods are judged by the clients' **personal** models. Each round the
strategies ask clients (``fraction_evaluate`` of the registered ones) to evaluate u + v_k
(PPSGD) or global body + local head (CENTAUR) on their held-out split; the weighted mean
goes into the round's results line as ``personalized_accuracy``. The central
``accuracy`` is that of the shared model alone: for CENTAUR its head is never trained
(it stays at initialisation), so that number is meaningless for CENTAUR by design.

Head/body split (CENTAUR): the head is the module that owns the **last** entry of the
model's ``state_dict`` (:func:`tasks.models.head_parameter_names`); the client checks that it is an
``nn.Linear``. For the project's models: ``mlp2`` head = ``fc2.weight``; ``lenet5`` head
= ``fc3.weight, fc3.bias`` (body = both convs, fc1, fc2); ``cnn`` head = ``fc2.*``;
``cnn2`` head = ``fc2.*``; ``logreg`` is all head (empty body: CENTAUR degenerates to
purely local learning, and the client warns).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Unpack

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from typing_extensions import override

from protocol import keys
from protocol.replies import EvaluationReport
from strategies.base import AcceptedReply, ClientAccount, PrivacyAwareFedAvg, StrategyOptions, seeded_sample
from strategies.layers import weighted_mean
from tasks.models import head_parameter_names
from tasks.partition import training_size

log = logging.getLogger("privet.strategy")

__all__ = ["CENTAUR", "PPSGD", "PersonalizedFedAvg"]


class PersonalizedFedAvg(PrivacyAwareFedAvg):
    """Shared parts averaged by FedAvg; personal parts stay on the clients.

    Adds to ``PrivacyAwareFedAvg``: the ``personalization`` key in every train config,
    and a client-side evaluation round that reports the clients' personalized accuracy.

    Parameters
    ----------
    fraction_evaluate : float
        Fraction in (0, 1] of the registered, connected clients asked each round to
        evaluate their personal model on their held-out split (seeded sample).

    Other parameters: see ``PrivacyAwareFedAvg``. ``dp_mode`` defaults to ``"update"``
    (the papers' user-level DP on the shared part); ``"dpsgd"`` makes every local step a
    DP-SGD step (sample-level DP, as FedCEO's code runs its UDP-FedAvg).
    """

    scheme: str = ""

    default_dp_mode = keys.DP_UPDATE

    def __init__(self, *, fraction_evaluate: float = 1.0, **options: Unpack[StrategyOptions]) -> None:
        if isinstance(fraction_evaluate, bool) or not 0.0 < fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate must be in (0, 1]; found {fraction_evaluate!r}")
        super().__init__(**options)
        self.fraction_evaluate = float(fraction_evaluate)

    # ------------------------------------------------------------------ train
    def personal_config(self) -> dict[str, float | int | str]:
        """The scheme's own keys for the train config (subclasses add theirs)."""
        return {keys.PERSONALIZATION: self.scheme}

    @override
    def node_config(self, server_round: int, account: ClientAccount, config: ConfigRecord) -> ConfigRecord:
        cfg = ConfigRecord(dict(config))
        cfg.update(self.personal_config())
        return cfg

    def expected_num_examples(self, account: ClientAccount) -> int:
        """A personalized client trains on (and reports) its 80 % split."""
        return training_size(account.num_examples) if account.num_examples >= 2 else account.num_examples

    @override
    def summary(self) -> None:
        super().summary()
        log.info("%s: personalization=%s %s fraction-evaluate=%.2f", type(self).__name__,
                 self.scheme, self.personal_config(), self.fraction_evaluate)

    # --------------------------------------------------------------- evaluate
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask a seeded sample of the registered clients to evaluate their personal model.

        Clients that never trained evaluate the shared model with an empty personal part
        (v_k = 0, or the global head): that is their personal model at that point.
        Evaluation is an uncharged release on private data: only clients whose operator
        allows it are asked (their handshake said so), and never once their budget is spent.
        """
        registered = sorted(n for n in grid.get_node_ids() if n in self.accounts
                            and self.accounts[n].client_evaluation and not self.accounts[n].exhausted)
        if not registered:
            return []
        size = max(1, int(math.ceil(self.fraction_evaluate * len(registered))))
        chosen = seeded_sample(registered, size, [self.seed, server_round, 1], order=self.client_order)
        cfg = ConfigRecord(dict(config))
        cfg.update(self.personal_config())
        cfg[keys.SERVER_ROUND] = server_round
        return [
            Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: cfg}), dst_node_id=n,
                    message_type=MessageType.EVALUATE)
            for n in chosen
        ]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Example-weighted mean of the personalized accuracies and losses.

        Recorded as this round's ``RoundResult.evaluation`` (``personalized_accuracy``,
        ``personalized_loss``, ``personalized_clients``, ``personalized_examples``) before
        the server's central evaluation copies the entry into the results line.
        """
        acc, loss, weight = [], [], []
        for reply in replies:
            if reply.has_error():
                log.warning("round %d: personalized evaluation failed on node %d: %s", server_round,
                            reply.metadata.src_node_id, reply.error.reason)
                continue
            try:
                report = EvaluationReport.decode(reply.content)
            except ValueError as exc:
                log.warning("round %d: evaluation reply ignored: %s", server_round, exc)
                continue
            a, l, n = report.accuracy, report.loss, report.num_examples
            acc.append(a)
            loss.append(l)
            weight.append(n)
        if not weight:
            return None
        w = np.asarray(weight, dtype=np.float64)
        result = {
            "personalized_accuracy": float(np.dot(w, acc) / w.sum()),
            "personalized_loss": float(np.dot(w, loss) / w.sum()),
            "personalized_clients": len(weight),
            "personalized_examples": int(w.sum()),
        }
        entry = self.round_result(server_round)
        if entry is not None:
            entry.evaluation = dict(result)
        log.info("round %d: personalized accuracy %.4f over %d clients", server_round,
                 result["personalized_accuracy"], len(weight))
        return MetricRecord({k.replace("_", "-"): v for k, v in result.items()})


class PPSGD(PersonalizedFedAvg):
    """PPSGD, Personalized-Private-SGD (Bietti et al., ICML 2022, arXiv:2202.05318).

    Additive personalization: client k predicts with u + v_k, where u is shared and v_k
    is its own. In every local SGD step the gradient g of the loss at u + v_k moves the
    local copy of u by −η·g and v_k by −α·η·g (Bietti et al.'s Algorithm 1 takes one such
    step per round; we run the configured local epochs, FedAvg-style). The client releases
    u_0 + clip(u − u_0, C) + N(0, σ²C²/m); v_k stays in its ``context.state``. The server
    averages the released u (global step size 1). Omitted: Bietti et al.'s separate
    server learning rate (equal to 1 here).

    Guarantee: client-level DP of each upload of u (multiplier σ/√m per round); v_k is
    never released and is covered by no DP claim.

    Parameters
    ----------
    personal_lr_scale : float
        α > 0, the personal step size relative to the shared one (Bietti et al.'s
        personalization parameter; larger α = more personalization). Default 1.

    Other parameters: see ``PersonalizedFedAvg``.
    """

    scheme = keys.PERSONALIZATION_ADDITIVE

    def __init__(self, *, personal_lr_scale: float = 1.0, fraction_evaluate: float = 1.0,
                 **options: Unpack[StrategyOptions]) -> None:
        if isinstance(personal_lr_scale, bool) or not (
            math.isfinite(personal_lr_scale) and personal_lr_scale > 0
        ):
            raise ValueError(f"personal_lr_scale must be a finite number > 0; found {personal_lr_scale!r}")
        super().__init__(fraction_evaluate=fraction_evaluate, **options)
        self.personal_lr_scale = float(personal_lr_scale)

    @override
    def personal_config(self) -> dict[str, float | int | str]:
        return {**super().personal_config(), keys.PERSONAL_LR_SCALE: self.personal_lr_scale}


class CENTAUR(PersonalizedFedAvg):
    """CENTAUR (Shen et al., "Share Your Representation Only", arXiv:2309.05505).

    A shared representation (the body) with private local heads. Each sampled client
    trains its local head for ``head_epochs`` epochs with the body frozen, then the body
    for ``local-epochs`` epochs with the head fixed, and releases
    body_0 + clip(body − body_0, C) + N(0, σ²C²/m) with the head entries set to the
    **received** global head (a zero update): nothing of its head leaves the client.
    The server averages the bodies and keeps the global head as it was. Omitted from
    Shen et al.: the QR re-orthonormalisation of the representation (defined for their
    linear representation, not for a deep body) and the private initialisation step.

    Guarantee: client-level DP of each upload of the body (multiplier σ/√m per round);
    the local head is never released and is covered by no DP claim.

    Parameters
    ----------
    head_epochs : int
        Epochs on the local head (body frozen) before the body epochs. Default 1.

    Other parameters: see ``PersonalizedFedAvg``.
    """

    scheme = keys.PERSONALIZATION_HEAD

    def __init__(self, *, head_epochs: int = 1, fraction_evaluate: float = 1.0,
                 **options: Unpack[StrategyOptions]) -> None:
        if isinstance(head_epochs, bool) or not isinstance(head_epochs, int) or head_epochs < 1:
            raise ValueError(f"head_epochs must be an int >= 1; found {head_epochs!r}")
        super().__init__(fraction_evaluate=fraction_evaluate, **options)
        self.head_epochs = head_epochs
        self._round_global: list[np.ndarray] = []

    @override
    def personal_config(self) -> dict[str, float | int | str]:
        return {**super().personal_config(), keys.HEAD_EPOCHS: self.head_epochs}

    @override
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._round_global = arrays.to_numpy_ndarrays()  # the head the round started with
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_models(self, server_round: int, replies: list[AcceptedReply]) -> list[np.ndarray]:
        """FedAvg of the bodies; every head entry is the round's global head, copied."""
        mean = weighted_mean([r.arrays for r in replies], [r.num_examples for r in replies])
        head = set(head_parameter_names(self.global_names))
        return [g.copy() if name in head else m
                for name, g, m in zip(self.global_names, self._round_global, mean, strict=True)]
