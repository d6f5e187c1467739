"""privacy.dp_modes: the one registry of DP modes, against first principles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privacy.dp_modes import DP_MODES, dp_mode
from protocol import keys


def test_the_wire_names_are_the_registry():
    assert keys.DP_MODES == tuple(DP_MODES) and {keys.DP_SGD, keys.DP_UPDATE, keys.DP_NONE} == set(DP_MODES)


@pytest.mark.parametrize("m", [1, 2, 5, 30])
def test_update_mode_charges_what_the_server_sees(m):
    """m shares of N(0, σ²C²/m): one upload is N(0, (σ/√m)²C²), a sum of r is N(0, (σ√(r/m))²C²)."""
    update, sigma = dp_mode("update"), 1.7
    assert update.charged(sigma, m) == pytest.approx(sigma / math.sqrt(m))
    for r in range(1, m + 1):
        charged = update.charged(sigma, m, r)
        # the std of a sum of r shares, simulated, in units of C
        draws = np.random.default_rng(r).normal(0, sigma / math.sqrt(m), (20_000, r)).sum(axis=1)
        assert charged == pytest.approx(float(np.std(draws)), rel=0.03)
    assert update.charged(sigma, m, m) == pytest.approx(sigma)  # all shares: the full σ


def test_dpsgd_charges_sigma_and_releases_the_poisson_rate_and_steps():
    dpsgd = dp_mode("dpsgd")
    assert dpsgd.charged(1.3, noise_shares=4) == 1.3
    q, steps = dpsgd.release(num_examples=1000, batch_size=64, epochs=3)
    assert q == pytest.approx(1 / math.ceil(1000 / 64)) and steps == 3 * math.ceil(1000 / 64)
    assert dp_mode("update").release(1000, 64, 3) == (1.0, 1)


def test_none_charges_nothing_and_says_so():
    none = dp_mode("none")
    assert not none.private and none.charged(5.0) == 0.0 and "non-private" in none.mechanism()


def test_the_guarantee_sentence_names_the_secure_floor():
    text = dp_mode("update").mechanism(noise_shares=5, secure_floor=3)
    assert "secure sum" in text and "sqrt(3/5)" in text
    assert "no secure aggregation" in dp_mode("update").mechanism(noise_shares=5)


def test_an_unknown_mode_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"'dp-mode' must be one of dpsgd, update, none; found 'ldp'"):
        dp_mode("ldp")
