"""Which adversary a run's guarantees hold against: the README's threat-model table, in one place.

Every run states its row in ``summary.json`` and the privacy report; ``scripts/write_docs.py``
writes :data:`CASES` into the README. The adversaries, from the weakest to the strongest:

``observer``
    Anyone who sees the trained models (and other clients, honest-but-curious).
``follows-protocol``
    A server that follows the protocol but looks at everything it receives.
``deviates``
    A server that deviates: sends different clients different messages, lies about counts,
    forwards other keys, runs longer than it declared.
``deviates-with-clients``
    A deviating server colluding with some clients (fewer than the secure sums' threshold).

A run's row is that of the first case of :data:`CASES` that applies to it
(:func:`threat_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CASES", "ROWS", "Case", "threat_model"]

#: row -> the adversary, in words
ROWS: dict[str, str] = {
    "observer": "observers of the trained models and other (honest-but-curious) clients",
    "follows-protocol": "a server that follows the protocol, and observers of the models",
    "deviates": "a server that deviates from the protocol, and observers of the models",
    "deviates-with-clients": "a server that deviates from the protocol and colludes with fewer clients than the "
                             "secure sums' threshold, and observers of the models",
}


@dataclass(frozen=True)
class Case:
    """One kind of run, the strongest adversary its guarantees hold against, why, and the tests that show it."""

    setting: str
    row: str
    why: str
    tests: str


#: from the most specific to the general: a run takes the first case that applies
CASES: tuple[Case, ...] = (
    Case("a non-private run", "", "a non-private run: no guarantee", ""),
    Case('`noise-source = "seeded"`', "", "noise seeded from the run seed: no guarantee against whoever knows it",
         "tests/privacy/test_randomness.py"),
    Case("DP-FedC, `dpfedc.calibration = \"paper\"`", "observer",
         "DP-FedC's paper calibration is a nominal figure (see its section)", "experiments/dpfedc/README.md"),
    Case("GDPFed / GDPFed+ groups", "observer",
         "GDPFed's charge assumes the sample is drawn as declared and kept from the adversary; against the server "
         "each release is unamplified, and no client releases more than the T rounds it paid for, nor at another "
         "sigma_m", "tests/attacks/test_deviating_counts.py"),
    Case("secure sums without a roster", "follows-protocol",
         "secure sums without a roster: nothing authenticates the members' keys or their agreement on the survivors",
         "tests/attacks/test_secure_sum_attacks.py (the attacks expose an update)"),
    Case("secure sums with a roster (`secagg+`, `secagg+ddg`)", "deviates-with-clients",
         "every release is charged by the client that makes it; secure sums authenticated against the roster (up "
         "to t - 1 colluding members; k who reveal their noise leave sigma*sqrt((r_min - k)/m))",
         "tests/attacks/test_secure_sum_attacks.py"),
    Case("DP-SGD, or one clipped update with local noise (no secure sums)", "deviates-with-clients",
         "every release is charged by the client that makes it", "tests/attacks/, tests/client/test_run_cap.py"),
)


def _case(*, private: bool, secure: bool, roster: bool, group_sums: bool, nominal: bool, seeded: bool) -> Case:
    applies = (not private, seeded, nominal, group_sums, secure and not roster, secure, True)
    return next(case for case, hit in zip(CASES, applies, strict=True) if hit)


def threat_model(*, private: bool, secure: bool, roster: bool, group_sums: bool, nominal: bool,
                 seeded: bool) -> dict[str, Any]:
    """The run's row and its sentence (``summary.json`` and the privacy report)."""
    case = _case(private=private, secure=secure, roster=roster, group_sums=group_sums, nominal=nominal,
                 seeded=seeded)
    return {"row": case.row, "holds_against": ROWS.get(case.row, "no one"), "why": case.why}
