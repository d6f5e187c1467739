"""A run's threat-model row is never stronger than its weakest part allows, and every case is reachable."""

from __future__ import annotations

import itertools

from server.threat_model import CASES, ROWS, threat_model

STRENGTH = {"": 0, "observer": 1, "follows-protocol": 2, "deviates": 3, "deviates-with-clients": 4}
FLAGS = ("private", "secure", "roster", "group_sums", "nominal", "seeded")


def _every_run():
    for bits in itertools.product((False, True), repeat=len(FLAGS)):
        run = dict(zip(FLAGS, bits, strict=True))
        yield run, threat_model(**run)


def test_the_weakest_part_bounds_the_row():
    for run, got in _every_run():
        strength = STRENGTH[got["row"]]
        if not run["private"] or run["seeded"]:
            assert strength == 0, run
        if run["nominal"] or run["group_sums"]:
            assert strength <= STRENGTH["observer"], run
        if run["secure"] and not run["roster"]:
            assert strength <= STRENGTH["follows-protocol"], run
        assert got["holds_against"] == ROWS.get(got["row"], "no one")


def test_every_case_is_some_run_and_only_plain_private_runs_reach_the_top():
    reached = {got["why"] for _, got in _every_run()}
    assert reached == {case.why for case in CASES}
    for run, got in _every_run():
        if got["row"] == "deviates-with-clients":
            assert run["private"] and not (run["seeded"] or run["nominal"] or run["group_sums"])
            assert run["roster"] or not run["secure"]
