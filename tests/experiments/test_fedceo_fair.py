"""The FedCEO fair-test driver runs again exactly the test runs a re-tuning made stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fedceo_fair", ROOT / "experiments" / "fedceo" / "fair.py")
assert _spec is not None and _spec.loader is not None
fair = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fair)


def _record(**config):
    return {"config": {"seed": 1, **config}}


def test_a_test_run_made_at_another_lambda_or_theta_is_run_again():
    done = {"test/fedceo/seed1/": _record(**{"fedceo.lambda": 0.4964, "fedceo.theta": 1.0}),
            "test/udp-fedavg/seed1/": _record(strategy="udp-fedavg", **{"fedceo.lambda": 0.03})}
    same = {"seed": 1, "fedceo.lambda": 0.4964, "fedceo.theta": 1.0}
    assert not fair.needs_run(done, "test/fedceo/seed1/", same)
    assert fair.needs_run(done, "test/fedceo/seed1/", {**same, "fedceo.lambda": 0.9928})
    assert fair.needs_run(done, "test/fedceo/seed1/", {**same, "fedceo.theta": 1.06})
    assert fair.needs_run(done, "test/fedceo/seed2/", same)  # never run
    # UDP-FedAvg's runs carry the regime's default λ, unchanged by tuning: shared, not re-run
    assert not fair.needs_run(done, "test/udp-fedavg/seed1/", {"seed": 1, "fedceo.lambda": 0.03})
