"""A round's secure sums, as a collaborator of the strategy (Flower composes its SecAgg+ workflow the same way).

:class:`SecureRounds` runs :mod:`strategies.secure_sum`'s stages around a round: stages 0–1
when the round's train messages are built (:meth:`open`: the messages become stage 2), the
masked inputs read from the replies (:meth:`masked_inputs`), stage 3 and the checks a released
sum can take once the replies are booked (:meth:`release`). The strategy decides the sums (its
``secure_groups`` hook) and the mechanism each sum's members run.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from privacy.secure_sum import quantisation_for
from protocol.roster import Roster
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

log = logging.getLogger("privet.strategy")


@dataclass(frozen=True)
class SumMechanism:
    """What every member of one sum runs: C, σ of the sum, m shares, and r_min."""

    clip: float
    noise_multiplier: float
    shares: int
    min_survivors: int

    @property
    def noise_std(self) -> float:
        """The noise std Cσ/√m each member adds per coordinate."""
        return self.clip * self.noise_multiplier / math.sqrt(self.shares)


@dataclass(frozen=True)
class Released:
    """Stage 3's outcome: the released sums, one report line per sum, masked bytes received."""

    sums: list[SumResult]
    report: list[dict[str, Any]]
    bytes_up: int


class SecureRounds:
    """The secure sums of each round (module docstring).

    Parameters
    ----------
    config : SecureAggregation
        The run's ``secagg.*`` section.
    timeout : float
        Seconds to wait for each stage's answers.
    ttl : float or None
        Time-to-live of every stage's messages.
    """

    def __init__(self, config: SecureAggregation, timeout: float, ttl: float | None,
                 roster: Roster | None = None) -> None:
        self.config, self.timeout, self.ttl, self.roster = config, timeout, ttl, roster
        self._run_tag = secrets.token_hex(8)  # every sum's id is unique: its signatures are its own
        self._sums: list[SumState] = []
        self._mechanisms: list[SumMechanism] = []
        self._shapes: list[tuple[int, ...]] = []

    def open(self, grid: Grid, server_round: int, groups: Sequence[Sequence[int]],
             mechanisms: Sequence[SumMechanism], global_arrays: Sequence[np.ndarray],
             train: dict[int, Message]) -> list[Message]:
        """Stages 0–1 of the round's sums; the train messages of their members become stage 2."""
        self._shapes = [tuple(a.shape) for a in global_arrays]
        dim = sum(int(a.size) for a in global_arrays)
        self._mechanisms = list(mechanisms)
        quantisations = [quantisation_for(m.clip, m.noise_std, dim, len(g), self.config.bits,
                                          self.config.clip_probability) for g, m in zip(groups, mechanisms, strict=True)]
        self._sums = open_sums(grid, groups, quantisations,
                               [(m.clip, m.noise_multiplier, m.shares, m.min_survivors) for m in mechanisms],
                               self.config, sum_ids=[f"{self._run_tag}-{server_round}-{i}" for i in range(len(groups))],
                               roster=self.roster, timeout=self.timeout, ttl=self.ttl)
        return collect_messages(self._sums, train)

    def masked_inputs(self, replies: Iterable[Message]) -> tuple[dict[int, list[np.ndarray]], dict[int, str]]:
        """Each member's masked vector from its stage-2 reply, and why a reply's is unusable."""
        modulus = {n: s.quantisation.modulus for s in self._sums for n in s.members}
        inputs: dict[int, list[np.ndarray]] = {}
        invalid: dict[int, str] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error() or node not in modulus:
                continue
            got = masked_input(reply, self._shapes, modulus[node])
            if isinstance(got, str):
                invalid[node] = got
            else:
                inputs[node] = got
        return inputs, invalid

    def release(self, grid: Grid, server_round: int, inputs: dict[int, list[np.ndarray]],
                names: dict[int, str]) -> Released:
        """Stage 3 over the members whose input was accepted, then the checks a released sum can take."""
        results = release_sums(grid, self._sums, inputs, self._shapes, roster=self.roster, timeout=self.timeout,
                               ttl=self.ttl)
        released, report = [], []
        for result, state, mechanism in zip(results, self._sums, self._mechanisms, strict=True):
            why = check_sum(result, mechanism.clip, mechanism.noise_std, state.quantisation.step)
            if why:
                log.warning("round %d: secure sum %d not used: %s", server_round, result.index, why)
            else:
                released.append(result)
            report.append({"members": [names.get(n, f"node-{n}") for n in result.members],
                           "left_out": {names.get(n, f"node-{n}"): why for n, why in state.left_out.items()},
                           "survivors": len(result.survivors), "released": why is None, "reason": why or "",
                           "clip_range": state.quantisation.clipping_range, "bits": self.config.bits,
                           "modulus_bits": state.quantisation.modulus.bit_length() - 1})
        bytes_up = int(sum(a.nbytes for arrays in inputs.values() for a in arrays))
        return Released(released, report, bytes_up)
