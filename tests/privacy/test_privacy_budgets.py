"""privacy.budgets: PFA Table 1 and GDPFed budgets, deterministic per (client, seed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from privacy.budgets import (
    BUDGET_DISTRIBUTIONS,
    GDPFED_FMNIST_GROUPS,
    MIN_BUDGET,
    budget_for,
    budgets_for,
    group_of,
)

ROOT = Path(__file__).resolve().parents[2]
N = 6000  # clients for the distributional checks; ~0.3 s per distribution


@pytest.fixture(scope="module")
def draws() -> dict[str, np.ndarray]:
    return {name: np.array(budgets_for(name, N, seed=123)) for name in BUDGET_DISTRIBUTIONS}


@pytest.mark.parametrize("name", BUDGET_DISTRIBUTIONS)
def test_positive_finite(name: str, draws: dict[str, np.ndarray]) -> None:
    values = draws[name]
    assert values.shape == (N,)
    assert np.isfinite(values).all() and (values > 0).all()


@pytest.mark.parametrize("name", BUDGET_DISTRIBUTIONS)
def test_deterministic_per_client_and_seed(name: str) -> None:
    a = [budget_for(name, i, num_clients=50, seed=9) for i in range(50)]
    b = [budget_for(name, i, num_clients=50, seed=9) for i in reversed(range(50))][::-1]
    assert a == b  # order of evaluation does not matter
    assert a == budgets_for(name, 50, seed=9)


def test_independent_of_process() -> None:
    """A fresh interpreter (another client, another run) computes the same budgets."""
    code = (
        "import json; from privacy.budgets import budgets_for, BUDGET_DISTRIBUTIONS;"
        "print(json.dumps({n: budgets_for(n, 20, seed=77) for n in BUDGET_DISTRIBUTIONS}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    there = json.loads(out.stdout)
    here = {n: budgets_for(n, 20, seed=77) for n in BUDGET_DISTRIBUTIONS}
    assert there == here


def test_seed_and_client_change_random_draws() -> None:
    for name in ("uniform", "gauss", "pareto", "mixgauss4"):
        by_seed = {budget_for(name, 3, num_clients=10, seed=s) for s in range(20)}
        by_client = {budget_for(name, i, num_clients=10, seed=0) for i in range(10)}
        assert len(by_seed) > 5 and len(by_client) > 5
    # a client's draw does not depend on the federation size
    assert budget_for("uniform", 3, num_clients=10, seed=1) == budget_for(
        "uniform", 3, num_clients=1000, seed=1
    )
    assert budget_for("gauss", 0, num_clients=1, seed=-5) != budget_for(
        "gauss", 0, num_clients=1, seed=5
    )


def test_constant(draws: dict[str, np.ndarray]) -> None:
    assert (draws["constant"] == 3.0).all()
    assert budget_for("constant", 0, num_clients=1, seed=0, epsilon=0.7) == 0.7


def test_uniform_is_u_1_10(draws: dict[str, np.ndarray]) -> None:
    values = draws["uniform"]
    assert values.min() >= 1.0 and values.max() < 10.0
    assert stats.kstest(values, stats.uniform(loc=1.0, scale=9.0).cdf).pvalue > 1e-3
    custom = budgets_for("uniform", 200, seed=1, epsilon_min=2.0, epsilon_max=2.5)
    assert min(custom) >= 2.0 and max(custom) < 2.5


def test_gauss_is_n_3_1(draws: dict[str, np.ndarray]) -> None:
    values = draws["gauss"]
    assert values.min() >= MIN_BUDGET
    # truncation at 0.01 removes 0.14 % of the mass: invisible at this sample size
    assert stats.kstest(values, stats.norm(loc=3.0, scale=1.0).cdf).pvalue > 1e-3


def test_pareto_scale_half_shape_one(draws: dict[str, np.ndarray]) -> None:
    values = draws["pareto"]
    assert values.min() >= 0.5
    assert stats.kstest(values, stats.pareto(b=1.0, scale=0.5).cdf).pvalue > 1e-3
    assert np.median(values) == pytest.approx(1.0, rel=0.1)  # P(ε > x) = 0.5/x


# (name, [(weight, mean, std)]) verbatim from PFA Table 1 (std as second parameter)
TABLE_1 = {
    "mixgauss1": [(0.9, 0.1, 0.01), (0.1, 10.0, 0.1)],
    "mixgauss2": [(0.9, 0.5, 0.01), (0.1, 10.0, 0.1)],
    "mixgauss3": [(0.9, 1.0, 0.1), (0.1, 10.0, 0.1)],
    "mixgauss4": [(0.5, 0.1, 0.01), (0.4, 1.0, 0.1), (0.1, 10.0, 1.0)],
}


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_mixtures_match_table_1(name: str, draws: dict[str, np.ndarray]) -> None:
    """Components are > 10 std apart: assign each draw to the nearest mean, then check
    the mixture weights (3 binomial sd) and each component's mean and std."""
    values = draws[name]
    components = TABLE_1[name]
    means = np.array([m for _, m, _ in components])
    label = np.abs(values[:, None] - means[None, :]).argmin(axis=1)
    for k, (weight, mean, std) in enumerate(components):
        members = values[label == k]
        share = members.size / N
        assert abs(share - weight) <= 3 * math.sqrt(weight * (1 - weight) / N) + 1e-9
        assert members.mean() == pytest.approx(mean, abs=4 * std / math.sqrt(members.size))
        assert members.std() == pytest.approx(std, rel=0.1)


def test_groups_gdpfed_default(draws: dict[str, np.ndarray]) -> None:
    values = draws["groups"]
    assert GDPFED_FMNIST_GROUPS == (0.5, 1.5, 3.0)
    assert values.tolist() == [0.5] * 2000 + [1.5] * 2000 + [3.0] * 2000


def test_groups_custom_and_uneven() -> None:
    got = budgets_for("groups", 10, seed=0, groups=(2.0, 6.0, 12.0))
    assert got == [2.0] * 4 + [6.0] * 3 + [12.0] * 3


@pytest.mark.parametrize(("n", "m"), [(10, 3), (6000, 3), (7, 7), (5, 1), (3, 5)])
def test_group_of_contiguous_equal_sizes(n: int, m: int) -> None:
    groups = [group_of(i, n, m) for i in range(n)]
    assert groups == sorted(groups)  # contiguous by id
    sizes = np.bincount(groups, minlength=m)
    assert sizes.sum() == n and sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize("ratio", [(1, 4, 1), (2, 2, 2), (3, 2, 1), (1, 2, 3), (5, 1), (1,)])
@pytest.mark.parametrize("n", [6000, 601, 7])
def test_group_ratio_sizes_within_one_of_the_ratio(n: int, ratio: tuple[int, ...]) -> None:
    groups = [group_of(i, n, len(ratio), ratio) for i in range(n)]
    assert groups == sorted(groups)  # contiguous by id, strict groups first
    sizes = np.bincount(groups, minlength=len(ratio))
    exact = n * np.asarray(ratio) / sum(ratio)
    assert sizes.sum() == n and np.all(np.abs(sizes - exact) < 1)


def test_equal_ratio_is_the_equal_split() -> None:
    for n in (10, 601, 6000):
        assert [group_of(i, n, 3, (2, 2, 2)) for i in range(n)] == [group_of(i, n, 3) for i in range(n)]


def test_groups_in_the_papers_proportions() -> None:
    got = budgets_for("groups", 6000, seed=3, groups=(0.25, 0.75, 1.5), group_ratio=(1, 4, 1))
    assert got == [0.25] * 1000 + [0.75] * 4000 + [1.5] * 1000


@pytest.mark.parametrize("ratio", [(1, 2), (1, 0, 1), (1.5, 1, 1), "1,1,1"])
def test_bad_group_ratio_is_refused(ratio: object) -> None:
    with pytest.raises(ValueError, match="ratio"):
        group_of(0, 10, 3, ratio)  # type: ignore[arg-type]


def test_unknown_distribution_lists_allowed() -> None:
    with pytest.raises(ValueError, match=r"'constant'.*'mixgauss4'.*'groups'.*'zipf'"):
        budget_for("zipf", 0, num_clients=1, seed=0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"client_id": 5}, "client_id"),
        ({"client_id": -1}, "client_id"),
        ({"num_clients": 0}, "num_clients"),
        ({"seed": 1.5}, "seed"),
        ({"distribution": "constant", "epsilon": 0.0}, "epsilon"),
        ({"distribution": "constant", "epsilon": math.inf}, "epsilon"),
        ({"epsilon_min": 0.0}, "epsilon_min"),
        ({"epsilon_min": 5.0, "epsilon_max": 2.0}, "epsilon_max"),
        ({"distribution": "groups", "groups": ()}, "groups"),
        ({"distribution": "groups", "groups": (1.0, -2.0)}, r"groups\[1\]"),
    ],
)
def test_invalid_parameters(kwargs: dict[str, object], name: str) -> None:
    args: dict[str, object] = {
        "distribution": "uniform", "client_id": 0, "num_clients": 5, "seed": 0
    }
    args.update(kwargs)
    distribution, client_id = args.pop("distribution"), args.pop("client_id")
    with pytest.raises(ValueError, match=name):
        budget_for(distribution, client_id, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["uniform", "mixgauss1", "groups", "pareto"])
def test_a_client_draws_its_own_budget_alone_and_it_equals_the_full_draw(name: str) -> None:
    """A simulated client computes only its own budget (O(1) per message, whatever N), and
    that is exactly its entry of the all-clients draw the server side uses."""
    from client.profile import simulated_budget
    from protocol.run_settings import RunSettings

    raw = {"budget-distribution": name, "seed": 7, "epsilon": 3.0, "epsilon-min": 1.0, "epsilon-max": 10.0}
    cfg = RunSettings.of(raw)
    everyone = budgets_for(name, 200, seed=7, epsilon=3.0, epsilon_min=1.0, epsilon_max=10.0)
    assert [simulated_budget(cfg, i, 200) for i in range(200)] == everyone
    assert simulated_budget(cfg, 5, 200, reference="minimum") == min(everyone)
    assert simulated_budget(cfg, 5, 200, reference="maximum") == max(everyone)
    # the strategy's name is not what decides it (issue 10): the message's budget reference is
    assert simulated_budget(RunSettings.of({**raw, "strategy": "maximum"}), 5, 200) == everyone[5]


def test_a_budget_reference_is_for_simulation_only() -> None:
    """PFA's Maximum oracle gives every simulated client the largest budget; a site that declares
    its own budget keeps it whatever the server's message says, and a bad reference is an error."""
    from client.profile import resolve_profile, simulated_budget
    from protocol.run_settings import RunSettings

    run = {"budget-distribution": "uniform", "seed": 7, "epsilon": 3.0, "epsilon-min": 1.0, "epsilon-max": 10.0}
    site = {"partition-id": 0, "num-partitions": 4, "epsilon": 2.0}
    assert resolve_profile(site, run, "maximum").epsilon_budget == 2.0
    simulated = {"partition-id": 0, "num-partitions": 4}
    everyone = budgets_for("uniform", 4, seed=7, epsilon_min=1.0, epsilon_max=10.0)
    assert resolve_profile(simulated, run, "maximum").epsilon_budget == max(everyone)
    with pytest.raises(ValueError, match="'budget-reference' must be one of minimum, maximum"):
        simulated_budget(RunSettings.of(run), 0, 4, reference="everything")


@pytest.mark.parametrize("num_clients", [7, 20, 30, 101])
@pytest.mark.parametrize("distribution", ["mixgauss1", "mixgauss3", "mixgauss4"])
def test_exact_components_give_every_seed_the_same_count_per_component(distribution, num_clients):
    """Under ``components="exact"`` component k holds ⌈n·W_k⌉ − ⌈n·W_{k−1}⌉ clients on every
    seed (the PFA authors' draw makes it binomial: 0 high-ε clients on some seeds)."""
    from privacy.budgets import MIXTURES

    components = MIXTURES[distribution]
    cumulative = np.cumsum([round(100 * w) for w, _, _ in components])
    expected = np.diff([0, *(-(-num_clients * c // cumulative[-1]) for c in cumulative)])

    def component(eps: float) -> int:  # the nearest mean, in units of its std
        return int(np.argmin([abs(eps - mean) / std for _, mean, std in components]))

    drawn_counts = set()
    for seed in range(12):
        exact = budgets_for(distribution, num_clients, seed=seed, components="exact")
        counts = np.bincount([component(e) for e in exact], minlength=len(components))
        assert counts.tolist() == expected.tolist(), seed
        drawn = budgets_for(distribution, num_clients, seed=seed)
        drawn_counts.add(tuple(np.bincount([component(e) for e in drawn], minlength=len(components))))
    assert len(drawn_counts) > 1  # the default draw does vary the counts


def test_exact_components_are_a_permutation_of_the_ids_not_the_first_ids():
    high = [{i for i, e in enumerate(budgets_for("mixgauss1", 20, seed=s, components="exact")) if e > 5}
            for s in range(6)]
    assert all(len(h) == 2 for h in high) and len({frozenset(h) for h in high}) > 1


def test_the_default_draw_is_unchanged_by_the_components_option():
    assert budgets_for("mixgauss1", 30, seed=5) == budgets_for("mixgauss1", 30, seed=5, components="drawn")
    with pytest.raises(ValueError, match="components must be one of"):
        budgets_for("mixgauss1", 30, seed=5, components="fixed")
