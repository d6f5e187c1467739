"""The audit games' registry (privet/audit_games.py): a game's name -> its Game; a kind's first game is its default.

What another engineer relies on when adding a game in its own module with one line in
``GAMES``: every registered entry resolves to a Game of that name, a config whose mechanism
kind has a game selects that kind's first one, ``--game`` selects another of the same kind and
refuses one of another kind, and a kind without a game says so.
"""

from __future__ import annotations

import numpy as np
import pytest

from privacy.mechanism_audit import Observation
from privacy.mechanisms import MECHANISMS
from privet import audit_games
from privet.audit_cmd import audit
from privet.audit_games import GAMES, Game, Played, game, game_for, games

CALLS: list[str] = []


def _fake_play(setup, *, canaries, extension, rng, hook):
    """A game that reports what it was asked (the old (observation, figures) return form)."""
    CALLS.append(setup.train.dp_mode)
    secrets = rng.choice(np.array([-1, 1]), size=canaries)
    obs = Observation(secrets, np.zeros(canaries), np.zeros(canaries), ((1.0, 1.0, 1),), "replace-one", 1)
    return obs, {"mechanism": "update", "accountant": "prv", "noise_multiplier": 1.0, "sample_rate": 1.0,
                 "clip": 1.0, "steps": 1, "rounds_requested": extension, "releases_per_canary": 1, "mine": 7}


#: A stand-in registered for the update kind in one test (module-level, as a game module's would be).
FAKE = Game("fake-update", "update", "client", "nothing (a registry test)", _fake_play)
FAKE_2 = Game("fake-update-2", "update", "client", "nothing either (a second game of the kind)", _fake_play)


def test_every_registered_game_resolves_and_audits_a_known_mechanism_kind():
    found = games()
    assert [g.name for g in found] == list(GAMES)
    assert all(isinstance(g, Game) for g in found)
    kinds = [g.mechanism for g in found]
    assert set(kinds) <= set(MECHANISMS)
    assert {g.level for g in found} <= {"client", "record"}
    for g in found:  # a kind's default is its first registered game
        assert game_for(g.mechanism) is next(f for f in found if f.mechanism == g.mechanism)
    assert game_for("dpsgd").name == "dpsgd" and game("dpsgd-steps").mechanism == "dpsgd"


def test_an_unknown_name_is_refused_naming_the_registered_ones():
    with pytest.raises(KeyError, match="update"):
        game("no-such-game")


def test_a_registered_entry_that_is_not_its_game_is_refused(monkeypatch):
    monkeypatch.setitem(GAMES, "dpsgd", "privet.audit_games:UPDATE")  # a typo in the one-line edit
    with pytest.raises(ValueError, match="not a Game named 'dpsgd'"):
        game("dpsgd")


def test_a_game_registered_by_one_line_is_the_one_the_audit_runs(monkeypatch):
    """Registering a game for a kind makes ``privet audit`` run it, and its extra figures reach audit.json."""
    monkeypatch.setattr(audit_games, "GAMES", {"fake-update": f"{__name__}:FAKE"})
    CALLS.clear()
    report = audit(None, ["dp-mode=update", "num-server-rounds=1"], canaries=40, extension=3, seed=0)
    (a,) = report.audits
    assert CALLS == ["update"]
    assert (a.game, a.observes, a.rounds_requested) == ("fake-update", FAKE.observes, 3)
    assert a.details == {"mine": 7} and a.to_dict()["details"] == {"mine": 7}


def test_a_kind_without_a_game_is_not_audited_and_the_report_says_so(monkeypatch):
    monkeypatch.setattr(audit_games, "GAMES", {})
    report = audit(None, ["dp-mode=update", "num-server-rounds=1"])
    assert report.audits == () and report.not_audited == ("mechanism update: no canary game yet",)


def test_played_of_names_the_missing_figures():
    obs = Observation(np.ones(2), np.zeros(2), np.zeros(2), (), "replace-one", 0)
    with pytest.raises(KeyError, match="clip"):
        Played.of(obs, {"mechanism": "update", "accountant": "prv", "noise_multiplier": 1.0, "sample_rate": 1.0,
                        "steps": 1, "rounds_requested": 1, "releases_per_canary": 1})


def test_game_names_a_later_game_of_the_kind_and_refuses_one_of_another_kind(monkeypatch, capsys):
    from privet.cli import main
    from privet.run_config import CliError

    monkeypatch.setattr(audit_games, "GAMES", {"fake-update": f"{__name__}:FAKE", "fake-update-2": f"{__name__}:FAKE_2",
                                               "dpsgd-steps": "privet.audit_dpsgd_steps:DPSGD_STEPS"})
    sets = ["dp-mode=update", "num-server-rounds=1"]
    assert [a.game for a in audit(None, sets, canaries=40, seed=0).audits] == ["fake-update"]
    assert [a.game for a in audit(None, sets, canaries=40, seed=0, games=["fake-update-2"]).audits] == ["fake-update-2"]
    with pytest.raises(CliError, match=r"--game 'dpsgd-steps' does not audit .*\(update\); one of: fake-update, "
                                       r"fake-update-2"):
        audit(None, sets, games=["dpsgd-steps"])
    assert main(["audit", "--set", "dp-mode=update", "--game", "no-such-game"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--game 'no-such-game'" in err[0], err
