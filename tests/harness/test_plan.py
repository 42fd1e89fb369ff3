"""Profiles to cells: the levels trained and evaluated, cell ids that depend on the settings (and keep
those of the committed runs), learning-rate grids, per-level and per-model settings, and every bad
profile or override refused by name before anything runs."""
import json

import pytest

from tests.harness.helpers import (early_stop_text, second_seed_text, selection_profile, tiny_cell, tiny_cells,
                                   write_profile)
from tests.helpers import ROOT, cli, one_line_error
from tests.profiles import GRID
from tmem_bench.contracts.task import MAX_TRAIN_SEED, SEED_BITS
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import Overrides, make_plan, plan_run
from tmem_bench.levels import level_key, where_described
from tmem_bench.registry import get_task


def test_plan_trains_each_axis_value_the_user_sets_and_evaluates_the_grid():
    cells = tiny_cells()
    assert [c.train_level for c in cells] == [{"n_writes": 3, "noise": 0.05}, {"n_writes": 5, "noise": 0.05}]
    assert all(len(c.eval_levels) == 2 for c in cells)
    assert len({c.id for c in cells}) == 2


def test_quick_profile_trains_once_and_evaluates_every_level():
    cells = make_plan("coordinate_binding", "quick")
    standard = [c for c in cells if c.variant == "standard"]
    assert len({c.train_level["n_writes"] for c in standard}) == 1
    assert {lv["n_writes"] for c in standard for lv in c.eval_levels} == {5, 10, 20, 50}


def test_a_cells_description_names_where_it_lies():
    """A manifest keeps a cell not yet trained by its description alone, so `validity` reads from it
    the (task, variant, level) a run under way still lacks (issue 59)."""
    planned = make_plan("coordinate_binding", "quick")
    cells = [next(c for c in planned if c.variant == "standard"), next(c for c in planned if c.variant != "standard")]
    for cell in cells:
        assert where_described(cell.describe()) == (cell.task, cell.variant, level_key(cell.train_level))
    for text in ["", "junk", "a @ b seed 1", "coordinate_binding base @ n_writes=5"]:
        assert where_described(text) is None


def test_cell_id_depends_on_settings():
    a, b = tiny_cells(seeds=[0]), tiny_cells(seeds=[1])
    assert a[0].id != b[0].id
    assert a[0].id == tiny_cells(seeds=[0])[0].id


@pytest.mark.parametrize("overrides, message", [
    (Overrides(models=["nope"]), "unknown model 'nope'"),
    (Overrides(levels={"bogus": [1]}), "no axis 'bogus'"),
    (Overrides(levels={"n_writes": [0]}), "n_writes must be an integer >= 1"),
    (Overrides(seeds=[-1]), "seed must be an integer"),
    (Overrides(train_at={"n_writes": 3.5}), "n_writes must be an integer"),
])
def test_plan_errors(overrides, message):
    with pytest.raises(UsageError, match=message):
        make_plan("coordinate_binding", "quick", overrides)


def test_unknown_task_and_profile():
    with pytest.raises(UsageError, match="unknown task 'nope'; known: coordinate_binding"):
        make_plan("nope", "quick")
    with pytest.raises(UsageError, match="unknown profile 'nope'; known: .*quick"):
        make_plan("coordinate_binding", "nope")


def test_a_grid_of_one_lr_plans_exactly_the_cells_of_a_scalar_lr(tmp_path):
    scalar = plan_run("coordinate_binding", write_profile(tmp_path, selection_profile("1e-3")))
    one = plan_run("coordinate_binding", write_profile(tmp_path, selection_profile("[1e-3]")))
    assert [c.id for c in one.cells] == [c.id for c in scalar.cells] and not one.searches


def test_early_stop_false_plans_the_ids_of_a_profile_without_it(tmp_path):
    plain = tmp_path / "plain.toml"
    plain.write_text(early_stop_text(300, True).replace("early_stop = true\n", ""))
    (without,) = make_plan("no_harm", str(plain))
    assert tiny_cell(tmp_path, early_stop=False).id == without.id
    assert tiny_cell(tmp_path).id != without.id


def test_selection_only_without_a_grid_is_refused(tmp_path):
    path = tmp_path / "one_lr.toml"
    path.write_text(second_seed_text(second_seed=False).replace("lr = [1e-3, 3e-3, 1e-2]", "lr = 1e-3"))
    with pytest.raises(UsageError, match="no learning-rate grid"):
        plan_run("coordinate_binding", str(path), Overrides(selection_only=True))


@pytest.mark.parametrize("run", ["example-quick-all", "study", "capacity"])
def test_built_in_profiles_keep_the_cell_ids_of_their_committed_runs(run):
    """The built-in profile a committed run was made with plans, with this suite and the run's
    recorded task and overrides, exactly the cells that run holds: the plan's cells and each
    search's finals at the lr that run chose. None of these runs stops early, so a fixed `steps`
    hashes as it always did."""
    folder = ROOT / "docs" / "runs" / run
    manifest = json.loads((folder / "manifest.json").read_text())
    settings = manifest["settings"]
    redo = (f"redo it: move docs/runs/{run} aside, then tmem-bench run {settings['task']} "
            f"--profile {settings['profile']} --out docs/runs/{run}")
    committed = {c["id"] if isinstance(c, dict) else c for c in manifest["cells"]}
    if not committed or {p.stem for p in (folder / "cells").glob("*.json")} != committed:
        pytest.fail(f"docs/runs/{run}: its cells/ are not the cells its manifest.json names; {redo}", pytrace=False)
    plan = plan_run(settings["task"], settings["profile"], Overrides(**settings["overrides"]))
    cells = list(plan.cells)
    if plan.searches:
        chosen = {(s["task"], s["variant"], s["label"], s["train_level"]): s["chosen_lr"]
                  for s in json.loads((folder / "selection.json").read_text())["searches"]}
        for search in plan.searches:
            trial = search.trials[0]
            lr = chosen.get((trial.task, trial.variant, trial.label, level_key(trial.train_level)))
            if lr is not None:
                cells += search.finals(lr)
    planned = {c.id for c in cells}
    if planned != committed:
        pytest.fail(f"docs/runs/{run} is stale: profile {settings['profile']!r} plans {len(planned - committed)} cells "
                    f"it does not hold and not {len(committed - planned)} it does; {redo}", pytrace=False)
    assert not any("early_stop" in c.train for c in cells)


def test_a_grid_plans_every_lr_at_the_first_seed_and_the_other_seeds_later(tmp_path):
    plan = plan_run("coordinate_binding", write_profile(tmp_path, selection_profile("[1e-3, 3e-3, 1e-2]")))
    assert len(plan.searches) == 2 * 2  # two models, two training levels
    for search in plan.searches:
        assert [c.train["lr"] for c in search.trials] == [1e-3, 3e-3, 1e-2]
        assert {c.seed for c in search.trials} == {0} and search.seeds == (1,)
        finals = search.finals(3e-3)
        assert [(c.seed, c.train["lr"]) for c in finals] == [(1, 3e-3)]
    assert plan.n_cells() == len(plan.cells) + 4 and len(plan.cells) == 4 * 3


def test_at_sets_steps_and_seeds_per_training_level_and_changes_the_cell_id(tmp_path):
    extra = "at = [{ n_writes = 5, steps = 9, seeds = [4] }]"
    cells = make_plan("coordinate_binding", write_profile(tmp_path, selection_profile("1e-3", extra)))
    plain = make_plan("coordinate_binding", write_profile(tmp_path, selection_profile("1e-3")))
    steps = {(c.label, c.train_level["n_writes"], c.seed): c.train["steps"] for c in cells}
    assert steps == {("base", 3, 0): 6, ("base", 3, 1): 6, ("base", 5, 4): 9,
                     ("linear", 3, 0): 6, ("linear", 3, 1): 6, ("linear", 5, 4): 9}
    assert {c.id for c in cells if c.train_level["n_writes"] == 3} <= {c.id for c in plain}
    assert not {c.id for c in cells if c.train_level["n_writes"] == 5} & {c.id for c in plain}


@pytest.mark.parametrize("extra, message", [
    ("at = [{ n_writes = 7, steps = 9 }]", "matches no training level"),
    ("at = [{ width = 5, steps = 9 }]", "neither an axis"),
    ("at = [{ n_writes = 5, steps = 0 }]", "steps"),
    ("at = [{ n_writes = 5, stepz = 9 }]", "stepz"),
])
def test_bad_at_entries_are_refused_by_name(tmp_path, extra, message):
    with pytest.raises(UsageError, match=message):
        make_plan("coordinate_binding", write_profile(tmp_path, selection_profile("1e-3", extra)))


def test_a_training_seed_that_would_draw_an_evaluation_set_is_refused(tmp_path):
    task = get_task("coordinate_binding")
    clash = task.eval_seed({"n_writes": 5, "noise": 0.05}) % SEED_BITS
    if clash >= MAX_TRAIN_SEED:
        clash = task.eval_seed({"n_writes": 3, "noise": 0.05}) % SEED_BITS
    assert clash < MAX_TRAIN_SEED, "neither level's evaluation hash is a valid training seed; pick other levels"
    with pytest.raises(UsageError, match="evaluation set"):
        make_plan("coordinate_binding", write_profile(tmp_path, selection_profile("1e-3")),
                  Overrides(seeds=[clash]))


def test_a_repeated_lr_is_refused(tmp_path):
    with pytest.raises(UsageError, match="lr"):
        make_plan("coordinate_binding", write_profile(tmp_path, selection_profile("[1e-3, 1e-3]")))


def test_a_model_entry_may_carry_its_own_training_settings(tmp_path):
    extra = 'at = [{ n_writes = 5, steps = 9 }]'
    text = selection_profile("[1e-3, 3e-3]", extra).replace(
        'models = ["base", "linear"]', 'models = ["base", { name = "linear", train = { lr = 3e-3, steps = 7 } }]')
    plan = plan_run("coordinate_binding", write_profile(tmp_path, text))
    linear = [c for c in plan.cells if c.label == "linear"]
    assert {(c.train_level["n_writes"], c.train["steps"], c.train["lr"]) for c in linear} == {(3, 7, 3e-3), (5, 7, 3e-3)}
    assert [s.trials[0].label for s in plan.searches] == ["base", "base"]  # base still searches the grid
    with pytest.raises(UsageError, match="stepz"):
        make_plan("coordinate_binding", write_profile(tmp_path, text.replace("steps = 7", "stepz = 7")))



def test_models_may_name_a_profile_table_by_label_which_keeps_its_options(tmp_path):
    variants = 'variants = [{}, { variant = "memory_forcing", models = ["base", "linear"] }]'
    text = selection_profile("1e-3", variants).replace(
        'models = ["base", "linear"]', 'models = ["base", { name = "linear", label = "linear_wide", d_model = 32 }]', 1)
    plan = plan_run("coordinate_binding", write_profile(tmp_path, text), Overrides(models=["linear_wide", "base"]))
    by_variant = {}
    for c in plan.cells:
        by_variant.setdefault(c.variant, set()).add((c.label, c.model, c.model_options["d_model"]))
    # The table is picked where its list has it, with its options; the second variant's list lacks it.
    assert by_variant["standard"] == {("linear_wide", "linear", 32), ("base", "base", 16)}
    assert by_variant[next(v for v in by_variant if v != "standard")] == {("base", "base", 16)}
    named = plan_run("coordinate_binding", write_profile(tmp_path, text), Overrides(models=["linear"]))
    assert {(c.label, c.model_options["d_model"]) for c in named.cells} == {("linear", 16)}


SITES = {
    "train": lambda text, lr: text.replace("lr = [1e-3, 1e-2]", f"lr = {lr}"),
    "task-train": lambda text, lr: text + f"train = {{ lr = {lr} }}\n",
    "model-entry": lambda text, lr: text.replace('models = ["base"]',
                                                 f'models = [{{ name = "base", train = {{ lr = {lr} }} }}]'),
    "at": lambda text, lr: text + f"at = [{{ n_writes = 3, lr = {lr} }}]\n",
    "variant": lambda text, lr: text + f"variants = [{{ train = {{ lr = {lr} }} }}]\n",
}


WHERE = {"train": "train.lr", "task-train": "tasks.coordinate_binding.train.lr",
         "model-entry": "tasks.coordinate_binding.models.0.train.lr", "at": "tasks.coordinate_binding.at.0.lr",
         "variant": "tasks.coordinate_binding.variants.0.train.lr"}


@pytest.mark.parametrize("lr", ["nan", "inf", "-inf", "1e300", "0", "11", "[1e-3, nan]", "[inf]"])
@pytest.mark.parametrize("site", SITES)
def test_a_learning_rate_out_of_range_is_refused_before_anything_runs(tmp_path, capsys, site, lr):
    profile = tmp_path / "p.toml"
    profile.write_text(SITES[site](GRID, lr))
    for extra in ([], ["--dry-run"]):
        code, _, err = cli(["run", "coordinate_binding", "--profile", profile, "--out", tmp_path / "out", *extra],
                           capsys)
        one_line_error(code, err, f"{WHERE[site]}: ", "is not a learning rate (a finite number > 0 and <= 10)")
    assert not (tmp_path / "out").exists()


def test_the_largest_learning_rate_allowed_plans(tmp_path):
    from tmem_bench.harness.plan import plan_run

    profile = tmp_path / "p.toml"
    profile.write_text(GRID.replace("lr = [1e-3, 1e-2]", "lr = [1e-3, 10]"))
    assert plan_run("coordinate_binding", str(profile)).searches[0].grid == (1e-3, 10)
