"""Fair comparisons: validation sets, learning-rate selection, per-level settings, the convergence
rule, the information-reach probe and the weights every cell saves."""
import json

import pytest
import torch

from tmem_bench.contracts.model import TaskModel
from tmem_bench.contracts.task import MAX_TRAIN_SEED, SEED_BITS
from tmem_bench.diagnostics.convergence import ConvergenceRule, convergence
from tmem_bench.diagnostics.reach import reach_probe
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import Overrides, load_profile, make_plan, plan_run, plan_task_searches, profile_names
from tmem_bench.harness.results import load_weights, read_cell
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.runner import run_plan
from tmem_bench.harness.selection import choose
from tmem_bench.harness.train import build_model, evaluate
from tmem_bench.levels import level_key
from tmem_bench.registry import get_backbone, get_task, task_names


def middle_level(task) -> dict:
    """The middle of the small grid the task declares (some evidence seen, some held back)."""
    return {axis: values[len(values) // 2] for axis, values in task.levels.items()}


# Every memory-forcing variant every registered task declares.
FORCING = [(name, get_task(name).variants[variant]) for name in task_names()
           for variant in get_task(name).memory_forcing]


def write_profile(tmp_path, text: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return str(path)


PROFILE = """
[train]
steps = 6
batch_size = 8
lr = {lr}
weight_decay = 0.01
grad_clip = 1.0
log_every = 2
eval_size = 32
seeds = [0, 1]

[tasks.coordinate_binding]
models = ["base", "linear"]
model = {{ d_model = 16, n_layers = 1, n_heads = 2 }}
levels = {{ n_writes = [3, 5], noise = [0.05] }}
{extra}
"""


@pytest.mark.parametrize("name", task_names())
def test_validation_seeds_are_disjoint_from_training_and_evaluation_and_fingerprints_stable(name):
    task = get_task(name)
    level = middle_level(task)
    seed = task.validation_seed(level)
    assert MAX_TRAIN_SEED <= seed < SEED_BITS  # above every training seed, and all its bits are used
    evaluated = {get_task(c.task, **c.task_options).eval_seed(lv) % SEED_BITS
                 for profile in profile_names() for c in make_plan("all", profile) for lv in c.eval_levels}
    validated = {get_task(c.task, **c.task_options).validation_seed(c.train_level)
                 for profile in profile_names() for c in make_plan("all", profile)}
    assert not evaluated & validated
    (batch, fp), (_, again) = task.validation_set(level, 16), task.validation_set(level, 16)
    assert fp == again and len(fp) == 64
    assert fp != task.eval_set(level, 16)[1]
    assert torch.equal(batch["target"], task.validation_set(level, 16)[0]["target"])


def test_a_grid_of_one_lr_plans_exactly_the_cells_of_a_scalar_lr(tmp_path):
    scalar = plan_run("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="1e-3", extra="")))
    one = plan_run("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="[1e-3]", extra="")))
    assert [c.id for c in one.cells] == [c.id for c in scalar.cells] and not one.searches


def test_built_in_profiles_keep_the_cell_ids_of_their_committed_runs():
    docs = pytest.importorskip("pathlib").Path(__file__).parents[1] / "docs" / "runs"
    # The study's and the capacity run's, planned from the profile text they were run with (their
    # leaderboard entries keep it): test_early_stopping.
    for profile, run in (("quick", "example-quick-all"),):
        manifest = json.loads((docs / run / "manifest.json").read_text())
        committed = {c["id"] if isinstance(c, dict) else c for c in manifest["cells"]}
        assert {p.stem for p in (docs / run / "cells").glob("*.json")} == committed
        plan = plan_run("all", profile)
        planned = {c.id for c in plan.cells}
        if plan.searches:
            # The finals follow the committed run's selection: the plan's trials, each search's
            # seeds at the lr that run chose, and nothing else.
            chosen = {(s["task"], s["variant"], s["label"], s["train_level"]): s["chosen_lr"]
                      for s in json.loads((docs / run / "selection.json").read_text())["searches"]}
            for search in plan.searches:
                trial = search.trials[0]
                lr = chosen[(trial.task, trial.variant, trial.label, level_key(trial.train_level))]
                planned |= {c.id for c in search.finals(lr)}
        assert planned == committed


def test_a_grid_plans_every_lr_at_the_first_seed_and_the_other_seeds_later(tmp_path):
    plan = plan_run("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="[1e-3, 3e-3, 1e-2]", extra="")))
    assert len(plan.searches) == 2 * 2  # two models, two training levels
    for search in plan.searches:
        assert [c.train["lr"] for c in search.trials] == [1e-3, 3e-3, 1e-2]
        assert {c.seed for c in search.trials} == {0} and search.seeds == (1,)
        finals = search.finals(3e-3)
        assert [(c.seed, c.train["lr"]) for c in finals] == [(1, 3e-3)]
    assert plan.n_cells() == len(plan.cells) + 4 and len(plan.cells) == 4 * 3


def _result(cell, accuracy, loss=1.0, status="finished"):
    return {"cell_id": cell.id, "status": status, "validation": {"accuracy": accuracy, "loss": loss}}


def test_selection_picks_the_best_validation_accuracy_deterministically(tmp_path):
    search = plan_run("coordinate_binding",
                      write_profile(tmp_path, PROFILE.format(lr="[1e-3, 3e-3, 1e-2]", extra=""))).searches[0]
    a, b, c = search.trials
    results = {a.id: _result(a, 0.5), b.id: _result(b, 0.7), c.id: _result(c, 0.6)}
    record = choose(search, results)
    assert record["chosen_lr"] == 3e-3 and record["at_edge"] is False
    assert record == choose(search, dict(reversed(results.items())))
    assert record["final_cells"] == [f.id for f in search.finals(3e-3)]
    assert [t["accuracy"] for t in record["trials"]] == [0.5, 0.7, 0.6]
    # Ties go to the lower validation loss, then to the smaller lr; a diverged trial ranks last.
    tie = {a.id: _result(a, 0.7, 0.9), b.id: _result(b, 0.7, 0.8), c.id: _result(c, 0.9, status="diverged")}
    assert choose(search, tie)["chosen_lr"] == 3e-3
    edge = {a.id: _result(a, 0.7), b.id: _result(b, 0.7), c.id: _result(c, 0.1)}
    assert choose(search, edge)["chosen_lr"] == 1e-3 and choose(search, edge)["at_edge"] is True
    missing = choose(search, {a.id: _result(a, 0.7)})
    assert missing["chosen_lr"] is None and missing["missing"] == [b.id, c.id] and not missing["final_cells"]


def test_at_sets_steps_and_seeds_per_training_level_and_changes_the_cell_id(tmp_path):
    extra = "at = [{ n_writes = 5, steps = 9, seeds = [4] }]"
    cells = make_plan("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="1e-3", extra=extra)))
    plain = make_plan("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="1e-3", extra="")))
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
        make_plan("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="1e-3", extra=extra)))


def test_a_training_seed_that_would_draw_an_evaluation_set_is_refused(tmp_path):
    task = get_task("coordinate_binding")
    clash = task.eval_seed({"n_writes": 5, "noise": 0.05}) % SEED_BITS
    if clash >= MAX_TRAIN_SEED:
        clash = task.eval_seed({"n_writes": 3, "noise": 0.05}) % SEED_BITS
    assert clash < MAX_TRAIN_SEED, "neither level's evaluation hash is a valid training seed; pick other levels"
    with pytest.raises(UsageError, match="evaluation set"):
        make_plan("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="1e-3", extra="")),
                  Overrides(seeds=[clash]))


def test_a_repeated_lr_is_refused(tmp_path):
    with pytest.raises(UsageError, match="lr"):
        make_plan("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="[1e-3, 1e-3]", extra="")))


def test_a_plateau_converges_and_a_falling_curve_does_not():
    rule = ConvergenceRule(last_fraction=0.2, max_late_fraction=0.1, min_late_drop=0.02)
    steps = range(50, 1001, 50)
    plateau = [{"step": s, "loss": max(0.5, 3.0 - s / 100)} for s in steps]
    falling = [{"step": s, "loss": 3.0 - 2.0 * s / 1000} for s in steps]
    flat = [{"step": s, "loss": 1.386} for s in steps]  # never learned: nothing is still falling either
    assert convergence(plateau, 1000, rule)["converged"] is True
    assert convergence(falling, 1000, rule)["converged"] is False
    assert convergence(flat, 1000, rule)["converged"] is True
    assert convergence(falling[:2], 1000, rule)["converged"] is None


def _reach(model_name, task_name, options, seed=0):
    torch.manual_seed(seed)
    task = get_task(task_name, **options)
    model = TaskModel(task.make_adapter(16), get_backbone(model_name, d_model=16, n_layers=2, n_heads=2))
    level = middle_level(task)
    return reach_probe(model, task, level, task.sample(level, 4, torch.Generator().manual_seed(seed)), seed=seed)


@pytest.mark.parametrize("task_name, options", FORCING)
def test_attention_alone_has_no_path_from_evidence_to_answer_under_memory_forcing(task_name, options):
    reach = _reach("base", task_name, options)
    assert reach["evidence_grad"] == 0.0 and reach["ratio"] == 0.0 and reach["answer_grad"] > 0


@pytest.mark.parametrize("model_name", ["tensor", "linear", "delta", "ssm"])
@pytest.mark.parametrize("task_name, options", FORCING)
def test_a_memory_has_a_path_from_evidence_to_answer_at_initialisation(model_name, task_name, options):
    assert _reach(model_name, task_name, options)["ratio"] > 1e-6


def test_the_reach_probe_sees_attention_paths_where_nothing_is_blocked():
    assert _reach("base", "coordinate_binding", {})["ratio"] > 1e-3
    assert _reach("base", "no_harm", {}) is None


def test_a_grid_run_selects_then_trains_the_remaining_seeds_and_resumes(tmp_path):
    profile = write_profile(tmp_path, PROFILE.format(lr="[1e-3, 1e-2]", extra="").replace(
        'levels = { n_writes = [3, 5], noise = [0.05] }', 'levels = { n_writes = [3], noise = [0.05] }'))
    plan = plan_run("coordinate_binding", profile, Overrides(models=["base"]))
    run_dir = tmp_path / "run"
    results = run_plan(plan, run_dir, device="cpu")
    selection = json.loads((run_dir / "selection.json").read_text())["searches"]
    assert len(selection) == 1 and selection[0]["chosen_lr"] in (1e-3, 1e-2)
    lr = selection[0]["chosen_lr"]
    final = plan.searches[0].finals(lr)[0]
    assert {r["cell_id"] for r in results} == {c.id for c in plan.cells} | {final.id}
    assert RunDir(run_dir).read_cell(final.id)["cell"]["train"]["lr"] == lr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [c["id"] for c in manifest["cells"] if c.get("after_selection")] == [final.id]
    table = (run_dir / "results.csv").read_text()
    assert "lr_chosen" in table and "validation_accuracy" in table
    before = {p.name: p.stat().st_mtime_ns for p in (run_dir / "cells").iterdir()}
    run_plan(plan_run("coordinate_binding", profile, Overrides(models=["base"])), run_dir, device="cpu")
    assert {p.name: p.stat().st_mtime_ns for p in (run_dir / "cells").iterdir()} == before


def test_every_cell_saves_weights_that_reproduce_its_accuracy(tmp_path):
    cell = make_plan("coordinate_binding", write_profile(tmp_path, PROFILE.format(lr="1e-3", extra="")),
                     Overrides(models=["linear"], seeds=[0]))[0]
    run_plan([cell], tmp_path / "run", device="cpu")
    result = RunDir(tmp_path / "run").read_cell(cell.id)
    model = build_model(cell)
    torch.manual_seed(123)  # weights come from the file, not from the seed
    load_weights(RunDir(tmp_path / "run").weights_path(cell.id), model)
    task = get_task(cell.task, **cell.task_options)
    for ev in result["eval"]:
        accuracy, _ = evaluate(model, task.eval_set(ev["level"], cell.train["eval_size"])[0], torch.device("cpu"))
        assert accuracy == ev["accuracy"]
    other = build_model(plan_task_searches("coordinate_binding", load_profile("quick"),
                                           Overrides(models=["base"])).cells[0])
    with pytest.raises(ValueError, match="does not fit"):
        load_weights(RunDir(tmp_path / "run").weights_path(cell.id), other)


def test_a_model_entry_may_carry_its_own_training_settings(tmp_path):
    extra = 'at = [{ n_writes = 5, steps = 9 }]'
    text = PROFILE.format(lr="[1e-3, 3e-3]", extra=extra).replace(
        'models = ["base", "linear"]', 'models = ["base", { name = "linear", train = { lr = 3e-3, steps = 7 } }]')
    plan = plan_run("coordinate_binding", write_profile(tmp_path, text))
    linear = [c for c in plan.cells if c.label == "linear"]
    assert {(c.train_level["n_writes"], c.train["steps"], c.train["lr"]) for c in linear} == {(3, 7, 3e-3), (5, 7, 3e-3)}
    assert [s.trials[0].label for s in plan.searches] == ["base", "base"]  # base still searches the grid
    with pytest.raises(UsageError, match="stepz"):
        make_plan("coordinate_binding", write_profile(tmp_path, text.replace("steps = 7", "stepz = 7")))
