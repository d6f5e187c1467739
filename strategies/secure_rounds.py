"""A round's secure sums, as a collaborator of the strategy (Flower composes its SecAgg+ workflow the same way).

:class:`SecureRounds` runs :mod:`strategies.secure_sum`'s stages around a round: stages 0–1
when the round's train messages are built (:meth:`open`: the messages become stage 2), the
masked inputs read from the replies (:meth:`masked_inputs`), stage 3 and the checks a released
sum can take once the replies are booked (:meth:`release`). The strategy decides the sums (its
``secure_groups`` hook) and the mechanism each sum's members run.

With ``secure-aggregation = "secagg+ddg"`` each sum's distributed discrete Gaussian
(:func:`privacy.distributed_discrete_gaussian.ddg_parameters`: scale, noise, norm bound for
``secagg.bits``, the sum's size and the model's dimension) is chosen here, signed by every member
within the sum's parameters, and kept per round and node: it is what the server's copy of each
member's mechanism charges (:meth:`ddg_sum`).
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

from privacy.distributed_discrete_gaussian import ddg_parameters
from privacy.mechanisms.ddg import DDGSum
from privacy.secure_sum import quantisation_for
from protocol.bitpack import packed_size
from protocol.roster import Roster
from protocol.secure_sum import SumParameters, wire_bits
from strategies.secure_sum import (
    SecureAggregation,
    SumResult,
    SumState,
    check_ddg_sum,
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
    """Stage 3's outcome: the released sums, one report line per sum, the bytes of the accepted masked inputs.

    Each accepted input is ⌈D·log₂ M/8⌉ bytes, as packed on the wire.
    """

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
        self._ddg: dict[tuple[int, int], DDGSum] = {}  # (round, node) -> the DDG sum it was a member of

    @property
    def ddg_mode(self) -> bool:
        """Whether the sums carry distributed discrete Gaussian shares (``secagg+ddg``)."""
        return self.config.ddg

    def parameters(self, sum_id: str, members: int, mechanism: SumMechanism,
                   dim: int) -> tuple[SumParameters, str]:
        """One sum's parameters, and why it cannot run ("" if it can)."""
        size = max(members, 2)  # a sum of one member is abandoned; its parameters only need to exist
        threshold, r_min = self.config.shamir_threshold(size), min(max(mechanism.min_survivors, 1), size)
        why = "" if members >= mechanism.min_survivors else \
            f"{members} members, fewer than min-survivors = {mechanism.min_survivors}"
        if not self.ddg_mode:
            q = quantisation_for(mechanism.clip, mechanism.noise_std, dim, members or 1, self.config.bits,
                                 self.config.clip_probability)
            return SumParameters(sum_id, size, threshold, r_min, float(q.clipping_range), q.levels, q.modulus,
                                 float(mechanism.clip), float(mechanism.noise_multiplier), int(mechanism.shares)), why
        try:
            ddg = ddg_parameters(clip=mechanism.clip, dim=dim, bits=self.config.bits,
                                 noise_multiplier=mechanism.noise_multiplier, noise_shares=mechanism.shares,
                                 max_members=size, beta=self.config.beta,
                                 wrap_probability_target=self.config.wrap_probability)
        except ValueError as exc:  # too few bits for this sum: 'secagg.bits' names the knob
            why = why or f"secagg.bits = {self.config.bits}: {exc}"
            ddg = ddg_parameters(clip=mechanism.clip, dim=dim, bits=32, noise_multiplier=1.0, noise_shares=1,
                                 max_members=size)  # placeholder parameters of a sum that never runs
        return SumParameters.for_ddg(sum_id, size, threshold, r_min, mechanism.noise_multiplier, mechanism.shares,
                                     ddg, self.config.wrap_probability), why

    def open(self, grid: Grid, server_round: int, groups: Sequence[Sequence[int]],
             mechanisms: Sequence[SumMechanism], global_arrays: Sequence[np.ndarray],
             train: dict[int, Message]) -> list[Message]:
        """Stages 0–1 of the round's sums; the train messages of their members become stage 2."""
        self._shapes = [tuple(a.shape) for a in global_arrays]
        dim = sum(int(a.size) for a in global_arrays)
        self._mechanisms = list(mechanisms)
        built = [self.parameters(f"{self._run_tag}-{server_round}-{i}", len(g), m, dim)
                 for i, (g, m) in enumerate(zip(groups, mechanisms, strict=True))]
        self._sums = open_sums(grid, groups, [p for p, _ in built], self.config, roster=self.roster,
                               timeout=self.timeout, ttl=self.ttl, abandoned=[why for _, why in built])
        for s in self._sums:
            ddg = s.ddg
            if ddg is not None and not s.abandoned:
                self._ddg.update({(server_round, n): DDGSum(ddg) for n in s.members})
        return collect_messages(self._sums, train)

    def ddg_sum(self, server_round: int, node: int) -> DDGSum | None:
        """The DDG sum ``node`` was a member of in ``server_round`` (None where the sums carry Gaussian shares).

        Raises
        ------
        ValueError
            In ``secagg+ddg`` mode, where the node was in no sum that opened (it released nothing).
        """
        if not self.ddg_mode:
            return None
        found = self._ddg.get((server_round, node))
        if found is None:
            raise ValueError(f"node {node} was in no discrete Gaussian sum of round {server_round}")
        return found

    def masked_inputs(self, replies: Iterable[Message]) -> tuple[dict[int, list[np.ndarray]], dict[int, str]]:
        """Each member's masked vector from its stage-2 reply, and why a reply's is unusable."""
        sum_of = {n: s for s in self._sums for n in s.members}
        inputs: dict[int, list[np.ndarray]] = {}
        invalid: dict[int, str] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error() or node not in sum_of:
                continue
            s = sum_of[node]
            got = masked_input(reply, s.input_shapes(self._shapes), s.modulus)
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
            ddg = state.ddg
            why = check_sum(result, mechanism.clip, mechanism.noise_std, state.quantisation.step) if ddg is None \
                else check_ddg_sum(result, ddg)
            if why:
                log.warning("round %d: secure sum %d not used: %s", server_round, result.index, why)
            else:
                released.append(result)
            row: dict[str, Any] = {"members": [names.get(n, f"node-{n}") for n in result.members],
                                   "left_out": {names.get(n, f"node-{n}"): why for n, why in state.left_out.items()},
                                   "survivors": len(result.survivors), "released": why is None, "reason": why or "",
                                   "bits": self.config.bits, "modulus_bits": state.modulus.bit_length() - 1}
            if ddg is None:
                row["clip_range"] = state.quantisation.clipping_range
            else:  # the distributed discrete Gaussian, and the wrap-around probability of this sum
                row.update({"mode": "secagg+ddg", "scale": ddg.scale, "local_sigma_sq": float(ddg.local_sigma_sq),
                            "norm_bound": math.sqrt(ddg.norm_bound_sq), "padded_dim": ddg.padded_dim,
                            "beta": ddg.beta, "wrap_probability": ddg.wrap_probability})
            report.append(row)
        width = {n: wire_bits(s.modulus) for s in self._sums for n in s.members}  # log₂ M bits per coordinate
        bytes_up = int(sum(packed_size(sum(a.size for a in arrays), width[n]) for n, arrays in inputs.items()))
        return Released(released, report, bytes_up)
