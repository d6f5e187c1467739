"""The per-client privacy ledger: what a client has spent, and the rule that it never overspends.

The ledger is the source of truth for one client's privacy: its budget (ε, δ), the full
history of mechanisms run on its data (``(σ, q, n)`` triples, see
:mod:`privacy.accountants`), and which server rounds / runs they belong to. ε spent is
always *recomputed* from the history (replay), never stored as a running sum, so a ledger
restored from JSON reports exactly what the original did.

Every entry is accounted under the **replace-one** relation (:mod:`privacy.accountants`),
and every release records the DP mode it came from, so the report can say what the
cumulative ε protects: a client's whole dataset (all releases client-level, ``update``
mode) or one record of it (any ``dpsgd`` release, or a release of unknown mode; a
client-level guarantee implies a record-level one, never the other way round).

**Steps accounted through RDP only.** A mechanism whose guarantee is a Rényi-DP curve rather
than a Gaussian's (the distributed discrete Gaussian of :mod:`privacy.distributed_discrete_gaussian`)
is charged as a Gaussian step whose RDP curve lies on or above its own at every order the RDP
accountant converts at. That makes RDP composition and conversion an upper bound, but not a
privacy-loss-distribution accountant (RDP dominance does not imply dominance of the (ε, δ)
profile). So a ledger whose releases include one of :data:`RDP_ONLY_MODES` converts its *whole*
history through RDP (:meth:`PrivacyLedger.conversion`), whatever accountant it was declared with:
every Gaussian step's RDP curve is a valid bound for it as well, and RDP composes any mix. The
release's mode is recorded with it (``modes``), so this holds for the ledger's lifetime, across
runs and restarts, with no change to the file format.

**Steps that carry their RDP curve** (:class:`privacy.accountants.CurveStep`). A GDPFed group whose sum
is a distributed discrete Gaussian is charged by KLS's RDP curve amplified by Poisson sampling
(:mod:`privacy.poisson_rdp`), which no Gaussian triple dominates once subsampled. Such an entry is kept
in ``curves`` beside the Gaussian ``history`` (JSON objects with their ``kind`` and parameters, schema
version 4; a ledger without one is still written as version 3), ε is recomputed from both on every
load, and the whole history is converted through RDP (:func:`privacy.accountants.epsilon_of_valid`).

Invariant: :meth:`PrivacyLedger.record` refuses (raises ``PrivacyBudgetExhausted``,
records nothing) any mechanism that would take the cumulative ε past the budget, so
``spent() <= epsilon_budget · (1 + BUDGET_RTOL)`` holds for every ledger built by records.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privacy.accountants import (
    ACCOUNTANTS,
    REPLACE_ONE,
    Charge,
    CurveStep,
    Step,
    epsilon_of_valid,
    exceeds_budget,
    merge_curve,
    merge_step,
)
from privacy.checks import (
    check_choice,
    check_delta,
    check_int,
    check_positive,
    check_release,
    check_step,
)
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger_file import CURVE_SCHEMA_VERSION, LEDGER_KIND, LEDGER_SCHEMA_VERSION, UNKNOWN_MODE, read_state
from privacy.private_file import write_private_file

__all__ = ["CLIENT_LEVEL_MODES", "DDG_MODE", "GROUP_DDG_MODE", "LEDGER_KIND", "PrivacyLedger", "RDP_ONLY_MODES",
           "RunPlan", "UNIT_CLIENT", "UNIT_RECORD"]

log = logging.getLogger(__name__)

#: The mode of a distributed discrete Gaussian release inside a secure sum (client level).
DDG_MODE = "secure-ddg"
#: The mode of a GDPFed group's distributed discrete Gaussian share (client level, a curve step).
GROUP_DDG_MODE = "group-ddg"
#: Modes whose releases protect a client's whole dataset; every other mode protects a record.
CLIENT_LEVEL_MODES = frozenset({"update", DDG_MODE, GROUP_DDG_MODE})
#: Modes charged only through an RDP curve (a dominating Gaussian step, or the curve itself): a ledger
#: holding one converts its whole history through RDP (module docstring).
RDP_ONLY_MODES = frozenset({DDG_MODE, GROUP_DDG_MODE})
#: The accountant every ledger holding an :data:`RDP_ONLY_MODES` release converts with.
RDP_CONVERSION = "rdp"
UNIT_CLIENT = "client"
UNIT_RECORD = "record"

@dataclass(frozen=True)
class RunPlan:
    """What a client fixed for one run, kept with its ledger so that a restart changes nothing.

    Attributes
    ----------
    cap : float
        The ε the run may bring the ledger to (spent before the run + the run's target ε);
        ``inf``: only the budget limits it.
    noise_multiplier : float
        σ charged per release: calibrated once for the run, or a pre-charged group's σ_m.
    kind : str
        The mechanism (:data:`privacy.mechanisms.MECHANISMS`).
    rounds : int
        T the run was planned (calibrated or pre-charged) for.
    sample_rate : float
        q of a pre-charged run (GDPFed's q_m); 1 otherwise.
    """

    cap: float
    noise_multiplier: float
    kind: str
    rounds: int
    sample_rate: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (an infinite cap is ``null``)."""
        return {"cap": self.cap if math.isfinite(self.cap) else None, "noise_multiplier": self.noise_multiplier,
                "kind": self.kind, "rounds": self.rounds, "sample_rate": self.sample_rate}

    @classmethod
    def from_dict(cls, state: Any, name: str) -> RunPlan:
        """Read :meth:`to_dict`; ValueError naming the entry if it is malformed."""
        if not isinstance(state, dict) or set(state) != {"cap", "noise_multiplier", "kind", "rounds", "sample_rate"}:
            raise ValueError(f"ledger '{name}' must hold cap, noise_multiplier, kind, rounds, sample_rate; "
                             f"found {state!r}")
        cap = math.inf if state["cap"] is None else check_positive(f"{name}.cap", state["cap"])
        sigma, rate, rounds = check_release(state["noise_multiplier"], state["sample_rate"], state["rounds"])
        if not isinstance(state["kind"], str):
            raise ValueError(f"ledger '{name}.kind' must be a string; found {state['kind']!r}")
        return cls(cap, sigma, state["kind"], rounds, rate)


@dataclass
class PrivacyLedger:
    """One client's privacy budget and everything charged against it.

    Attributes
    ----------
    epsilon_budget : float
        Total ε the client allows over all runs, > 0; ``math.inf`` means no DP required
        (accounting still runs, nothing is refused).
    delta : float
        δ of the client's (ε, δ) guarantee, in (0, 1).
    accountant : {"rdp", "prv"}
        How the history is converted to ε.
    history : list of (float, float, int)
        ``(σ, q, n)`` of every Gaussian mechanism run on the client's data; consecutive identical
        ``(σ, q)`` entries are merged.
    rounds, run_ids : list of int
        Parallel lists, one entry per :meth:`record` call: the server round and the run id
        of that release (:meth:`rounds_joined` counts the distinct pairs).
    modes : list of str
        Parallel to ``rounds``: the DP mode of each release (``"unknown"`` for releases
        loaded from a version-1 ledger).
    runs : dict of int to RunPlan
        Per run id, the cap and mechanism the client fixed for that run (:meth:`open_run`).
    curves : list of CurveStep
        The mechanisms charged by their own RDP curve (module docstring); consecutive equal ones merge.

    Notes
    -----
    A ledger in non-private mode simply records nothing: ``spent()`` stays 0.
    """

    epsilon_budget: float
    delta: float
    accountant: str = "rdp"
    history: list[Step] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    run_ids: list[int] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    runs: dict[int, RunPlan] = field(default_factory=dict)
    curves: list[CurveStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.epsilon_budget = check_positive("epsilon_budget", self.epsilon_budget)
        self.delta = check_delta(self.delta)
        self.accountant = check_choice("accountant", self.accountant, ACCOUNTANTS)
        if not isinstance(self.history, (list, tuple)):
            raise ValueError(f"history must be a list of (sigma, q, steps); found {self.history!r}")
        self.history = [check_step(s, name=f"history[{i}]") for i, s in enumerate(self.history)]
        if not isinstance(self.curves, (list, tuple)) or not all(isinstance(c, CurveStep) for c in self.curves):
            raise ValueError(f"curves must be a list of steps with their RDP curve; found {self.curves!r}")
        self.curves = list(self.curves)
        for name in ("rounds", "run_ids"):
            values = getattr(self, name)
            if not isinstance(values, (list, tuple)):
                raise ValueError(f"{name} must be a list of integers; found {values!r}")
            checked = [check_int(f"{name}[{i}]", v, minimum=0) for i, v in enumerate(values)]
            setattr(self, name, checked)
        if not isinstance(self.modes, (list, tuple)) or not all(isinstance(m, str) for m in self.modes):
            raise ValueError(f"modes must be a list of strings; found {self.modes!r}")
        self.modes = list(self.modes)
        if not len(self.rounds) == len(self.run_ids) == len(self.modes):
            raise ValueError(
                "rounds, run_ids and modes must have one entry per record; found "
                f"{len(self.rounds)} rounds, {len(self.run_ids)} run_ids and {len(self.modes)} modes"
            )

    # ------------------------------------------------------------------ accounting
    def spent(self) -> float:
        """Cumulative ε at ``delta`` of the whole history (an upper bound; 0 if empty)."""
        return epsilon_of_valid(self.charges(), self.delta, self.conversion())

    def charges(self) -> list[Charge]:
        """Everything charged: the Gaussian history and the curve steps."""
        return [*self.history, *self.curves]

    def conversion(self, mode: str | None = None) -> str:
        """The accountant the history converts with (once a release of ``mode`` is added, if given).

        The declared accountant, unless the ledger holds (or ``mode`` is) a release that only an RDP
        conversion bounds (:data:`RDP_ONLY_MODES`): then ``"rdp"`` for the whole history.
        """
        if mode in RDP_ONLY_MODES or any(m in RDP_ONLY_MODES for m in self.modes) \
                or bool(self.curves):
            return RDP_CONVERSION
        return self.accountant

    def remaining(self) -> float:
        """``max(0, epsilon_budget − spent())``; ``inf`` for an unlimited budget.

        ε does not compose additively, so this is a report, not the ε of the next release.
        """
        if math.isinf(self.epsilon_budget):
            return math.inf
        return max(0.0, self.epsilon_budget - self.spent())

    def unit(self) -> str:
        """What the cumulative ε protects.

        ``"client"`` if every release was client-level, else ``"record"`` (the weaker
        guarantee that all releases share).
        """
        return UNIT_CLIENT if self.modes and all(m in CLIENT_LEVEL_MODES for m in self.modes) else UNIT_RECORD

    def rounds_joined(self) -> int:
        """Number of distinct (run, server round) pairs in which something was recorded."""
        return len(set(zip(self.run_ids, self.rounds, strict=True)))

    def would_exceed(self, noise_multiplier: float, sample_rate: float, steps: int) -> bool:
        """Whether recording ``(σ, q, steps)`` would take cumulative ε past the budget.

        The projected ε (history plus the new entry, composed by the accountant, not
        added) is compared with the budget by :func:`privacy.accountants.exceeds_budget`,
        whose relative slack ``BUDGET_RTOL`` absorbs float round-off between a plan
        calibrated in one piece and the same plan recorded round by round.
        """
        step: Step = check_release(noise_multiplier, sample_rate, steps)
        projected = epsilon_of_valid([*self.charges(), step], self.delta, self.conversion())
        return exceeds_budget(projected, self.epsilon_budget)

    def would_exceed_release(self, charges: Sequence[Charge], run_id: int, mode: str | None = None) -> bool:
        """Whether recording ``charges`` would take cumulative ε past the budget or the run's cap.

        ``mode`` is the release's (:meth:`conversion`: an RDP-only release is projected through RDP).
        """
        if not charges:
            return False
        projected = epsilon_of_valid([*self.charges(), *charges], self.delta, self.conversion(mode))
        return exceeds_budget(projected, self.limit(run_id))

    def record(
        self,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        *,
        server_round: int,
        run_id: int,
        mode: str = UNKNOWN_MODE,
    ) -> None:
        """Charge ``steps`` runs of a q-subsampled Gaussian mechanism with multiplier σ (one release).

        ``mode`` is the DP mode the release came from (it decides :meth:`unit`).

        Raises
        ------
        PrivacyBudgetExhausted
            If the new cumulative ε would exceed the budget; the ledger is unchanged.
        ValueError
            If an argument is out of its domain; the ledger is unchanged.
        """
        step = check_release(noise_multiplier, sample_rate, steps)
        self.record_release([step], server_round=check_int("server_round", server_round, minimum=0),
                            run_id=check_int("run_id", run_id, minimum=0), mode=mode)

    def record_release(self, charges: Sequence[Charge], *, server_round: int, run_id: int, mode: str) -> None:
        """Record one release and charge its mechanisms (none: a release an earlier charge paid for).

        The arguments come from a mechanism (:mod:`privacy.mechanisms`) and are trusted.

        Raises
        ------
        PrivacyBudgetExhausted
            If the new cumulative ε would exceed the budget or the run's cap; the ledger is
            unchanged.
        """
        if charges:
            projected = epsilon_of_valid([*self.charges(), *charges], self.delta, self.conversion(mode))
            limit = self.limit(run_id)
            if exceeds_budget(projected, limit):
                what = "budget" if limit == self.epsilon_budget else f"run {run_id}'s cap"
                last = charges[-1]
                what_step = last.describe() if isinstance(last, CurveStep) else \
                    f"(sigma={last[0]:g}, q={last[1]:g}, steps={last[2]})"
                raise PrivacyBudgetExhausted(
                    f"recording {what_step} in round {server_round} would spend "
                    f"epsilon={projected:.6g} > {what} {limit:g} (delta={self.delta:g}, already spent "
                    f"{self.spent():.6g}); nothing recorded")
            for step in charges:
                if isinstance(step, CurveStep):
                    merge_curve(self.curves, step)
                else:
                    merge_step(self.history, step)
        self.rounds.append(server_round)
        self.run_ids.append(run_id)
        self.modes.append(str(mode))

    def limit(self, run_id: int) -> float:
        """The ε the ledger may reach in run ``run_id``: its budget, or the run's cap if lower."""
        run = self.runs.get(run_id)
        return self.epsilon_budget if run is None else min(self.epsilon_budget, run.cap)

    def releases_in_run(self, run_id: int) -> int:
        """How many releases this ledger recorded in run ``run_id``."""
        return self.run_ids.count(run_id)

    def run(self, run_id: int) -> RunPlan | None:
        """The plan the client fixed for run ``run_id`` (None: none yet)."""
        return self.runs.get(run_id)

    def open_run(self, run_id: int, plan: RunPlan) -> None:
        """Fix run ``run_id``'s cap and mechanism (kept when the ledger is stored)."""
        self.runs[run_id] = plan

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state; an infinite budget is stored as ``null``."""
        spent = self.spent()
        state: dict[str, Any] = {
            "schema_version": CURVE_SCHEMA_VERSION if self.curves else LEDGER_SCHEMA_VERSION,
            "kind": LEDGER_KIND,
            "epsilon_budget": self.epsilon_budget if math.isfinite(self.epsilon_budget) else None,
            "delta": self.delta,
            "accountant": self.accountant,
            "history": [[float(s), float(q), int(n)] for s, q, n in self.history],
            "rounds": list(self.rounds),
            "run_ids": list(self.run_ids),
            "modes": list(self.modes),
            "runs": {str(r): plan.to_dict() for r, plan in sorted(self.runs.items())},
            "relation": REPLACE_ONE,
            "epsilon_spent": spent if math.isfinite(spent) else None,
            "unit": self.unit(),
        }
        if self.curves:
            state["curves"] = [c.to_dict() for c in self.curves]
        return state

    def to_json(self) -> str:
        """The ledger as a JSON document (strict JSON: no NaN or Infinity)."""
        return json.dumps(self.to_dict(), allow_nan=False, indent=1)

    @classmethod
    def from_dict(cls, state: Any) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`to_dict` output, validating every field.

        Raises
        ------
        ValueError
            If ``state`` is not a ledger of a supported ``schema_version``, misses a key,
            has an unknown key or an invalid value; the message names the key.
        """
        fields = read_state(state)
        plans = {run_id: RunPlan.from_dict(plan, f"runs.{run_id}") for run_id, plan in fields["runs"].items()}
        return cls(**{**fields, "runs": plans})

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        """Parse :meth:`to_json` output.

        Raises
        ------
        ValueError
            If ``text`` is not valid JSON or not a valid ledger (see :meth:`from_dict`).
        """
        try:
            state = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"ledger is not valid JSON: {exc}") from exc
        return cls.from_dict(state)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ledger to ``path`` atomically and durably (:func:`privacy.private_file.write_private_file`).

        A crash leaves either the old or the new ledger, never a torn one. Parent directories are
        created; the file is readable by its owner only. One writer per file.
        """
        payload = self.to_json().encode("utf-8")
        write_private_file(path, lambda fh: fh.write(payload))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PrivacyLedger:
        """Read a ledger written by :meth:`save`.

        Raises
        ------
        FileNotFoundError
            If ``path`` does not exist.
        ValueError
            If the file is not a valid ledger; the message names the file.
        """
        text = Path(path).read_text(encoding="utf-8")
        try:
            return cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"invalid privacy ledger {os.fspath(path)!r}: {exc}") from exc

    @classmethod
    def load_or_create(
        cls,
        path: str | os.PathLike[str] | None,
        *,
        epsilon_budget: float,
        delta: float,
        accountant: str = "rdp",
    ) -> PrivacyLedger:
        """The ledger at ``path`` if it exists, else a new, empty one (not yet saved).

        A budget belongs to the client's *data*, not to one run, so a stored history is
        always kept. If the stored budget, δ or accountant differ from the declared ones,
        the **declared** values are taken (the operator's current declaration is the
        policy) and a warning is logged; spent ε is then recomputed from the full history
        under the declared δ and accountant. A lowered budget may leave the ledger already
        exhausted: every further release is refused, nothing is erased.

        Parameters
        ----------
        path : path-like or None
            Ledger file; ``None`` for an in-memory ledger.
        epsilon_budget, delta, accountant
            The client's declared budget (see the class attributes).
        """
        declared = cls(epsilon_budget=epsilon_budget, delta=delta, accountant=accountant)
        if path is None or not Path(path).exists():
            return declared
        stored = cls.load(path)
        changes = [
            f"{name} {old!r} -> {new!r}"
            for name, old, new in (
                ("epsilon_budget", stored.epsilon_budget, declared.epsilon_budget),
                ("delta", stored.delta, declared.delta),
                ("accountant", stored.accountant, declared.accountant),
            )
            if old != new
        ]
        if changes:
            log.warning(
                "privacy ledger %s: declared values differ from the stored ones (%s); keeping "
                "the stored history and using the declared values",
                os.fspath(path), ", ".join(changes),
            )
        ledger = cls(
            epsilon_budget=declared.epsilon_budget,
            delta=declared.delta,
            accountant=declared.accountant,
            history=stored.history,
            rounds=stored.rounds,
            run_ids=stored.run_ids,
            modes=stored.modes,
            runs=stored.runs,
            curves=stored.curves,
        )
        if changes and exceeds_budget(ledger.spent(), ledger.epsilon_budget):
            log.warning(
                "privacy ledger %s: already spent epsilon=%.6g exceeds the declared budget %g; "
                "every further release will be refused",
                os.fspath(path), ledger.spent(), ledger.epsilon_budget,
            )
        return ledger

