"""The privacy ledger's JSON layout: its schema versions, and the check of a stored state.

A ledger file (:meth:`privacy.ledger.PrivacyLedger.save`) is one JSON object of ``kind``
:data:`LEDGER_KIND`. Every version still loads:

=========  ===================================================================================
version    layout
=========  ===================================================================================
1          ``history`` (σ, q, n triples), ``rounds``, ``run_ids``: re-accounted under
           replace-one, every release of mode :data:`UNKNOWN_MODE`
2          + ``modes`` (each release's DP mode) and ``relation`` (always ``replace-one``)
3          + ``runs`` (each run's plan: :class:`privacy.ledger.RunPlan`) — written by default
4          + ``curves`` (steps charged by their own RDP curve, :class:`privacy.accountants.CurveStep`)
           — written only by a ledger that holds one
=========  ===================================================================================

``epsilon_spent`` and ``unit`` are written for people and ignored on load: ε spent is always
recomputed from the history.
"""

from __future__ import annotations

from typing import Any, Final

from privacy.accountants import REPLACE_ONE
from privacy.checks import check_int
from privacy.poisson_rdp import curve_step_from_dict

__all__ = ["CURVE_SCHEMA_VERSION", "LEDGER_KIND", "LEDGER_SCHEMA_VERSION", "UNKNOWN_MODE", "read_state"]

#: Value of the ``"kind"`` field that marks a file as a privet privacy ledger.
LEDGER_KIND: Final = "privet-privacy-ledger"
#: Version of the ledger JSON layout (module docstring).
LEDGER_SCHEMA_VERSION: Final = 3
#: Version of a ledger whose history holds a step with its own RDP curve (a JSON object, not a triple).
CURVE_SCHEMA_VERSION: Final = 4
#: The DP mode of a release whose mode was not recorded (a version-1 ledger's; protects a record).
UNKNOWN_MODE: Final = "unknown"

_REQUIRED_KEYS = ("schema_version", "kind", "epsilon_budget", "delta", "accountant", "history", "rounds", "run_ids")
_V2_KEYS = ("modes", "relation")
_V3_KEYS = ("runs",)
_OPTIONAL_V4_KEYS = ("curves",)
_INFORMATIONAL_KEYS = ("epsilon_spent", "unit")  # written for humans, ignored (recomputed) on load


def read_state(state: Any) -> dict[str, Any]:
    """The ledger's fields from a stored state, its layout checked (a value's own checks are the ledger's).

    Returns
    -------
    dict
        ``epsilon_budget`` (``inf`` for ``null``), ``delta``, ``accountant``, ``history``, ``rounds``,
        ``run_ids``, ``modes`` (:data:`UNKNOWN_MODE` for each release of a version-1 file), ``runs``
        (run id -> the stored plan, still to be read by :meth:`privacy.ledger.RunPlan.from_dict`) and
        ``curves`` (read: :class:`privacy.accountants.CurveStep`).

    Raises
    ------
    ValueError
        If ``state`` is not a ledger of a supported ``schema_version``, misses a key, has an unknown
        key, or a field of the wrong type; the message names the key.
    """
    if not isinstance(state, dict):
        raise ValueError(f"ledger must be a JSON object; found {type(state).__name__}")
    version = check_int("schema_version", state.get("schema_version"), minimum=0)
    if version not in (1, 2, LEDGER_SCHEMA_VERSION, CURVE_SCHEMA_VERSION):
        raise ValueError(f"ledger schema_version {version} is not supported; supported: 1, 2, "
                         f"{LEDGER_SCHEMA_VERSION}, {CURVE_SCHEMA_VERSION}")
    required = _REQUIRED_KEYS + (_V2_KEYS if version >= 2 else ()) + (_V3_KEYS if version >= 3 else ())
    missing = [k for k in required if k not in state]
    optional = _OPTIONAL_V4_KEYS if version >= CURVE_SCHEMA_VERSION else ()
    unknown = sorted(str(k) for k in state if k not in required + optional + _INFORMATIONAL_KEYS)
    if missing or unknown:
        raise ValueError(
            f"ledger keys must be {list(required)} (plus optional "
            f"{list(_INFORMATIONAL_KEYS)}); missing {missing}, unexpected {unknown}"
        )
    if state["kind"] != LEDGER_KIND:
        raise ValueError(f"ledger 'kind' must be {LEDGER_KIND!r}; found {state['kind']!r}")
    if version >= 2 and state["relation"] != REPLACE_ONE:
        raise ValueError(f"ledger 'relation' must be {REPLACE_ONE!r}; found {state['relation']!r}")
    for name in ("history", "rounds", "run_ids"):
        if not isinstance(state[name], list):
            raise ValueError(f"ledger '{name}' must be a list; found {state[name]!r}")
    modes = state["modes"] if version >= 2 else [UNKNOWN_MODE] * len(state["rounds"])
    if not isinstance(modes, list):
        raise ValueError(f"ledger 'modes' must be a list; found {modes!r}")
    runs = state["runs"] if version >= 3 else {}
    if not isinstance(runs, dict):
        raise ValueError(f"ledger 'runs' must be an object; found {runs!r}")
    for key in runs:
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"ledger 'runs' keys must be run ids; found {key!r}")
    raw_curves = state.get("curves", []) if version >= CURVE_SCHEMA_VERSION else []
    if not isinstance(raw_curves, list):
        raise ValueError(f"ledger 'curves' must be a list; found {raw_curves!r}")
    budget = state["epsilon_budget"]
    return {"epsilon_budget": float("inf") if budget is None else budget, "delta": state["delta"],
            "accountant": state["accountant"], "history": list(state["history"]), "rounds": list(state["rounds"]),
            "run_ids": list(state["run_ids"]), "modes": list(modes),
            "runs": {int(key): plan for key, plan in runs.items()},
            "curves": [curve_step_from_dict(c, f"curves[{i}]") for i, c in enumerate(raw_curves)]}
