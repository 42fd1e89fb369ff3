import json

import pandas as pd
import pytest
import torch

import tmem_bench
from tmem_bench.errors import UsageError
from tmem_bench.harness import runner
from tmem_bench.harness.plan import Overrides, check_model, make_plan
from tmem_bench.harness.results import rows
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.train import run_cell

TINY = Overrides(models=["base"], levels={"n_writes": [3, 5]}, steps=4, batch_size=8)


def tiny_cells(**kw):
    overrides = Overrides(**{**TINY.__dict__, **kw})
    cells = [c for c in make_plan("coordinate_binding", "quick", overrides) if c.variant == "standard"]
    return [c.__class__(**{**c.__dict__, "train": {**c.train, "eval_size": 64, "log_every": 2}}) for c in cells]


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


def test_cell_id_depends_on_settings():
    a, b = tiny_cells(seeds=[0]), tiny_cells(seeds=[1])
    assert a[0].id != b[0].id
    assert a[0].id == tiny_cells(seeds=[0])[0].id


def test_same_seed_gives_identical_metrics_on_cpu():
    cell = tiny_cells()[0]
    r1, r2 = run_cell(cell, "cpu"), run_cell(cell, "cpu")
    assert [h["loss"] for h in r1["history"]] == [h["loss"] for h in r2["history"]]
    assert [e["accuracy"] for e in r1["eval"]] == [e["accuracy"] for e in r2["eval"]]
    other = run_cell(tiny_cells(seeds=[1])[0], "cpu")
    assert [h["loss"] for h in other["history"]] != [h["loss"] for h in r1["history"]]


def test_cell_result_records_what_reports_need():
    result = run_cell(tiny_cells()[0], "cpu")
    assert result["causality"]["verdict"] == "causal"
    assert [h["step"] for h in result["history"]] == [2, 4]
    assert all(h["steps_per_s"] > 0 for h in result["history"])
    ev = result["eval"][0]
    assert 0 <= ev["accuracy"] <= 1 and ev["n"] == 64 * 4 and len(ev["fingerprint"]) == 64
    assert result["hardware"].endswith(f", {torch.backends.cpu.get_cpu_capability()}")
    assert rows(result)[0]["hardware"] == result["hardware"]
    json.dumps(result)


def test_resume_skips_finished_cells_and_reruns_a_killed_one(tmp_path, monkeypatch):
    cells = tiny_cells()
    real = runner.train_cell
    calls = []

    def killed_on_second(cell, *args, **kwargs):
        calls.append(cell.id)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies midway through the second cell
        return real(cell, *args, **kwargs)

    monkeypatch.setattr(runner, "train_cell", killed_on_second)
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan(cells, tmp_path, device="cpu")
    assert RunDir(tmp_path).cell_path(cells[0].id).exists()
    assert not RunDir(tmp_path).cell_path(cells[1].id).exists()
    assert not list((tmp_path / "cells").glob(".*tmp"))

    calls.clear()
    monkeypatch.setattr(runner, "train_cell", lambda cell, *a, **k: calls.append(cell.id) or real(cell, *a, **k))
    results = runner.run_plan(cells, tmp_path, device="cpu")
    assert calls == [cells[1].id]
    assert {r["cell_id"] for r in results} == {c.id for c in cells}

    RunDir(tmp_path).cell_path(cells[0].id).write_text('{"cell_id": "trunc')  # a torn file is not a finished cell
    calls.clear()
    runner.run_plan(cells, tmp_path, device="cpu")
    assert calls == [cells[0].id]

    table = pd.read_csv(tmp_path / "results.csv")
    assert len(table) == 4 and set(table["label"]) == {"base"}
    assert len(tmem_bench.load_results(tmp_path)) == 4


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


BUILDS: list[dict] = []


class _Identity(torch.nn.Module):
    def forward(self, x, blocked=None):
        return x


def counted(**options):
    BUILDS.append(options)
    return _Identity()


def test_a_model_that_passed_its_check_is_not_built_again():
    """Validating a board plans one profile per entry; each model is built and called once."""
    size = {"d_model": 8, "n_layers": 1, "n_heads": 2, "dropout": 0.0}
    BUILDS.clear()
    check_model("test_harness:counted", size)
    check_model("test_harness:counted", dict(reversed(size.items())))
    assert BUILDS == [size]
    check_model("test_harness:counted", {**size, "d_model": 16})
    assert len(BUILDS) == 2
