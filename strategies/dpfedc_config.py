"""DP-FedC's run-config section and its cross-checks, beside its catalogue entry.

The section itself is :class:`protocol.dpfedc.DPFedCConfig` (the clients read it too, to load
their data); what it requires of the rest of the run config is :func:`check`.
"""

from __future__ import annotations

from typing import Any

from protocol import keys
from protocol.dpfedc import DPFedCConfig

__all__ = ["DPFedCConfig", "check"]


def check(cfg: Any) -> None:
    """What DP-FedC requires of a validated RunConfig ``cfg``; ValueError naming the key."""
    d = cfg.dpfedc
    if cfg.evaluation_split != "test":
        raise ValueError("'evaluation-split' applies to trained models; DP-FedC scores its clustering on "
                         "'dpfedc.eval-samples' (leave 'evaluation-split' = 'test')")
    if (d.calibration == "none") != (cfg.resolved_dp_mode == keys.DP_NONE):
        raise ValueError("'dpfedc.calibration' = 'none' goes with 'dp-mode' = 'none' (and "
                         "'budget-distribution' = 'none'); a private run needs 'rigorous' or 'paper'")
    if d.calibration == "paper" and not d.grad_clip > 0:
        raise ValueError("'dpfedc.calibration' = 'paper' needs 'dpfedc.grad-clip' (G) > 0: eq. (29) "
                         "assumes every minibatch gradient is bounded by G")


def calibrates_without_budget(cfg: Any) -> bool:
    """The paper's calibration sets the noise from eps-bar, not from a client's budget."""
    return bool(cfg.dpfedc.calibration == "paper")
