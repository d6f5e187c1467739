"""Paired seed comparisons of the reproduction drivers (privet.paired, PFA's reproduce.py) and PFA's learning-rate tuning."""

from __future__ import annotations

import importlib.util
import re
import statistics
import warnings
from pathlib import Path

import pytest

from privet.paired import bootstrap_interval, paired_gaps

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pfa_reproduce", ROOT / "experiments" / "pfa" / "reproduce.py")
assert _spec is not None and _spec.loader is not None
reproduce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reproduce)


def test_interval_is_translation_equivariant_and_holds_the_mean():
    gaps = [-11.6, 9.6, -4.4, -1.3, -2.5]
    low, high = bootstrap_interval(gaps)
    assert min(gaps) <= low <= statistics.fmean(gaps) <= high <= max(gaps)
    shifted = bootstrap_interval([g + 7.0 for g in gaps])  # same resampling, every mean moves by 7
    assert shifted == pytest.approx((low + 7.0, high + 7.0))
    assert bootstrap_interval(gaps) == (low, high)  # seeded: a rebuilt report is the same


def test_interval_narrows_as_the_seeds_agree_and_collapses_when_they_all_do():
    spread = bootstrap_interval([-4.0, 0.0, 4.0, 8.0, 12.0])
    tight = bootstrap_interval([3.0, 3.5, 4.0, 4.5, 5.0])
    assert tight[1] - tight[0] < spread[1] - spread[0]
    assert bootstrap_interval([2.5] * 5) == (2.5, 2.5)
    with pytest.raises(ValueError):
        bootstrap_interval([])


def test_gaps_pair_only_seeds_both_methods_ran():
    assert paired_gaps({1: 0.7, 2: 0.6, 4: 0.5}, {2: 0.5, 1: 0.4, 3: 0.9}) == pytest.approx({1: 0.3, 2: 0.1})


def _run(method: str, seed: int, final: float, last10: float) -> dict[str, object]:
    return {"method": method, "seed": seed, "final_accuracy": final, "last10_accuracy": last10}


def test_report_line_is_the_difference_of_the_two_methods_means():
    pfa = {1: (0.70, 0.71), 2: (0.66, 0.64), 3: (0.73, 0.70)}
    weiavg = {1: (0.60, 0.62), 2: (0.69, 0.65), 3: (0.55, 0.50), 4: (0.9, 0.9)}  # seed 4: unpaired
    rows = [_run("pfa", s, *v) for s, v in pfa.items()] + [_run("weiavg", s, *v) for s, v in weiavg.items()]
    lines = [line for line in reproduce.paired_lines(rows) if line]
    assert len(lines) == 1 and lines[0].startswith("PFA − WeiAvg, paired on seeds 1, 2, 3 ")
    numbers = [float(x) for x in re.findall(r"[+-]\d+\.\d", lines[0])]
    final_gap, last10_gap = numbers[0], numbers[3]
    # mean of the paired gaps = difference of the means over the common seeds (linearity)
    assert final_gap == pytest.approx(100 * (statistics.fmean(v[0] for v in pfa.values())
                                             - statistics.fmean(weiavg[s][0] for s in pfa)), abs=0.05)
    assert last10_gap == pytest.approx(100 * (statistics.fmean(v[1] for v in pfa.values())
                                              - statistics.fmean(weiavg[s][1] for s in pfa)), abs=0.05)
    assert numbers[-3:] == pytest.approx([+9.0, -1.0, +20.0], abs=0.05)  # last 10, per seed


def test_no_paired_line_from_a_single_common_seed_or_from_records_without_last_10():
    rows = [_run("pfa", 0, 0.7, 0.7), _run("weiavg", 0, 0.6, 0.6), _run("pfa-plus", 0, 0.7, 0.7)]
    assert reproduce.paired_lines(rows) == []
    older = [{"method": m, "seed": s, "final_accuracy": 0.5, "last3_accuracy": 0.5}
             for m in ("pfa", "weiavg") for s in (1, 2)]
    assert reproduce.paired_lines(older) == []


def _validation_run(method: str, lr: float, rounds: int, last10: float, seed: int = 0,
                    split: str = "validation") -> dict[str, object]:
    return {"setting": "s", "method": method, "seed": seed, "last10_accuracy": last10,
            "config": {"evaluation-split": split, "calibration": "accountant",
                       "learning-rate": lr, "num-server-rounds": rounds}}


def test_tuning_compares_rates_within_the_longest_horizon_only():
    # At 25 rounds the fast rate wins by far; at 50 the slow one does. Pooling both horizons
    # would pick 0.025 (.665 vs .575); the 50-round runs alone pick 0.01.
    records = [_validation_run("pfa", 0.025, 25, 0.80), _validation_run("pfa", 0.01, 25, 0.50),
               _validation_run("pfa", 0.025, 50, 0.53), _validation_run("pfa", 0.01, 50, 0.65),
               _validation_run("weiavg", 0.005, 25, 0.40), _validation_run("weiavg", 0.0025, 25, 0.30)]
    with pytest.warns(reproduce.TuningCaveat):   # each pick is at an edge of its two rates
        best = reproduce.tuned_learning_rates(records)
    assert best[("s", "pfa", "accountant")] == 0.01
    assert best[("s", "pfa-plus", "accountant")] == 0.01      # inherits PFA's rate
    assert best[("s", "weiavg", "accountant")] == 0.005       # only tuned at 25 rounds


def test_tuning_averages_seeds_and_ignores_test_runs():
    records = [_validation_run("pfa", 0.01, 50, 0.70, seed=0), _validation_run("pfa", 0.01, 50, 0.50, seed=1),
               _validation_run("pfa", 0.005, 50, 0.62, seed=0),
               _validation_run("pfa", 0.05, 50, 0.99, split="test")]
    with pytest.warns(reproduce.TuningCaveat):
        assert reproduce.tuned_learning_rates(records)[("s", "pfa", "accountant")] == 0.005


def test_tuning_warns_where_the_longest_horizon_cannot_vouch_for_its_pick():
    inside = [_validation_run("pfa", lr, 50, acc) for lr, acc in ((0.005, 0.60), (0.01, 0.65), (0.025, 0.55))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reproduce.tuned_learning_rates(inside)[("s", "pfa", "accountant")] == 0.01
    # A single rate at the longest horizon: nothing was compared, whatever the 25-round runs said.
    lone = [_validation_run("weiavg", 0.0025, 50, 0.28), _validation_run("weiavg", 0.01, 25, 0.30),
            _validation_run("weiavg", 0.0025, 25, 0.25)]
    with pytest.warns(reproduce.TuningCaveat, match=r"weiavg / accountant: learning rate 0.0025 is the only rate"):
        reproduce.tuned_learning_rates(lone)
    # The smallest rate tried wins: a smaller one might do better still.
    edge = [_validation_run("minimum", lr, 50, acc) for lr, acc in ((0.001, 0.38), (0.005, 0.35))]
    with pytest.warns(reproduce.TuningCaveat, match=r"0.001 is the smallest of the rates tuned over 50 rounds \(0.001, 0.005\)"):
        reproduce.tuned_learning_rates(edge)


def test_tuning_caveats_only_for_the_picks_a_run_uses():
    # Two methods tuned at 50 rounds: WeiAvg's pick sits at an edge, PFA's inside its grid.
    records = [_validation_run("weiavg", lr, 50, acc) for lr, acc in ((0.001, 0.38), (0.005, 0.35))]
    records += [_validation_run("pfa", lr, 50, acc) for lr, acc in ((0.005, 0.60), (0.01, 0.65), (0.025, 0.55))]
    pfa, weiavg = ("s", "pfa", "accountant"), ("s", "weiavg", "accountant")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a run of PFA (or of PFA+, at PFA's rate) hears nothing of WeiAvg
        assert reproduce.tuned_learning_rates(records, requested={pfa})[pfa] == 0.01
        assert reproduce.tuned_learning_rates(records, requested={("s", "pfa-plus", "accountant")})[weiavg] == 0.001
    with pytest.warns(reproduce.TuningCaveat, match=r"weiavg / accountant: learning rate 0.001 is the smallest"):
        reproduce.tuned_learning_rates(records, requested={pfa, weiavg})
    # PFA+ borrowing an edge pick from PFA hears PFA's caveat.
    edge_pfa = [_validation_run("pfa", lr, 50, acc) for lr, acc in ((0.01, 0.65), (0.025, 0.55))]
    with pytest.warns(reproduce.TuningCaveat, match=r"s / pfa / accountant: learning rate 0.01 is the smallest"):
        reproduce.tuned_learning_rates(edge_pfa, requested={("s", "pfa-plus", "accountant")})
