"""An entry's fields from its run: the profile id counts only what plans the run's task, and the settings
do not depend on the order of the cells."""
from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT
from tmem_bench.leaderboard.entry import builtin_profile_text, profile_id


def test_a_profile_id_counts_only_what_plans_the_runs_task():
    quick = builtin_profile_text("quick")
    other_section = quick.replace("[tasks.no_harm]\n", "[tasks.no_harm]\n# edited\n").replace(
        'levels = {}\ntrain = { steps = 100', 'levels = {}\ntrain = { steps = 101')
    assert other_section != quick
    assert profile_id("quick", other_section, {}, "coordinate_binding") == "quick"
    assert profile_id("quick", other_section, {}, "no_harm").startswith("quick~")
    assert profile_id("quick", other_section, {}, "all").startswith("quick~")
    described = quick.replace('description = "', 'description = "Edited: ')
    assert described != quick and profile_id("quick", described, {}, "all") == "quick"
    own_section = quick.replace("train = { steps = 500, lr = 1e-3 }", "train = { steps = 501, lr = 1e-3 }")
    assert own_section != quick and profile_id("quick", own_section, {}, "coordinate_binding").startswith("quick~")


@pytest.mark.parametrize("label", ["tensor", "slots"])
def test_settings_do_not_depend_on_the_order_of_the_cells(label):
    """A profile that trains at several levels (capacity: steps and length grow with W) gives one
    entry's settings from its smallest level, in whatever order submit and validate read the cells."""
    from tmem_bench.leaderboard.entry import settings

    cells = ROOT / "docs" / "runs" / "capacity" / "cells"
    results = [r for r in (json.loads(p.read_text()) for p in sorted(cells.glob("*.json")))
               if r["cell"]["label"] == label]
    assert len({r["cell"]["train_level"]["n_writes"] for r in results}) == 4
    (first,) = settings(results)
    assert settings(results[::-1]) == [first] == settings(sorted(results, key=lambda r: r["cell"]["seed"]))
    smallest = [r for r in results if r["cell"]["train_level"]["n_writes"] == 5]
    assert first["train"]["steps"] == smallest[0]["cell"]["train"]["steps"] == 500
    assert first["state_size"]["seq_len"] == smallest[0]["causality"]["seq_len"]


def _results(accuracies: list[float]) -> list[dict]:
    """One cell result per seed, each evaluated once at its training level with the given accuracy."""
    level = {"n_writes": 10}
    return [{"cell": {"task": "coordinate_binding", "variant": "standard", "train_level": level,
                      "eval_levels": [level], "seed": seed},
             "eval": [{"level": level, "level_key": "n_writes=10", "accuracy": accuracy, "chance": 0.03,
                       "ceiling": 1.0, "n": 1000}]} for seed, accuracy in enumerate(accuracies)]


def test_an_entrys_interval_follows_the_reports_rule():
    """Issue 43: Student's t interval below 5 seeds, the percentile bootstrap from 5, a point for one;
    three seeds no longer collapse to the bootstrap's narrow interval."""
    import numpy as np
    from scipy import stats

    from tmem_bench.leaderboard.entry import aggregate
    from tmem_bench.report.stats import bootstrap_ci

    three = [0.62, 0.70, 0.66]
    (row,), _ = aggregate(_results(three))
    low, high = stats.t.interval(0.95, len(three) - 1, loc=np.mean(three), scale=stats.sem(three))
    assert (row["mean"], row["low"], row["high"]) == pytest.approx((np.mean(three), low, high))
    _, boot_low, boot_high = bootstrap_ci(three)
    assert row["high"] - row["low"] > boot_high - boot_low  # the bootstrap of three values is too narrow
    (row,), _ = aggregate(_results([0.62]))
    assert row["mean"] == row["low"] == row["high"] == 0.62
    five = [0.62, 0.70, 0.66, 0.64, 0.68]
    (row,), _ = aggregate(_results(five))
    assert (row["mean"], row["low"], row["high"]) == bootstrap_ci(five)


def test_an_entrys_t_interval_stays_within_0_and_1():
    """A t interval of few seeds near the ceiling reaches past 100%; the entry stores it clipped (the
    schema holds fractions, and a mean of accuracies lies in [0, 1])."""
    from tmem_bench.leaderboard.entry import aggregate

    (row,), _ = aggregate(_results([0.98, 1.0, 1.0]))
    assert row["high"] == 1.0 and 0.0 < row["low"] < row["mean"] < 1.0
