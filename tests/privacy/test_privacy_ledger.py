"""privacy.ledger: a client never spends past its budget, and its record survives restarts."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np
import pytest

from privacy.accountants import REPLACE_ONE, epsilon_of
from privacy.calibration import noise_multiplier_for
from privacy.exceptions import PrivacyBudgetExhausted
from privacy.ledger import PrivacyLedger

DELTA = 1e-5


def _ledger(budget: float = 2.0, accountant: str = "rdp") -> PrivacyLedger:
    return PrivacyLedger(epsilon_budget=budget, delta=DELTA, accountant=accountant)


def test_new_ledger_spends_nothing() -> None:
    """Non-private mode: nothing is recorded, spent stays 0."""
    ledger = _ledger(3.0)
    assert ledger.spent() == 0.0 and ledger.remaining() == 3.0
    assert ledger.history == [] and ledger.rounds == [] and ledger.run_ids == []
    assert PrivacyLedger.from_json(ledger.to_json()).spent() == 0.0


def test_record_updates_history_and_rounds() -> None:
    ledger = _ledger(10.0)
    ledger.record(1.2, 0.05, 40, server_round=1, run_id=7, mode="dpsgd")
    ledger.record(1.2, 0.05, 40, server_round=2, run_id=7, mode="dpsgd")
    ledger.record(3.0, 1.0, 1, server_round=3, run_id=7, mode="update")
    assert ledger.history == [(1.2, 0.05, 80), (3.0, 1.0, 1)]
    assert ledger.rounds == [1, 2, 3] and ledger.run_ids == [7, 7, 7]
    assert ledger.modes == ["dpsgd", "dpsgd", "update"]
    assert ledger.unit() == "record"  # a DP-SGD release protects one record only
    ledger.record(3.0, 1.0, 1, server_round=3, run_id=7)  # a second release in round 3
    ledger.record(3.0, 1.0, 1, server_round=1, run_id=8)  # round 1 of another run
    assert ledger.rounds_joined() == 4
    assert ledger.history == [(1.2, 0.05, 80), (3.0, 1.0, 3)]
    assert ledger.spent() == epsilon_of([(1.2, 0.05, 80), (3.0, 1.0, 3)], DELTA)
    assert ledger.remaining() == pytest.approx(10.0 - ledger.spent())


def test_unit_is_client_only_when_every_release_was_client_level() -> None:
    ledger = _ledger(10.0)
    ledger.record(3.0, 1.0, 1, server_round=1, run_id=1, mode="update")
    assert ledger.unit() == "client"
    ledger.record(3.0, 0.05, 10, server_round=2, run_id=2, mode="dpsgd")
    assert ledger.unit() == "record"  # composing with a record-level release: the weaker guarantee
    assert PrivacyLedger.from_json(ledger.to_json()).unit() == "record"


def test_a_version_1_ledger_loads_reaccounted_under_replace_one() -> None:
    v1 = {"schema_version": 1, "kind": "privet-privacy-ledger", "epsilon_budget": 10.0, "delta": DELTA,
          "accountant": "rdp", "history": [[3.0, 1.0, 2]], "rounds": [1, 2], "run_ids": [5, 5],
          "epsilon_spent": 1.0}
    ledger = PrivacyLedger.from_dict(v1)
    assert ledger.modes == ["unknown", "unknown"] and ledger.unit() == "record"
    assert ledger.spent() == epsilon_of([(3.0, 1.0, 2)], DELTA, "rdp", REPLACE_ONE)  # not the stored 1.0
    assert json.loads(ledger.to_json())["schema_version"] == 3


def test_never_exceeds_budget_random_sequences() -> None:
    """Seeded random releases until exhaustion; refused ones leave the ledger untouched."""
    rng = np.random.default_rng(4)
    for trial in range(4):
        ledger = _ledger(float(rng.uniform(0.5, 4.0)))
        refused = 0
        for round_ in range(25):
            sigma = float(rng.choice([0.8, 1.0, 1.7, 3.0, 6.0]))
            q = float(rng.choice([0.01, 0.05, 1.0]))
            steps = int(rng.integers(1, 60))
            before = ledger.to_json()
            predicted = ledger.would_exceed(sigma, q, steps)
            assert ledger.to_json() == before  # would_exceed is a pure query
            try:
                ledger.record(sigma, q, steps, server_round=round_, run_id=trial)
            except PrivacyBudgetExhausted:
                refused += 1
                assert predicted
                assert ledger.to_json() == before
            else:
                assert not predicted
            assert ledger.spent() <= ledger.epsilon_budget * (1 + 1e-9)
        assert refused > 0  # the sequences do hit the budget


def test_calibrated_plan_is_accepted_round_by_round_then_refused() -> None:
    """σ calibrated for T rounds fits the budget exactly when recorded one round at a time."""
    budget, q, steps_per_round, rounds = 1.5, 0.02, 25, 8
    ledger = _ledger(budget)
    sigma = noise_multiplier_for(budget, DELTA, q, steps_per_round * rounds)
    for r in range(1, rounds + 1):
        assert not ledger.would_exceed(sigma, q, steps_per_round)
        ledger.record(sigma, q, steps_per_round, server_round=r, run_id=1)
    assert budget - 0.02 <= ledger.spent() <= budget
    assert ledger.would_exceed(sigma, q, steps_per_round)
    with pytest.raises(PrivacyBudgetExhausted, match="would spend"):
        ledger.record(sigma, q, steps_per_round, server_round=rounds + 1, run_id=1)
    assert ledger.rounds == list(range(1, rounds + 1))


def test_a_refusal_records_nothing() -> None:
    """A refused release leaves the ledger as it was (the privacy package needs nothing of Flower's)."""
    ledger = _ledger(0.5)
    with pytest.raises(PrivacyBudgetExhausted, match="would spend"):
        ledger.record(0.5, 1.0, 10, server_round=1, run_id=1)
    assert ledger.history == [] and ledger.spent() == 0.0 and ledger.rounds == []


def test_no_noise_is_infinite_epsilon() -> None:
    ledger = _ledger(100.0)
    with pytest.raises(PrivacyBudgetExhausted):
        ledger.record(0.0, 0.1, 1, server_round=1, run_id=1)
    unlimited = _ledger(math.inf)
    unlimited.record(0.0, 0.1, 1, server_round=1, run_id=1)
    assert unlimited.spent() == math.inf and unlimited.remaining() == math.inf


def test_prv_ledger() -> None:
    ledger = _ledger(1.0, accountant="prv")
    ledger.record(2.0, 0.02, 100, server_round=1, run_id=1)
    assert ledger.spent() == epsilon_of([(2.0, 0.02, 100)], DELTA, accountant="prv")
    assert ledger.spent() <= epsilon_of([(2.0, 0.02, 100)], DELTA, accountant="rdp")


@pytest.mark.parametrize(
    "args", [(-1.0, 0.1, 1), (1.0, 0.0, 1), (1.0, 0.1, 0), (1.0, 1.1, 1), (1.0, 0.1, 2.0)]
)
def test_record_rejects_bad_release(args: tuple[float, float, int]) -> None:
    ledger = _ledger()
    with pytest.raises(ValueError):
        ledger.record(*args, server_round=1, run_id=1)
    with pytest.raises(ValueError):
        ledger.record(1.0, 0.1, 1, server_round=-1, run_id=1)
    assert ledger.history == [] and ledger.rounds == []


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"epsilon_budget": 0.0}, "epsilon_budget"), ({"epsilon_budget": -1.0}, "epsilon_budget"),
     ({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"), ({"accountant": "gdp"}, "accountant"),
     ({"history": [(1.0, 0.1)]}, r"history\[0\]"), ({"rounds": [1]}, "rounds")],
)
def test_constructor_validates(kwargs: dict[str, object], name: str) -> None:
    args: dict[str, object] = {"epsilon_budget": 1.0, "delta": DELTA}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        PrivacyLedger(**args)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- persistence
def _used_ledger(budget: float = 8.0) -> PrivacyLedger:
    ledger = _ledger(budget)
    ledger.record(1.1, 0.03, 50, server_round=1, run_id=2**60)
    ledger.record(2.0, 1.0, 1, server_round=2, run_id=2**60)
    return ledger


def test_json_round_trip() -> None:
    ledger = _used_ledger()
    text = ledger.to_json()
    state = json.loads(text)
    assert state["schema_version"] == 3 and state["epsilon_spent"] == pytest.approx(ledger.spent())
    assert state["relation"] == "replace-one"
    restored = PrivacyLedger.from_json(text)
    assert restored == ledger
    assert restored.spent() == ledger.spent()
    unlimited = PrivacyLedger(epsilon_budget=math.inf, delta=DELTA)
    assert json.loads(unlimited.to_json())["epsilon_budget"] is None
    assert PrivacyLedger.from_json(unlimited.to_json()) == unlimited


def test_atomic_save_then_load(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "client-3.json"
    ledger = _used_ledger()
    ledger.save(path)
    assert PrivacyLedger.load(path) == ledger
    ledger.record(3.0, 1.0, 1, server_round=3, run_id=5)
    ledger.save(path)  # overwrite
    assert PrivacyLedger.load(path) == ledger
    assert sorted(p.name for p in path.parent.iterdir()) == ["client-3.json"]  # no temp left


def test_failed_save_keeps_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.json"
    old = _used_ledger()
    old.save(path)
    before = path.read_bytes()
    new = _used_ledger()
    new.record(3.0, 1.0, 1, server_round=3, run_id=1)

    def crash(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        new.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_restart_continues_from_saved_spending(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    first = PrivacyLedger.load_or_create(path, epsilon_budget=8.0, delta=DELTA)
    assert first.spent() == 0.0 and not path.exists()  # created in memory only
    first.record(1.5, 0.05, 100, server_round=1, run_id=1)
    first.save(path)
    spent = first.spent()

    second = PrivacyLedger.load_or_create(path, epsilon_budget=8.0, delta=DELTA)  # new process
    assert second.spent() == spent and second.history == first.history
    second.record(1.5, 0.05, 100, server_round=1, run_id=2)
    assert second.spent() == epsilon_of([(1.5, 0.05, 200)], DELTA)
    assert second.run_ids == [1, 2]


def test_load_or_create_takes_declared_budget_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.json"
    _used_ledger(budget=8.0).save(path)
    with caplog.at_level(logging.WARNING, logger="privacy.ledger"):
        ledger = PrivacyLedger.load_or_create(
            path, epsilon_budget=0.5, delta=1e-6, accountant="prv"
        )
    assert (ledger.epsilon_budget, ledger.delta, ledger.accountant) == (0.5, 1e-6, "prv")
    assert ledger.history == _used_ledger().history  # the data's history is never dropped
    assert "epsilon_budget 8.0 -> 0.5" in caplog.text
    assert "exceeds the declared budget" in caplog.text
    assert ledger.remaining() == 0.0
    assert ledger.would_exceed(10.0, 0.01, 1)


def test_load_or_create_without_path() -> None:
    ledger = PrivacyLedger.load_or_create(None, epsilon_budget=1.0, delta=DELTA, accountant="prv")
    assert ledger == PrivacyLedger(epsilon_budget=1.0, delta=DELTA, accountant="prv")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"schema_version": 1}', "missing"),
    ],
)
def test_malformed_json_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrivacyLedger.from_json(text)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("schema_version", 5, "schema_version"),
        ("kind", "something-else", "kind"),
        ("epsilon_budget", -1.0, "epsilon_budget"),
        ("epsilon_budget", "3", "epsilon_budget"),
        ("delta", 0.0, "delta"),
        ("accountant", "moments", "accountant"),
        ("history", {"a": 1}, "history"),
        ("history", [[1.0, 0.1, -5]], r"history\[0\] num_steps"),
        ("history", [[1.0, 0.1, 1.5]], r"history\[0\] num_steps"),
        ("rounds", [1], "one entry per record"),
        ("run_ids", [1, "x"], r"run_ids\[1\]"),
        ("unexpected", 1, "unexpected"),
    ],
)
def test_malformed_ledger_fields(key: str, value: object, message: str) -> None:
    state = json.loads(_used_ledger().to_json())
    state[key] = value
    with pytest.raises(ValueError, match=message):
        PrivacyLedger.from_json(json.dumps(state))


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"schema_version": 1', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json"):
        PrivacyLedger.load(path)
    with pytest.raises(ValueError, match="broken.json"):
        PrivacyLedger.load_or_create(path, epsilon_budget=1.0, delta=DELTA)
