"""The external profile plans and resumes like any other: its cells are the study's models on
POPGym's tasks, their ids the same in every process, and a run killed midway trains only what is
left, recording oracle-action accuracy and normalised return for each cell."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

pytest.importorskip("popgym")

from tests.harness.helpers import killed_on  # noqa: E402
from tests.helpers import ROOT  # noqa: E402
from tmem_bench.harness import runner  # noqa: E402
from tmem_bench.harness.plan import Overrides, plan_run  # noqa: E402
from tmem_bench.harness.profiles import load_profile  # noqa: E402
from tmem_bench.harness.rundir import RunDir  # noqa: E402

STUDY_MODELS = {"base", "slots", "delta", "linear", "lstm", "ssm", "tensor"}
IDS = ("import json; from tmem_bench.harness.plan import plan_run; "
       "print(json.dumps([c.id for c in plan_run('all', 'external').cells]))")


def test_the_external_profile_plans_the_study_models_on_every_popgym_task_with_ids_stable_across_processes():
    profile = load_profile("external")
    plan = plan_run("all", "external")
    assert {c.task for c in plan.cells} == set(profile["tasks"]) == {
        "popgym_repeat_first", "popgym_repeat_previous", "popgym_autoencode", "popgym_count_recall"}
    assert {c.model for c in plan.cells} == STUDY_MODELS
    assert all(c.task_options == {"closed_loop_episodes": 32} for c in plan.cells)
    # Each model's lr is chosen per task and difficulty: every trial at seed 0, seeds 1 and 2 after.
    assert all(len(s.trials) == len(profile["train"]["lr"]) and s.seeds == (1, 2) for s in plan.searches)
    levels = sum(len(section["levels"]["difficulty"]) for section in profile["tasks"].values())
    assert len(plan.searches) == levels * len(STUDY_MODELS)
    ids = [c.id for c in plan.cells]
    assert len(set(ids)) == len(ids) and ids == [c.id for c in plan_run("all", "external").cells]
    fresh = subprocess.run([sys.executable, "-c", IDS], capture_output=True, text=True, cwd=ROOT, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": "1"})
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout.strip().splitlines()[-1]) == ids


def test_a_run_of_the_external_profile_killed_midway_resumes_and_records_both_scores(tmp_path, monkeypatch):
    plan = plan_run("popgym_repeat_previous", "external",
                    Overrides(models=["lstm"], levels={"difficulty": [1]}, steps=2, selection_only=True))
    cells = plan.cells
    assert len(cells) == 2
    real, calls = runner.train_cell, []

    monkeypatch.setattr(runner, "train_cell", killed_on(2, real, calls))  # dies midway through the second cell
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan(plan, tmp_path, device="cpu")
    assert RunDir(tmp_path).cell_path(cells[0].id).exists() and not RunDir(tmp_path).cell_path(cells[1].id).exists()

    calls.clear()
    monkeypatch.setattr(runner, "train_cell", lambda cell, *a, **k: calls.append(cell.id) or real(cell, *a, **k))
    runner.run_plan(plan, tmp_path, device="cpu")
    # The killed cell, then the selection stage's second seed where the two lrs came out close; never the first again.
    assert calls[0] == cells[1].id and cells[0].id not in calls
    table = pd.read_csv(tmp_path / "results.csv")
    assert len(table) == 1 + len(calls) and table["normalised_return"].between(-1, 1).all()
    assert table["accuracy"].between(0, 1).all()
    stored = RunDir(tmp_path).read_cell(cells[0].id)["eval"][0]["closed_loop"]
    assert stored["n_episodes"] == 32 and len(stored["returns"]) == 32
