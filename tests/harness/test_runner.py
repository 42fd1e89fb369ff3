"""Running a plan: a killed run resumes where it stopped, the console's progress lines, the selection
stage (the trials, second seeds where two lrs are close, then the seeds at the lr chosen), and the
command a run records."""
import json

import pandas as pd
import pytest

import tmem_bench
from tests.harness.helpers import killed_on, second_seed_profile, selection_profile, tiny_cells, write_profile
from tests.helpers import write_one_cell
from tmem_bench.harness import runner, selection
from tmem_bench.harness.estimate import plan_rows
from tmem_bench.harness.plan import Overrides, plan_run
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.runner import run_plan


def test_resume_skips_finished_cells_and_reruns_a_killed_one(tmp_path, monkeypatch):
    cells = tiny_cells()
    real = runner.train_cell
    calls = []

    monkeypatch.setattr(runner, "train_cell", killed_on(2, real, calls))  # dies midway through the second cell
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


def test_console_lines_keep_the_variant_in_brackets(tmp_path):
    import io

    from rich.console import Console

    from tmem_bench.harness.plan import make_plan
    from tmem_bench.harness.runner import run_plan

    profile = write_one_cell(tmp_path, extra="variants = [{}, { block_queries = true }]\n")
    console = Console(file=io.StringIO(), width=400)
    run_plan(make_plan("coordinate_binding", profile), tmp_path / "run", device="cpu", console=console)
    lines = [line for line in console.file.getvalue().splitlines() if line.startswith("done ")]
    assert sorted(line.split(":")[0] for line in lines) == [
        "done coordinate_binding [block_queries=True] base @ n_writes=3,noise=0.0 seed 0",
        "done coordinate_binding base @ n_writes=3,noise=0.0 seed 0"]


def test_a_grid_run_selects_then_trains_the_remaining_seeds_and_resumes(tmp_path):
    profile = write_profile(tmp_path, selection_profile("[1e-3, 1e-2]").replace(
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


def test_a_run_trains_the_second_seed_where_the_best_two_are_close_and_records_it(tmp_path, monkeypatch):
    monkeypatch.setattr(selection, "load_margin", lambda: 1.0)  # every choice is a close one
    plan = plan_run("coordinate_binding", second_seed_profile(tmp_path))
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
    plan = plan_run("coordinate_binding", second_seed_profile(tmp_path), overrides)
    (search,) = plan.searches
    assert search.seeds == () and search.second_seed == 4 and {c.seed for c in plan.cells} == {3}
    assert [len(r.cells) for r in plan_rows(plan.cells, plan.searches) if r.kind == "second"] == [2]
    results = run_plan(plan, tmp_path / "run", device="cpu")
    (record,) = RunDir(tmp_path / "run").selection()
    assert record["selection_seed"] == 3 and record["chosen_lr"] is not None and record["final_cells"] == []
    assert sorted(r["cell"]["seed"] for r in results) == [3, 3, 3, 4, 4]


def test_command_as_typed_has_no_machine_paths():
    from tmem_bench.harness.runner import command_as_typed

    assert command_as_typed(["/opt/venv/bin/tmem-bench", "run", "all"]) == ["tmem-bench", "run", "all"]
    assert command_as_typed(["/home/me/tmem-bench/cli.py", "report", "runs/x"]) == ["python", "cli.py", "report",
                                                                                     "runs/x"]
    assert command_as_typed(["/site-packages/tmem_bench/cli/__init__.py", "list"], module="tmem_bench.cli") == [
        "python", "-m", "tmem_bench.cli", "list"]
    assert not command_as_typed()[0].startswith("/")


def test_off_a_terminal_progress_is_a_plain_line_while_a_cell_trains(tmp_path, monkeypatch):
    """The serial engine trains in the driver's thread; a log still gets a line every PLAIN_EVERY_S,
    and each cell's line gives its accuracy at the level it was trained at, as the report does."""
    import io
    import time

    from rich.console import Console

    cells = tiny_cells()[:1]
    real = runner.train_cell
    monkeypatch.setattr(runner, "PLAIN_EVERY_S", 0.05)
    monkeypatch.setattr(runner, "train_cell", lambda *a, **k: time.sleep(0.3) or real(*a, **k))
    console = Console(file=io.StringIO(), width=200)
    [result] = runner.run_plan(cells, tmp_path, device="cpu", console=console)
    out = console.file.getvalue()
    assert "0/1 cells done, 1 running" in out and " elapsed" in out
    trained = next(e for e in result["eval"] if e["level_key"] == result["validation"]["level_key"])
    assert f"eval accuracy {trained['accuracy']:.1%} at its trained level" in out
