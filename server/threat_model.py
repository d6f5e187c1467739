"""Which adversary a run's guarantees hold against: the rows of the README's threat-model table.

Every run states its row in ``summary.json`` and the privacy report. The adversaries, from the
weakest to the strongest:

``observer``
    Anyone who sees the trained models (and other clients, honest-but-curious).
``follows-protocol``
    A server that follows the protocol but looks at everything it receives.
``deviates``
    A server that deviates: sends different clients different messages, lies about counts,
    forwards other keys, runs longer than it declared.
``deviates-with-clients``
    A deviating server colluding with some clients (fewer than the secure sums' threshold).

What holds, by mechanism (the tests that show it in brackets):

* DP-SGD, and one clipped update with local noise, without secure sums: every release is charged
  by the client that makes it, from figures it computes itself; no server message can make it
  release more than its ledger charged (tests/attacks, tests/privacy/test_privacy_replace_one.py):
  **deviates-with-clients**.
* A secure sum with a roster: members authenticate each other's keys and agree on the survivors
  before unmasking (tests/attacks/test_secure_sum_attacks.py): **deviates-with-clients**, up to
  t − 1 colluding members (k of them who reveal their noise leave σ√((r_min − k)/m)).
* A secure sum without a roster: **follows-protocol** (the same attacks then expose a member's
  update: tests/attacks/test_secure_sum_attacks.py shows it).
* GDPFed's groups: the charged ε assumes the sample is drawn as declared and kept from the
  adversary (amplification by subsampling), so it holds against **observer**; against the server,
  each release is the group sum's Gaussian mechanism without amplification, and a client never
  makes more releases than the T it paid for, nor at another σ_m (tests/attacks/test_deviating_counts.py).
* DP-FedC's rigorous release: as one clipped update (**deviates-with-clients**); its paper
  calibration is a nominal figure (**observer**, and only nominally).
* ``noise-source = "seeded"``: nothing against whoever knows the seed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ROWS", "threat_model"]

#: row -> the adversary, in words
ROWS: dict[str, str] = {
    "observer": "observers of the trained models and other (honest-but-curious) clients",
    "follows-protocol": "a server that follows the protocol, and observers of the models",
    "deviates": "a server that deviates from the protocol, and observers of the models",
    "deviates-with-clients": "a server that deviates from the protocol and colludes with fewer clients than the "
                             "secure sums' threshold, and observers of the models",
}


def threat_model(*, private: bool, secure: bool, roster: bool, group_sums: bool, nominal: bool,
                 seeded: bool) -> dict[str, Any]:
    """The run's row and its sentence (``summary.json`` and the privacy report)."""
    if not private:
        row, why = "", "a non-private run: no guarantee"
    elif seeded:
        row, why = "", "noise seeded from the run seed: no guarantee against whoever knows it"
    elif nominal:
        row, why = "observer", "DP-FedC's paper calibration is a nominal figure (see its section)"
    elif group_sums:
        row, why = "observer", ("GDPFed's charge assumes the sample is drawn as declared and kept from the adversary; "
                                "against the server each release is unamplified, and no client releases more than "
                                "the T rounds it paid for")
    elif secure and not roster:
        row, why = "follows-protocol", ("secure sums without a roster: nothing authenticates the members' keys or "
                                        "their agreement on the survivors")
    else:
        row, why = "deviates-with-clients", ("every release is charged by the client that makes it"
                                             + ("; secure sums authenticated against the roster" if secure else ""))
    return {"row": row, "holds_against": ROWS.get(row, "no one"), "why": why}
