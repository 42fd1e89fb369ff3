"""Selection that one seed cannot fool: where the best two lrs of a grid are within the margin,
both are trained at a second seed and the mean chooses; elsewhere one seed does. A run plans and
trains those cells, records which choices needed them, and can stop after its selection."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tmem_bench.errors import UsageError
from tmem_bench.harness import selection
from tmem_bench.harness.estimate import plan_rows
from tmem_bench.harness.plan import Overrides, plan_run
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.runner import run_plan
from tmem_bench.harness.selection import choose, load_margin, one_seed_lr

PROFILE = """
[train]
steps = 4
batch_size = 8
lr = [1e-3, 3e-3, 1e-2]
weight_decay = 0.01
grad_clip = 1.0
log_every = 2
eval_size = 32
seeds = [0, 1, 2]
{extra}

[tasks.coordinate_binding]
models = ["base"]
model = {{ d_model = 16, n_layers = 1, n_heads = 2 }}
levels = {{ n_writes = [3], noise = [0.05] }}
"""


def profile(tmp_path, extra="selection_second_seed = true", name="p.toml"):
    path = tmp_path / name
    path.write_text(PROFILE.format(extra=extra))
    return str(path)


def result(cell, accuracy, loss=1.0, status="finished"):
    return {"cell_id": cell.id, "status": status, "validation": {"accuracy": accuracy, "loss": loss}}


def test_the_margin_is_data_beside_the_other_thresholds():
    assert 0 < load_margin() < 1


def test_within_the_margin_a_second_seed_is_planned_and_the_mean_decides(tmp_path):
    (search,) = plan_run("coordinate_binding", profile(tmp_path)).searches
    assert search.second_seed == 1 and search.seeds == (1, 2)
    a, b, c = search.trials
    first = {a.id: result(a, 0.50), b.id: result(b, 0.62), c.id: result(c, 0.60)}
    record = choose(search, first, margin=0.05)
    # Seed 0 alone would choose 3e-3; the two within 0.05 of each other wait for seed 1.
    assert record["second_seed_lrs"] == [3e-3, 1e-2] and record["chosen_lr"] is None
    second = search.second_trials([3e-3, 1e-2])
    assert [(x.seed, x.train["lr"]) for x in second] == [(1, 3e-3), (1, 1e-2)]
    assert record["missing"] == [x.id for x in second]
    assert [x.id for x in search.cells_after(record)] == [x.id for x in second]

    both = {**first, second[0].id: result(second[0], 0.40), second[1].id: result(second[1], 0.70)}
    record = choose(search, both, margin=0.05)
    assert record["chosen_lr"] == 1e-2 and record["at_edge"] is True and one_seed_lr(record) == 3e-3
    assert [m["accuracy"] for m in record["second_seed_means"]] == pytest.approx([0.51, 0.65])
    assert record["final_cells"] == [f.id for f in search.finals(1e-2)]
    # The second seed's cell at the lr chosen is a final one: one extra cell, the runner-up's.
    after = search.cells_after(record)
    assert len(after) == 3 and {x.id for x in after} == {second[0].id} | set(record["final_cells"])


def test_outside_the_margin_no_second_seed_is_trained(tmp_path):
    (search,) = plan_run("coordinate_binding", profile(tmp_path)).searches
    a, b, c = search.trials
    record = choose(search, {a.id: result(a, 0.50), b.id: result(b, 0.70), c.id: result(c, 0.60)}, margin=0.05)
    assert record["second_seed_lrs"] == [] and "second_trials" not in record
    assert record["chosen_lr"] == 3e-3
    assert [x.id for x in search.cells_after(record)] == record["final_cells"]
    # A diverged runner-up is no close call either.
    record = choose(search, {a.id: result(a, 0.50), b.id: result(b, 0.70), c.id: result(c, 0.69, status="diverged")},
                    margin=0.05)
    assert record["second_seed_lrs"] == [] and record["chosen_lr"] == 3e-3


def test_a_profile_without_it_chooses_on_one_seed_and_keeps_its_records(tmp_path):
    (search,) = plan_run("coordinate_binding", profile(tmp_path, extra="")).searches
    assert search.second_seed is None
    a, b, c = search.trials
    record = choose(search, {a.id: result(a, 0.60), b.id: result(b, 0.61), c.id: result(c, 0.1)}, margin=0.05)
    assert record["chosen_lr"] == 3e-3
    assert not {"second_seed", "second_seed_lrs", "second_trials"} & set(record)


def test_a_run_trains_the_second_seed_where_the_best_two_are_close_and_records_it(tmp_path, monkeypatch):
    monkeypatch.setattr(selection, "load_margin", lambda: 1.0)  # every choice is a close one
    plan = plan_run("coordinate_binding", profile(tmp_path))
    (row,) = [r for r in plan_rows(plan.cells, plan.searches) if r.kind == "second"]
    assert len(row.cells) == 1  # the runner-up's, counted wherever it turns out to be
    results = run_plan(plan, tmp_path / "run", device="cpu")
    (record,) = RunDir(tmp_path / "run").selection()
    assert len(record["second_seed_lrs"]) == 2 and record["chosen_lr"] in record["second_seed_lrs"]
    runner_up = next(lr for lr in record["second_seed_lrs"] if lr != record["chosen_lr"])
    seeds_at = {(r["cell"]["seed"], r["cell"]["train"]["lr"]) for r in results}
    assert seeds_at == {(0, lr) for lr in (1e-3, 3e-3, 1e-2)} | {(1, runner_up)} | {
        (s, record["chosen_lr"]) for s in (1, 2)}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert len(manifest["cells"]) == len(results) == 6
    table = pd.read_csv(tmp_path / "run" / "results.csv")
    assert table["lr_chosen"].notna().all() and len(set(table["cell_id"])) == 6


def test_selection_only_at_other_seeds_trains_the_trials_and_second_seeds_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(selection, "load_margin", lambda: 1.0)
    overrides = Overrides(seeds=[3, 4], selection_only=True)
    plan = plan_run("coordinate_binding", profile(tmp_path), overrides)
    (search,) = plan.searches
    assert search.seeds == () and search.second_seed == 4 and {c.seed for c in plan.cells} == {3}
    assert [len(r.cells) for r in plan_rows(plan.cells, plan.searches) if r.kind == "second"] == [2]
    results = run_plan(plan, tmp_path / "run", device="cpu")
    (record,) = RunDir(tmp_path / "run").selection()
    assert record["selection_seed"] == 3 and record["chosen_lr"] is not None and record["final_cells"] == []
    assert sorted(r["cell"]["seed"] for r in results) == [3, 3, 3, 4, 4]


def test_selection_only_without_a_grid_is_refused(tmp_path):
    path = tmp_path / "one_lr.toml"
    path.write_text(PROFILE.format(extra="").replace("lr = [1e-3, 3e-3, 1e-2]", "lr = 1e-3"))
    with pytest.raises(UsageError, match="no learning-rate grid"):
        plan_run("coordinate_binding", str(path), Overrides(selection_only=True))


def test_selection_agreement_counts_the_choices_two_runs_share_by_either_rule(tmp_path):
    def run(name, searches):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "selection.json").write_text(json.dumps({"searches": searches}))
        return str(folder)

    def search(label, accuracies, chosen, second=()):
        trials = [{"lr": lr, "cell_id": f"{label}{lr}", "accuracy": acc, "loss": 1.0, "status": "finished"}
                  for lr, acc in accuracies.items()]
        return {"task": "t", "variant": "v", "label": label, "model": label, "train_level": "w=1",
                "grid": sorted(accuracies), "seeds": [1], "trials": trials, "chosen_lr": chosen, "at_edge": True,
                "final_cells": [], "second_seed_lrs": list(second)}

    a = run("a", [search("x", {1e-3: 0.6, 1e-2: 0.5}, 1e-3), search("y", {1e-3: 0.5, 1e-2: 0.52}, 1e-3, (1e-3, 1e-2))])
    b = run("b", [search("x", {1e-3: 0.7, 1e-2: 0.2}, 1e-3), search("y", {1e-3: 0.53, 1e-2: 0.5}, 1e-3, (1e-3, 1e-2))])
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "selection_agreement.py"
    proc = subprocess.run([sys.executable, str(script), a, b], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "first seed alone: 1 of 2 choices agree" in proc.stdout
    assert "t [v] y @ w=1: 0.01 against 0.001" in proc.stdout
    assert "as chosen: 2 of 2 choices agree" in proc.stdout
    assert "second seed trained in 1 of 2 shared searches" in proc.stdout
