"""The train config: what a sampled client is told about its round, typed on both sides.

The server builds a :class:`TrainConfig` and sends :meth:`TrainConfig.encode` (a Flower
``ConfigRecord``, flat, kebab-case keys of :mod:`protocol.keys`); strategies add their
per-node keys to that record (GDPFed's group mechanism, PFA+'s upload format, a target ε).
The client calls :meth:`TrainConfig.decode` once and reads typed fields from then on: a
missing, mistyped or out-of-range value is a ``ValueError`` naming the key, which the client
answers with a config error before it spends anything.

DP-FedC's clustering rounds carry their own section (:mod:`protocol.dpfedc`) beside this one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from flwr.app import ConfigRecord

from privacy.accountants import ACCOUNTANTS, DEFAULT_ACCOUNTANT
from privacy.calibration import CALIBRATIONS
from privacy.mechanisms import (
    DPSGD,
    Calibration,
    CentroidRelease,
    DDGSum,
    GroupDiscreteGaussianShare,
    GroupShare,
    Mechanism,
    NoPrivacy,
    SecureDiscreteGaussianShare,
    SecureSumShare,
    WholeUpdate,
)
from protocol import keys
from protocol.config import decode_fields, one_of
from protocol.dpfedc import DPFedCRound
from tasks.partition import training_size

#: ``upload-format`` values: the full model, or PFA+'s coordinates in the public subspace.
UPLOAD_FORMATS = (keys.UPLOAD_FULL, keys.UPLOAD_COORDINATES)
#: ``task`` values: a model trained on the client's shard, or DP-FedC's clustering of it.
TASKS = (keys.TASK_MODEL, keys.TASK_CLUSTERING)


@dataclass(frozen=True)
class TrainConfig:
    """One round's instructions to a client (every field is one key of :mod:`protocol.keys`).

    Attributes
    ----------
    num_rounds : int
        T, the rounds the run plans (a client calibrates σ for all of them).
    dp_mode : str
        One of ``keys.DP_MODES`` (:mod:`privacy.dp_modes`).
    local_epochs, batch_size : int
        Local work: passes over the shard, and the (expected) batch size.
    calibration : str
        How a calibrating client (σ = 0 sent) sets σ: ``"accountant"`` or PFA's
        ``"pfa-closed-form"`` (:data:`privacy.calibration.CALIBRATIONS`).
    local_steps : int
        τ: when > 0, exactly this many mini-batch steps per round instead of
        ``local_epochs`` passes (PFA's and GDPFed's local iterations; not with personalization).
    learning_rate, momentum : float
        Local SGD.
    clip : float
        C: per-example (``dpsgd``) or per-update (``update``) clipping bound.
    noise_multiplier : float
        σ; 0 asks the client to calibrate σ to its own budget.
    noise_shares : int
        m: each of m clients adds N(0, σ²C²/m) (``update`` mode).
    target_epsilon : float
        Spend at most this much ε in this run (0: all that remains).
    grad_sample_mode, accountant : str
        Opacus' per-sample-gradient mode; the accountant of the client's ledger.
    seed, server_round : int
        The run's root seed (non-DP randomness only) and the round (0: not sent).
    budget_reference : str
        Simulation only: ``"minimum"``/``"maximum"`` (``keys.BUDGET_REFERENCE``), else "".
    personalization : str
        "" or one of ``keys.PERSONALIZATION_SCHEMES``; ``head_epochs`` and
        ``personal_lr_scale`` are CENTAUR's and PPSGD's parameters.
    group_sample_rate : float
        GDPFed's q_m; > 0 marks a group round (``group_index`` is its 1-based m).
    upload_format : str
        ``"full"`` or PFA+'s ``"coordinates"``.
    task : str
        ``"model"`` or ``"clustering"`` (DP-FedC: its section travels beside, :class:`DPFedCRound`).
    """

    num_rounds: int
    dp_mode: str
    local_epochs: int
    batch_size: int
    learning_rate: float
    clip: float = 1.0
    noise_multiplier: float = 0.0
    noise_shares: int = 1
    momentum: float = 0.0
    target_epsilon: float = 0.0
    grad_sample_mode: str = "auto"
    accountant: str = DEFAULT_ACCOUNTANT
    seed: int = 0
    server_round: int = 0
    budget_reference: str = ""
    personalization: str = ""
    head_epochs: int = 1
    personal_lr_scale: float = 1.0
    group_sample_rate: float = 0.0
    group_index: int = 0
    upload_format: str = keys.UPLOAD_FULL
    local_steps: int = 0
    calibration: str = "accountant"
    task: str = keys.TASK_MODEL

    def __post_init__(self) -> None:
        one_of(keys.DP_MODE, self.dp_mode, keys.DP_MODES)
        one_of(keys.ACCOUNTANT, self.accountant, tuple(ACCOUNTANTS))
        one_of(keys.BUDGET_REFERENCE, self.budget_reference, ("", *keys.BUDGET_REFERENCES))
        one_of(keys.PERSONALIZATION, self.personalization, ("", *keys.PERSONALIZATION_SCHEMES))
        one_of(keys.UPLOAD_FORMAT, self.upload_format, UPLOAD_FORMATS)
        one_of(keys.CALIBRATION, self.calibration, CALIBRATIONS)
        one_of(keys.TASK, self.task, TASKS)
        for name, low in (("num_rounds", 1), ("local_epochs", 1), ("batch_size", 1), ("noise_shares", 1),
                          ("head_epochs", 1), ("server_round", 0), ("group_index", 0), ("local_steps", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"'{_key(name)}' must be an integer >= {low}; found {getattr(self, name)}")
        for name in ("learning_rate", "clip"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"'{_key(name)}' must be a finite number > 0; found {getattr(self, name)}")
        for name in ("noise_multiplier", "target_epsilon", "personal_lr_scale"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"'{_key(name)}' must be a finite number >= 0; found {getattr(self, name)}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"'{keys.MOMENTUM}' must be in [0, 1); found {self.momentum}")
        if self.local_steps and self.personalization:
            raise ValueError(f"'{keys.LOCAL_STEPS}' must be 0 with personalization ({self.personalization!r} "
                             f"trains in '{keys.LOCAL_EPOCHS}' passes); found {self.local_steps}")
        if not 0 <= self.group_sample_rate <= 1:
            raise ValueError(f"'{keys.GROUP_SAMPLE_RATE}' must be in (0, 1] (0: not a group round); "
                             f"found {self.group_sample_rate}")

    @property
    def group_round(self) -> bool:
        """A GDPFed round: the client charges its group's mechanism (σ_m, q_m, T)."""
        return self.group_sample_rate > 0

    def dpsgd_workload(self, num_examples: int) -> tuple[int, int]:
        """(examples trained on, passes over them) of a ``dpsgd`` round for a shard of ``num_examples``.

        Without personalization: the whole shard, ``local-epochs``. With it: the 80 % split
        (:func:`tasks.partition.training_size`), and for CENTAUR ``head-epochs`` more passes
        (its head phase).
        """
        if not self.personalization:
            return int(num_examples), self.local_epochs
        epochs = self.local_epochs + (self.head_epochs if self.personalization == keys.PERSONALIZATION_HEAD else 0)
        return training_size(num_examples), epochs

    def mechanism(self, *, num_examples: int, delta: float, secure_floor: int | None = None,
                  clustering: DPFedCRound | None = None, ddg: DDGSum | None = None) -> Mechanism:
        """The privacy mechanism this round runs (:mod:`privacy.mechanisms`): the one rule, for both sides.

        ``num_examples`` is the client's shard size n, ``delta`` its δ; ``secure_floor`` is r_min
        where the upload leaves only inside a secure sum (None: seen on its own); ``clustering``
        is DP-FedC's section of a clustering round; ``ddg`` the sum's parameters where the secure sum
        carries distributed discrete Gaussian shares (``secure-aggregation = "secagg+ddg"``).

        Raises
        ------
        ValueError
            On a request no mechanism serves (a secure sum outside ``update`` mode, or without a
            common σ; a group sum released with fewer than its r_m shares).
        """
        if secure_floor is not None:
            check_secure_sum(self.dp_mode, self.personalization, self.noise_multiplier, self.group_round)
        if self.dp_mode == keys.DP_NONE:
            return NoPrivacy(self.clip)
        calibration = Calibration(self.num_rounds, self.target_epsilon, self.calibration)
        if self.dp_mode == keys.DP_SGD:
            n, epochs = self.dpsgd_workload(num_examples)
            return DPSGD(self.clip, self.noise_multiplier, calibration, num_examples=n, batch_size=self.batch_size,
                         epochs=epochs, local_steps=self.local_steps, steps_known=not self.personalization)
        if clustering is not None and clustering.calibration == "paper":
            if not clustering.grad_clip > 0:
                raise ValueError(f"the paper calibration needs '{keys.DPFEDC_GRAD_CLIP}' (G) > 0")
            ratio = clustering.params(self.batch_size).w_steps(self.server_round) * min(self.batch_size,
                                                                                       num_examples) / num_examples
            return CentroidRelease.from_paper(epsilon_bar=clustering.epsilon_bar, delta=delta, sample_ratio=ratio,
                                              client_rate=clustering.client_rate, rounds=self.num_rounds,
                                              grad_clip=clustering.grad_clip)
        if clustering is not None:
            planned = Calibration(clustering.planned_rounds or self.num_rounds, self.target_epsilon, self.calibration)
            return CentroidRelease(self.clip, self.noise_multiplier, planned)
        if secure_floor is not None and ddg is not None:
            if self.group_round:  # the group's run, charged once by KLS's curve amplified by Poisson sampling
                if secure_floor < self.noise_shares:
                    raise ValueError(f"a group sum released with {secure_floor} of its {self.noise_shares} noise "
                                     "shares carries less noise than the group's sigma_m that this client charges")
                return GroupDiscreteGaussianShare(self.clip, self.noise_multiplier, sample_rate=self.group_sample_rate,
                                                  rounds=self.num_rounds, noise_shares=self.noise_shares,
                                                  min_survivors=secure_floor, ddg=ddg)
            return SecureDiscreteGaussianShare(self.clip, self.noise_multiplier, noise_shares=self.noise_shares,
                                               min_survivors=secure_floor, ddg=ddg)
        if self.group_round:
            if secure_floor is not None and secure_floor < self.noise_shares:  # σ_m needs all r_m shares
                raise ValueError(f"a group sum released with {secure_floor} of its {self.noise_shares} noise shares "
                                 "carries less noise than the group's sigma_m that this client charges")
            return GroupShare(self.clip, self.noise_multiplier, sample_rate=self.group_sample_rate,
                              rounds=self.num_rounds, noise_shares=self.noise_shares)
        if secure_floor is not None:
            return SecureSumShare(self.clip, self.noise_multiplier, calibration, noise_shares=self.noise_shares,
                                  min_survivors=secure_floor)
        return WholeUpdate(self.clip, self.noise_multiplier, calibration, noise_shares=self.noise_shares)

    def encode(self) -> ConfigRecord:
        """The ``ConfigRecord`` a train message carries (a method's optional fields only when set)."""
        record: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in _OPTIONAL or value != f.default:
                record[_key(f.name)] = value
        return ConfigRecord(record)

    @classmethod
    def decode(cls, record: Mapping[str, Any]) -> TrainConfig:
        """Read a train config; ``ValueError`` naming the key if one is missing or malformed.

        Keys this class does not know (another section's, e.g. DP-FedC's) are ignored.
        """
        return decode_fields(cls, record, _key, _REQUIRED)


def check_secure_sum(dp_mode: str, personalization: str, noise_multiplier: float, group: bool) -> None:
    """What a secure sum needs of the mechanism inside it (server validation and client alike).

    ``update`` mode without personalization (each member adds a share of one Gaussian
    mechanism), and a common σ > 0 fixed by the server (each member counts on the others adding
    the same share; budgets calibrated per client would not), or a GDPFed group's σ_m.

    Raises
    ------
    ValueError
        Naming ``dp-mode`` or ``noise-multiplier``.
    """
    if dp_mode != keys.DP_UPDATE or personalization:
        raise ValueError(f"a secure sum needs '{keys.DP_MODE}' = '{keys.DP_UPDATE}' without personalization; "
                         f"found dp-mode {dp_mode!r}" + (f" with {personalization!r}" if personalization else ""))
    if not group and noise_multiplier <= 0:
        raise ValueError(f"a secure sum needs a common '{keys.NOISE_MULTIPLIER}' > 0: each member counts on the "
                         "others adding the same share of the noise, which budgets calibrated per client would not")


#: field name -> wire key, where they differ from the kebab-case spelling
_KEYS = {"group_sample_rate": keys.GROUP_SAMPLE_RATE, "group_index": keys.GROUP_INDEX}
_REQUIRED = ("num_rounds", "dp_mode", "local_epochs", "batch_size", "learning_rate")
#: sent only when set: the sections of one method (personalization, GDPFed, PFA+, references)
_OPTIONAL = ("target_epsilon", "server_round", "budget_reference", "personalization", "head_epochs",
             "personal_lr_scale", "group_sample_rate", "group_index", "upload_format", "local_steps",
             "calibration", "task")


def _key(name: str) -> str:
    return _KEYS.get(name, name.replace("_", "-"))

