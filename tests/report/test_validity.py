"""External validity (tmem_bench.report.validity): Kendall's tau against hand-computed cases and a
plain pair count, its seed-bootstrap interval on rankings with known answers, and the scores read
from the committed toy runs and from an external run's table."""
import itertools
import math

import numpy as np
import pandas as pd
import pytest

from tests.helpers import ROOT
from tmem_bench.errors import UsageError
from tmem_bench.report.data import RunData, load_run
from tmem_bench.report.validity import (Score, critical_tau, external_scores, kendall_tau, tau_interval,
                                        toy_scores, validity_markdown, validity_table)


@pytest.mark.parametrize("x, y, tau", [
    ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
    ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
    ([1, 2, 3, 4], [1, 3, 2, 4], 4 / 6),  # 5 concordant pairs, 1 discordant, of 6
    ([1, 1, 2], [1, 2, 3], 2 / math.sqrt(2 * 3)),  # tau-b: 2 untied pairs in x, 3 in y
    ([1, 2, 3], [5, 5, 5], math.nan),  # no untied pair in y: undefined
])
def test_kendall_tau_on_hand_computed_cases(x, y, tau):
    got = kendall_tau(x, y)
    assert (math.isnan(got) and math.isnan(tau)) or got == pytest.approx(tau)


def pair_count_tau(x, y):
    """tau-b by counting pairs one at a time."""
    concordant = discordant = tied_x = tied_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = x[i] - x[j], y[i] - y[j]
        tied_x += dx == 0
        tied_y += dy == 0
        if dx * dy > 0:
            concordant += 1
        elif dx * dy < 0:
            discordant += 1
    n = len(x) * (len(x) - 1) / 2
    return (concordant - discordant) / math.sqrt((n - tied_x) * (n - tied_y))


def test_kendall_tau_agrees_with_counting_pairs_and_with_scipy_on_random_rankings_with_ties():
    from scipy.stats import kendalltau

    rng = np.random.default_rng(0)
    for _ in range(50):
        x, y = rng.integers(0, 4, 7), rng.integers(0, 4, 7)
        if len(set(x)) > 1 and len(set(y)) > 1:
            assert kendall_tau(x, y) == pytest.approx(pair_count_tau(x, y))
            assert kendall_tau(x, y) == pytest.approx(kendalltau(x, y, variant="b").statistic)


def test_critical_tau_is_the_exact_permutation_threshold():
    assert math.isnan(critical_tau(4))  # the most extreme of 24 orderings, both ways, is p = 2/24 > 0.05
    assert critical_tau(5) == 1.0  # p(|tau| = 1) = 2/120; p(|tau| >= 0.8) = 10/120 > 0.05
    assert critical_tau(7) == pytest.approx(15 / 21)  # S >= 15 of 21 pairs, as the tables give
    with pytest.raises(ValueError):
        critical_tau(10)


def score(name, means, spread=0.0, seeds=3, kind="toy"):
    """Each model's seeds spread evenly around its mean."""
    offsets = np.linspace(-spread, spread, seeds)
    return Score(name, kind, {label: tuple(m + offsets) for label, m in means.items()})


MODELS = ["a", "b", "c", "d", "e"]


def test_the_interval_of_rankings_the_seeds_never_reorder_is_the_point():
    toy = score("toy", dict(zip(MODELS, [0.1, 0.2, 0.3, 0.4, 0.5])), spread=0.01)
    same = score("ext", dict(zip(MODELS, [1, 2, 3, 4, 5])), spread=0.1, kind="external")
    reverse = score("ext", dict(zip(MODELS, [5, 4, 3, 2, 1])), spread=0.1, kind="external")
    r = tau_interval(toy, same)
    assert (r["tau"], r["low"], r["high"], r["n_models"]) == (1.0, 1.0, 1.0, 5)
    r = tau_interval(toy, reverse)
    assert (r["tau"], r["low"], r["high"]) == (-1.0, -1.0, -1.0)


def test_seeds_that_overlap_widen_the_interval_around_the_point_and_the_same_seed_gives_the_same_interval():
    toy = score("toy", dict(zip(MODELS, [0.1, 0.2, 0.3, 0.4, 0.5])), spread=0.15)
    ext = score("ext", dict(zip(MODELS, [1, 2, 3, 4, 5])), spread=1.5, kind="external")
    r = tau_interval(toy, ext, n_boot=500)
    assert r["tau"] == 1.0 and -1 <= r["low"] < 1.0 and r["high"] == 1.0
    assert tau_interval(toy, ext, n_boot=500) == r


def test_only_the_models_both_scores_have_are_ranked():
    toy = score("toy", {"a": 1, "b": 2, "c": 3, "x": 0})
    ext = score("ext", {"a": 1, "b": 2, "c": 3, "y": 9}, kind="external")
    r = tau_interval(toy, ext)
    assert r["models"] == ["a", "b", "c"] and r["tau"] == 1.0
    assert math.isnan(tau_interval(toy, score("ext", {"a": 1}, kind="external"))["tau"])


def test_toy_scores_are_the_memory_forcing_accuracies_at_the_trained_level_of_the_committed_runs():
    study = toy_scores(load_run(ROOT / "docs/runs/study_converge"))
    assert [s.name for s in study] == ["study_converge: coordinate_binding @ n_writes=10,noise=0.05",
                                       "study_converge: map_building @ horizon=8",
                                       "study_converge: occlusion @ occlusion_len=2"]
    assert all(set(s.values) == {"base", "delta", "linear", "lstm", "slots", "ssm", "tensor"} for s in study)
    assert all(len(v) == 3 for s in study for v in s.values.values())  # the chosen lr's three seeds
    capacity = toy_scores(load_run(ROOT / "docs/runs/capacity_converge"))
    assert [s.name.split("n_writes=")[1].split(",")[0] for s in capacity] == ["5", "10", "20", "40"]


def external_run(returns: dict[str, list[float]]) -> RunData:
    rows = [{"task": "popgym_repeat_first", "train_level": "difficulty=1", "label": label, "seed": seed,
             "trained_at_level": True, "status": "finished", "accuracy": (r + 1) / 2, "normalised_return": r,
             "variant": "standard"}
            for label, values in returns.items() for seed, r in enumerate(values)]
    return RunData("ext", None, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), {})


def test_a_toy_ranking_the_external_run_shares_has_tau_one_and_the_table_says_so():
    study = load_run(ROOT / "docs/runs/study_converge")
    coordinate = toy_scores(study)[0]
    order = sorted(coordinate.values, key=lambda m: np.mean(coordinate.values[m]))
    external = external_run({m: [i / 10, i / 10 + 0.01] for i, m in enumerate(order)})
    names = [s.name for s in external_scores(external)]
    assert names == ["repeat_first @ difficulty=1 accuracy", "repeat_first @ difficulty=1 return",
                     "mean return over environments"]
    table = validity_table([study], external, n_boot=200)
    row = table[(table["toy"] == coordinate.name) & (table["external"] == names[1])].iloc[0]
    assert row["tau"] == 1.0 and row["n_models"] == 7
    text = validity_markdown(table, ["study_converge"], "ext", 200)
    assert "|tau| >= 0.71" in text and f"| {coordinate.name} | +1.00" in text
    assert "(200 resamples, seeded)" in text  # the count the table was made with, not the default


def test_a_run_without_returns_is_refused_as_external():
    with pytest.raises(UsageError, match="no closed-loop returns"):
        external_scores(load_run(ROOT / "docs/runs/study_converge"))
