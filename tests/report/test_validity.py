"""External validity (tmem_bench.report.validity): Kendall's tau against hand-computed cases and a
plain pair count; the permutation test, the model-resampling intervals and Holm's correction on
synthetic rankings (a perfect order, a random one, ties) against scipy; the scores read from the
committed toy runs and from an external run's table, and the values refused there; the hypothesis
read, and its pair confirmatory only where it was stated before the external run's first cell."""
import itertools
import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from tests.helpers import ROOT
from tmem_bench.errors import UsageError
from tmem_bench.report.data import RunData, load_run
from tmem_bench.report.hypothesis import read_hypothesis
from tmem_bench.report.rank_stats import critical_tau, holm, kendall_tau, model_interval, permutation_p, rho_rows
from tmem_bench.report.validity import (MEAN_ALL, MEAN_KEPT, external_scores, summary, toy_scores, validity_markdown,
                                        validity_table)


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


def test_toy_scores_are_the_memory_forcing_accuracies_at_the_trained_level_of_the_committed_runs():
    study = toy_scores(load_run(ROOT / "docs/runs/study_converge"))
    assert [s.name for s in study] == ["study_converge: coordinate_binding @ n_writes=10,noise=0.05",
                                       "study_converge: map_building @ horizon=8",
                                       "study_converge: occlusion @ occlusion_len=2"]
    assert all(set(s.values) == {"base", "delta", "linear", "lstm", "slots", "ssm", "tensor"} for s in study)
    assert all(len(v) == 3 for s in study for v in s.values.values())  # the chosen lr's three seeds
    capacity = toy_scores(load_run(ROOT / "docs/runs/capacity_converge"))
    assert [s.name.split("n_writes=")[1].split(",")[0] for s in capacity] == ["5", "10", "20", "40"]


def external_run(returns: dict[str, list[float]], manifest=None) -> RunData:
    rows = [{"task": "popgym_repeat_first", "train_level": "difficulty=1", "label": label, "seed": seed,
             "trained_at_level": True, "status": "finished", "accuracy": (r + 1) / 2, "normalised_return": r,
             "variant": "standard", "chance": 0.25, "cell_id": f"{label}{seed}"}
            for label, values in returns.items() for seed, r in enumerate(values)]
    return RunData("ext", manifest, pd.DataFrame(rows), pd.DataFrame(), pd.DataFrame(), {})


def test_a_toy_ranking_the_external_run_shares_has_tau_one_and_the_table_says_so():
    study = load_run(ROOT / "docs/runs/study_converge")
    coordinate = toy_scores(study)[0]
    order = sorted(coordinate.values, key=lambda m: np.mean(coordinate.values[m]))
    external = external_run({m: [i / 10, i / 10 + 0.01] for i, m in enumerate(order)})
    names = [s.name for s in external_scores(external)]
    # the one level is kept (no model within 0.01 of +1, some above chance), so both means are there
    assert names == ["repeat_first @ difficulty=1 accuracy", "repeat_first @ difficulty=1 return",
                     MEAN_ALL, "mean return over kept levels"]
    v = validity_table([study], external, n_boot=200)
    row = v.table[(v.table["toy"] == coordinate.name) & (v.table["external"] == names[1])].iloc[0]
    assert row["tau"] == 1.0 and row["rho"] == 1.0 and row["n_models"] == 7 and row["role"] == "exploratory"
    assert row["tau_p"] == pytest.approx(2 / 5040)  # the observed ordering and its reverse, of 7!
    text = validity_markdown(v, ["study_converge"], "ext", 200)
    assert f"| {coordinate.name} | +1.00" in text and "|tau| >= 0.71" in text
    assert "(200 resamples, seeded" in text  # the count the table was made with, not the default


def test_a_run_without_returns_is_refused_as_external():
    with pytest.raises(UsageError, match="no closed-loop returns"):
        external_scores(load_run(ROOT / "docs/runs/study_converge"))


# The permutation test, the model-resampling interval and Holm's correction against scipy.

PERFECT = (np.arange(7.0), np.arange(7.0) * 3 + 1)
RANDOM = (np.array([0.3, 0.9, 0.1, 0.5, 0.7, 0.2, 0.8]), np.array([0.4, 0.1, 0.6, 0.9, 0.3, 0.8, 0.2]))
TIES = (np.array([1, 1, 2, 2, 3, 3, 4.0]), np.array([2, 1, 1, 3, 3, 5, 5.0]))


def scipy_statistic(name):
    from scipy.stats import kendalltau, spearmanr

    return {"tau": lambda x, y: kendalltau(x, y).statistic, "rho": lambda x, y: spearmanr(x, y).statistic}[name]


@pytest.mark.parametrize("x, y", [PERFECT, RANDOM, TIES], ids=["perfect", "random", "ties"])
@pytest.mark.parametrize("name", ["tau", "rho"])
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_the_exact_permutation_test_gives_scipys_p_value(x, y, name, alternative):
    from scipy.stats import permutation_test

    statistic = scipy_statistic(name)
    want = permutation_test((y,), lambda yy: statistic(x, yy), permutation_type="pairings",
                            alternative=alternative, n_resamples=10_000).pvalue  # 7! = 5040: every ordering
    assert permutation_p(x, y, name, alternative) == pytest.approx(want, abs=1e-12)


def test_the_statistics_are_scipys_on_the_synthetic_rankings():
    for x, y in (PERFECT, RANDOM, TIES):
        assert kendall_tau(x, y) == pytest.approx(scipy_statistic("tau")(x, y))
        assert rho_rows(x, y)[0] == pytest.approx(scipy_statistic("rho")(x, y))


def test_a_perfect_order_is_as_unlikely_as_its_orderings_say_and_kendalltaus_exact_test_agrees():
    from scipy.stats import kendalltau

    x, y = PERFECT
    assert permutation_p(x, y, "tau", "greater") == pytest.approx(1 / 5040)
    assert permutation_p(x, y) == pytest.approx(kendalltau(x, y, method="exact").pvalue)
    x, y = RANDOM
    assert permutation_p(x, y) == pytest.approx(kendalltau(x, y, method="exact").pvalue)


def test_past_n_perm_orderings_the_test_is_monte_carlo_seeded_and_near_scipys():
    from scipy.stats import permutation_test

    rng = np.random.default_rng(3)
    x = rng.random(12)
    y = x + rng.normal(0, 0.4, 12)  # a relation of moderate strength: p neither 0 nor 1
    want = permutation_test((y,), lambda yy: scipy_statistic("tau")(x, yy), permutation_type="pairings",
                            n_resamples=20_000, rng=1).pvalue
    got = permutation_p(x, y, "tau", n_perm=20_000, seed=0)
    assert 0.001 < want < 0.5 and got == pytest.approx(want, abs=4 * math.sqrt(want / 20_000) + 1e-3)
    assert permutation_p(x, y, "tau", n_perm=20_000, seed=0) == got  # seeded
    assert permutation_p(x, y, "tau", n_perm=2_000, seed=0) >= 1 / 2001  # the observed counts as one


@pytest.mark.parametrize("x, y", [PERFECT, RANDOM, TIES], ids=["perfect", "random", "ties"])
@pytest.mark.parametrize("name", ["tau", "rho"])
def test_the_model_resampling_interval_is_scipys_paired_percentile_bootstrap(x, y, name):
    from scipy.stats import bootstrap

    low, high, undefined = model_interval(x, y, name, n_boot=4000, seed=0)
    statistic = scipy_statistic(name)

    def defined(xx, yy):  # scipy keeps a resample with no statistic as nan; ours leaves it out
        v = statistic(xx, yy)
        return 2.0 if math.isnan(v) else v

    ci = bootstrap((x, y), defined, paired=True, vectorized=False, method="percentile", n_resamples=4000,
                   rng=np.random.default_rng(1)).confidence_interval
    # A resample drawing one model for every slot has no statistic: rare with 7 models.
    assert undefined <= 5 and ci.high <= 1.0
    assert low == pytest.approx(ci.low, abs=0.12) and high == pytest.approx(ci.high, abs=0.12)
    if x is PERFECT[0]:
        assert (low, high) == (1.0, 1.0)  # every resample keeps the perfect order
    else:
        assert low < statistic(x, y) < high or name == "tau" and x is TIES[0]


def test_the_interval_resamples_models_not_seeds_and_is_none_below_five_models():
    x, y = RANDOM
    low, high, _ = model_interval(x, y)
    assert -1 <= low < 0 < high <= 1  # a random order's interval spans 0
    assert model_interval(x, y) == (low, high, _)  # seeded
    assert all(math.isnan(v) for v in model_interval(x[:4], y[:4])[:2])


def test_holm_against_hand_computed_values_with_nan_left_alone():
    got = holm([0.01, np.nan, 0.04, 0.03, 0.005])
    # sorted 0.005, 0.01, 0.03, 0.04 of m = 4: x4, x3, x2 (0.06, kept from falling), x1 -> max so far
    want = [0.03, np.nan, 0.06, 0.06, 0.02]
    assert np.allclose(got, want, equal_nan=True)
    assert holm([0.5, 0.9]).tolist() == [1.0, 1.0]


# Values refused, runs that share no model, left-out cells.

@pytest.mark.parametrize("column, value, said", [
    ("normalised_return", math.nan, "is not finite"),
    ("normalised_return", math.inf, "is not finite"),
    ("accuracy", math.nan, "is not finite"),
    ("normalised_return", "0.5", "is not a number"),
    ("normalised_return", 1.2, "is outside [-1, 1]"),
    ("normalised_return", -1.01, "is outside [-1, 1]"),
])
def test_a_return_or_accuracy_that_cannot_rank_is_refused_naming_its_cell(column, value, said):
    external = external_run({m: [0.1 * i, 0.1 * i] for i, m in enumerate("abcdefg")})
    external.table[column] = external.table[column].astype(object)
    external.table.loc[3, column] = value
    with pytest.raises(UsageError, match=rf"cell b1 \(popgym_repeat_first b @ difficulty=1 seed 1\) has {column} .*{re.escape(said)}"):
        external_scores(external)


def test_returns_past_one_by_float_error_are_kept():
    external = external_run({"a": [1.0000000000000007, 0.5], "b": [0.2, 0.1]})
    assert external_scores(external)[1].values["a"] == (1.0000000000000007, 0.5)


def test_runs_that_share_no_model_are_refused_and_models_only_one_run_has_are_named_left_out():
    study = load_run(ROOT / "docs/runs/study_converge")
    with pytest.raises(UsageError, match="share no model"):
        validity_table([study], external_run({"gru": [0.1, 0.2], "mlp": [0.3, 0.4]}))
    v = validity_table([study], external_run({m: [0.1 * i] for i, m in enumerate(["base", "lstm", "ssm", "gru"])}),
                       n_boot=50)
    assert set(v.table["n_models"]) == {3}
    left = [line for line in v.left_out if "gru" in line]
    assert left == ["ext: 1 cell(s) of gru, a model the toy runs did not train: gru0"]
    assert any(line.startswith("study_converge: 21 cell(s) of no_harm") for line in v.left_out)
    assert any(line.startswith("study_converge: 9 cell(s) of delta, a model the external run did not train")
               for line in v.left_out)


# The hypothesis.

HYPOTHESIS_TOML = """
stated = {stated}
revision = "abc1234"
statistic = "kendall_tau_b"
direction = "positive"
alpha = 0.05
[toy]
task = "coordinate_binding"
variant = "block_queries=True"
level = "n_writes=10,noise=0.05"
[external]
score = "repeat_first @ difficulty=1 return"
profile = "ext_profile"
"""


def stated(tmp_path, when="2026-01-02", **changes):
    text = HYPOTHESIS_TOML.format(stated=when)
    for key, value in changes.items():
        text = text.replace(f'{key} = "', f'{key} = "{value}" # ').replace(f"{key} = 0.05", f"{key} = {value}")
    path = tmp_path / "h.toml"
    path.write_text(text)
    return read_hypothesis(path)


def ordered_external(study, first_started, profile="ext_profile"):
    coordinate = toy_scores(study)[0]
    order = sorted(coordinate.values, key=lambda m: np.mean(coordinate.values[m]))
    manifest = {"started": "2026-03-01T00:00:00+00:00", "settings": {"profile": profile}}
    manifest |= {"first_started": first_started} if first_started else {}
    return external_run({m: [i / 10, i / 10 + 0.01] for i, m in enumerate(order)}, manifest)


def test_the_stated_pair_is_confirmatory_first_only_when_stated_before_the_runs_first_cell(tmp_path):
    study = load_run(ROOT / "docs/runs/study_converge")
    hypothesis = stated(tmp_path)
    v = validity_table([study], ordered_external(study, "2026-01-04T00:00:00+00:00"), hypothesis, n_boot=100)
    first = v.table.iloc[0]
    assert v.reasons == [] and first["role"] == "confirmatory" and (v.table["role"] == "confirmatory").sum() == 1
    assert first["external"] == "repeat_first @ difficulty=1 return" and first["tau"] == 1.0
    assert first["tau_p"] == pytest.approx(1 / 5040)  # one-sided, as stated
    assert math.isnan(first["tau_p_holm"]) and len(v.table) == 3 * 4  # the others: 3 toy x 4 external - 1, + it
    assert summary(v)[0].startswith("confirmatory (stated 2026-01-02 at abc1234): study_converge: coordinate_binding")
    assert "supported" in summary(v)[0]

    # a date alone is its day's last instant anywhere (2026-01-03T11:59Z), so a run begun on the next day
    # in UTC may still be too early; a later statement, or a run that does not record its first start:
    # every pair exploratory
    for first_started, why in [("2026-01-03T10:00:00+00:00", "after run ext's first cell"),
                               ("2025-12-30T00:00:00+00:00", "after run ext's first cell"),
                               (None, "does not record when its first cell started")]:
        v = validity_table([study], ordered_external(study, first_started), hypothesis, n_boot=100)
        assert set(v.table["role"]) == {"exploratory"} and len(v.table) == 12 and why in v.reasons[-1]
        assert summary(v)[0].startswith("no confirmatory pair") and "Every pair is exploratory." in summary(v)[0]
    # a time with its offset is taken as stated
    v = validity_table([study], ordered_external(study, "2026-01-02T10:00:00+00:00"),
                       stated(tmp_path, "2026-01-02T09:00:00Z"), n_boot=100)
    assert v.reasons == []


def test_the_stated_pair_is_confirmatory_only_in_a_run_of_the_profile_it_names(tmp_path):
    """A later run under another profile (a longer cap, say) would be a second look at the pair."""
    study = load_run(ROOT / "docs/runs/study_converge")
    for profile in ["ext_profile_long", None]:
        v = validity_table([study], ordered_external(study, "2026-01-04T00:00:00+00:00", profile),
                           stated(tmp_path), n_boot=50)
        assert set(v.table["role"]) == {"exploratory"} and len(v.reasons) == 1
        assert v.reasons[0] == (f"it is tested on the run of profile 'ext_profile', and run ext was made under "
                                f"{profile!r}")
        assert summary(v)[0].startswith("no confirmatory pair")


def test_a_pair_the_runs_lack_or_no_hypothesis_makes_every_pair_exploratory_and_says_why(tmp_path):
    study = load_run(ROOT / "docs/runs/study_converge")
    external = ordered_external(study, "2026-01-04T00:00:00+00:00")
    v = validity_table([study], external, stated(tmp_path, level="n_writes=50,noise=0.05"), n_boot=100)
    assert set(v.table["role"]) == {"exploratory"} and "is not among these runs' scores" in v.reasons[0]
    v = validity_table([study], external, None, n_boot=100)
    assert set(v.table["role"]) == {"exploratory"} and v.reasons[0].startswith("none is stated")


@pytest.mark.parametrize("text, said", [
    ("stated = 2026-01-02", "lacks 'toy'"),
    (HYPOTHESIS_TOML.format(stated="2026-01-02").replace('profile = "ext_profile"', ""), "lacks 'profile'"),
    (HYPOTHESIS_TOML.format(stated="2026-01-02T09:00:00"), "no offset"),
    (HYPOTHESIS_TOML.format(stated='"yesterday"'), "'stated' must be a TOML date"),
    (HYPOTHESIS_TOML.format(stated="2026-01-02").replace("positive", "up"), "'direction' one of"),
    (HYPOTHESIS_TOML.format(stated="2026-01-02").replace("0.05", "5"), "'alpha' must be"),
    ("stated = [", "is not TOML"),
])
def test_a_hypothesis_that_does_not_state_its_pair_in_full_is_one_usage_error(tmp_path, text, said):
    (tmp_path / "h.toml").write_text(text)
    with pytest.raises(UsageError, match=re.escape(said)):
        read_hypothesis(tmp_path / "h.toml")
    assert read_hypothesis(tmp_path / "absent.toml") is None


def test_the_committed_hypothesis_is_read_and_names_a_pair_the_committed_runs_do_not_have():
    h = read_hypothesis(ROOT / "docs/external-validity-hypothesis.toml")
    assert (h.stated_text, h.revision, h.statistic, h.direction, h.alpha) == ("2026-12-04", "69b8ba8", "tau", "positive", 0.05)
    assert h.toy == ("coordinate_binding", "standard", "n_writes=50,noise=0.05")
    assert h.external == "mean return over kept levels"
    # the run it names is the committed one it was tested on
    manifest = json.loads((ROOT / "docs/runs/validity_external/manifest.json").read_text())
    assert h.profile == manifest["settings"]["profile"] == "validity_external"
    assert "69b8ba8" in (ROOT / "docs/external-validity.md").read_text()  # the prose states the same revision


def test_an_external_memory_forcing_variant_is_scored_apart_with_means_of_its_own():
    """The standard variant's mean (the hypothesis's external score) averages the standard levels
    only; the memory-forcing variant's levels and means are named for it."""
    returns = {m: [0.1 * i, 0.1 * i + 0.01] for i, m in enumerate("abcde")}
    plain = external_run(returns).table
    forcing = plain.assign(variant="block_past=True", normalised_return=-plain["normalised_return"],
                           cell_id="f" + plain["cell_id"])
    data = RunData("ext", None, pd.concat([plain, forcing], ignore_index=True), pd.DataFrame(), pd.DataFrame(), {},
                   task_options={("popgym_repeat_first", "block_past=True"): {"block_past": True}})
    scores = {s.name: s for s in external_scores(data)}
    assert set(scores) == {"repeat_first @ difficulty=1 accuracy", "repeat_first @ difficulty=1 return",
                           "repeat_first (memory forcing) @ difficulty=1 accuracy",
                           "repeat_first (memory forcing) @ difficulty=1 return",
                           MEAN_ALL, "mean return over kept levels",
                           MEAN_ALL + " (memory forcing)", "mean return over kept levels (memory forcing)"}
    assert scores["mean return over kept levels"].values["e"] == pytest.approx([0.4, 0.41])
    assert scores["mean return over kept levels (memory forcing)"].values["e"] == pytest.approx([-0.4, -0.41])
    assert scores["mean return over kept levels"].over == ("repeat_first @ difficulty=1",)


def test_the_summary_names_the_levels_the_kept_mean_averages_and_those_its_rule_leaves_out():
    study = load_run(ROOT / "docs/runs/study_converge")
    order = sorted(toy_scores(study)[0].values)
    rows = external_run({m: [i / 10, i / 10 + 0.01] for i, m in enumerate(order)}).table
    solved = rows.assign(train_level="difficulty=2", normalised_return=1.0, accuracy=1.0, cell_id="s" + rows["cell_id"])
    external = RunData("ext", None, pd.concat([solved, rows], ignore_index=True), pd.DataFrame(), pd.DataFrame(), {})
    lines = summary(validity_table([study], external, n_boot=50))
    assert (f"{MEAN_KEPT} averages repeat_first @ difficulty=1; its rule leaves out repeat_first @ difficulty=2"
            in lines)


def test_the_summary_counts_the_counted_cells_that_had_converged_per_run_and_level():
    study = load_run(ROOT / "docs/runs/study_converge")
    external = external_run({"base": [0.1, 0.2], "lstm": [0.3, 0.4], "ssm": [0.5, 0.6]})
    external.table["converged"] = [True, False, True, None, True, True]
    v = validity_table([study], external, n_boot=50)
    toy_line, external_line = v.budget
    assert external_line == ("ext: 4 of 6 cells counted had converged (the convergence rule), 1 were still learning "
                             "at their cap, 1 do not say (popgym_repeat_first @ difficulty=1 4/6)")
    # the toy run's counted cells: its three tasks with a memory-forcing variant, not no_harm
    t = study.table
    counted = t[t["trained_at_level"].astype(bool) & (t["status"] == "finished") & (t["task"] != "no_harm")]
    counted = counted.drop_duplicates("cell_id")
    converged = int((counted["converged"] == True).sum())  # noqa: E712 - None (does not say) is neither
    assert toy_line.startswith(f"study_converge: {converged} of {len(counted)} cells counted had converged")
    assert "no_harm" not in toy_line and "coordinate_binding [block_queries=True] @ n_writes=10,noise=0.05" in toy_line
    assert [line for line in summary(v) if line.startswith("converged: ")] == [f"converged: {toy_line}",
                                                                             f"converged: {external_line}"]


def test_the_stated_pair_is_tested_only_once_every_cell_of_its_sides_is_in(tmp_path):
    study = load_run(ROOT / "docs/runs/study_converge")
    external = ordered_external(study, "2026-01-04T00:00:00+00:00")
    assert validity_table([study], external, stated(tmp_path), n_boot=50).reasons == []
    toy_side = ("coordinate_binding", "block_queries=True", "n_writes=10,noise=0.05")
    standard = ("popgym_repeat_first", "standard", "difficulty=2")
    for run, unfinished, unchosen, why in [
            (external, [standard] * 3, [], "ext has 3 cell(s) without a result on"),
            (external, [None], [standard] * 2, "ext has 1 cell(s) without a result and 2 learning-rate search(es)"),
            (study, [toy_side], [], "study_converge has 1 cell(s) without a result on"),
            (study, [], [None], "study_converge has 1 learning-rate search(es) with no lr chosen on")]:
        run.unfinished, run.unchosen = unfinished, unchosen
        v = validity_table([study], external, stated(tmp_path), n_boot=50)
        assert len(v.reasons) == 1 and why in v.reasons[0] and "the stated pair's side" in v.reasons[0]
        assert set(v.table["role"]) == {"exploratory"} and summary(v)[0].startswith("no confirmatory pair")
        run.unfinished, run.unchosen = [], []
    # what lacks off the pair's sides waits for nothing: another toy score's cells, the external
    # run's memory-forcing ones (their options known from a finished cell)
    study.unfinished = [("coordinate_binding", "standard", "n_writes=10,noise=0.05"), ("occlusion", *toy_side[1:])]
    external.unfinished = external.unchosen = [("popgym_repeat_first", "block_past=True", "difficulty=1")]
    external.task_options = {("popgym_repeat_first", "block_past=True"): {"block_past": True}}
    assert validity_table([study], external, stated(tmp_path), n_boot=50).reasons == []
    external.task_options = {}  # a variant no finished cell has told: on every side
    assert len(validity_table([study], external, stated(tmp_path), n_boot=50).reasons) == 1


def test_a_run_under_way_is_read_with_its_missing_cells_and_unchosen_searches_where_each_lies(tmp_path):
    """A copy of a finished run made to stand mid-run, since a committed run under way finishes."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "docs/runs/study_converge", run)
    searches = json.loads((run / "selection.json").read_text())["searches"]
    choosing = next(s for s in searches if s["task"] == "coordinate_binding")
    seeding = next(s for s in searches if s["task"] == "occlusion")
    trials = {t["cell_id"] for t in seeding["trials"] + seeding["second_trials"]}
    (run / "cells" / f"{choosing['trials'][0]['cell_id']}.json").unlink()
    (run / "cells" / f"{next(c for c in seeding['final_cells'] if c not in trials)}.json").unlink()
    data = load_run(run)
    where = [(s["task"], s["variant"], s["train_level"]) for s in (choosing, seeding)]
    assert data.unchosen == where[:1] and None not in data.unfinished
    assert set(data.unfinished) == set(where)
