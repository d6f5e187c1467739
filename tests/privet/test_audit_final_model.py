"""``privet audit``'s black-box view of DP-SGD: the final model, queried on the canary records (issue 37).

The ``dpsgd-final`` game runs the same client DP-SGD as ``dpsgd`` but the adversary holds only the
model released after the last round and reads each canary through forward passes. Two checks: the
queries recover exactly the weight change they stand for (an independent computation), and at a
full batch (q = 1: every step holds every canary) the honest mechanism is seen and not flagged
while noise at half σ is flagged, with the same charge.
"""

from __future__ import annotations

import numpy as np
import pytest

from privet.audit_cmd import audit
from privet.audit_dpsgd import RECORD_FEATURE, _queried_change
from privet.audit_games import game
from tests.privet.test_audit_games_more import STEPS, half_sigma_dpsgd

#: DP-SGD at ε = 4 over T = 1 round, one full batch of the 1,000-record shard per step (q = 1).
FULL_BATCH = [*STEPS, "batch-size=1000"]


def test_queries_of_the_final_model_recover_the_canary_coordinates_of_its_weight_change():
    from tasks.models import build_model, get_weights, set_weights

    m, clip = 7, 1.5
    model = build_model("logreg", input_shape=(1, 1, m), num_classes=2, seed=3)
    initial = [w.copy() for w in get_weights(model)]
    rng = np.random.default_rng(0)
    final = [w + rng.normal(size=w.shape).astype(np.float32) for w in initial]
    set_weights(model, final)
    probes = np.zeros((m, 1, 1, m), dtype=np.float32)
    probes[np.arange(m), 0, 0, np.arange(m)] = RECORD_FEATURE * clip
    recovered = _queried_change(model, initial, probes, RECORD_FEATURE * clip)
    np.testing.assert_allclose(recovered, (final[0] - initial[0]).astype(np.float64), atol=1e-4)
    np.testing.assert_array_equal(get_weights(model)[0], final[0])  # the queries leave the final model in place


def test_the_final_model_view_sees_honest_canaries_and_flags_half_sigma():
    assert game("dpsgd-final").mechanism == "dpsgd" and game("dpsgd-final").level == "record"
    (honest,) = audit(None, FULL_BATCH, canaries=1000, seed=8, games=["dpsgd-final"]).audits
    (broken,) = audit(None, FULL_BATCH, canaries=1000, seed=8, games=["dpsgd-final"],
                      mechanism_hook=half_sigma_dpsgd).audits
    assert honest.game == "dpsgd-final" and honest.sample_rate == 1.0
    assert not honest.flagged, honest.line()
    assert 0.5 < honest.result.lower_bound <= honest.result.charged_epsilon
    assert broken.flagged, broken.line()
    assert broken.result.charged_epsilon == pytest.approx(honest.result.charged_epsilon) == pytest.approx(4.0, rel=1e-3)
