"""Training to convergence: the early-stopping rule, a cell that stops at the same step however
often it is run or killed, an estimate that counts such a cell at its cap, and a fixed `steps`
that keeps the cell ids every committed run and leaderboard entry was made with."""
import json
import math
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from tmem_bench.diagnostics import convergence as convergence_module
from tmem_bench.diagnostics.convergence import load_early_stop, load_rule, should_stop
from tmem_bench.harness import runner
from tmem_bench.harness.dryrun import fmt_duration
from tmem_bench.harness.estimate import Cost, estimate, plan_rows
from tmem_bench.harness.plan import Overrides, make_plan, plan_task_searches
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.train import run_cell
from tmem_bench.levels import level_key

ROOT = Path(__file__).resolve().parents[1]
RULE = load_early_stop()


def checks(losses, accuracy=0.9, every=100):
    return [{"step": i * every, "loss": loss, "accuracy": accuracy} for i, loss in enumerate(losses)]


def first_stop(history, chance=1 / 32):
    """The step at which the rule stops a run whose checks are `history`, or None."""
    return next((h["step"] for i, h in enumerate(history) if should_stop(history[:i + 1], chance, RULE)), None)


def test_the_rule_stops_a_plateaued_loss_and_not_a_falling_one():
    plateau = checks([3.4, 2.0, 1.0, 0.6, 0.5] + [0.5 + 0.001 * (i % 2) for i in range(15)])
    stop = first_stop(plateau)
    assert stop is not None and 500 <= stop <= 1000, stop
    falling = checks([3.4 * math.exp(-i / 10) for i in range(21)])
    assert first_stop(falling) is None
    # Flat at chance is where a plateau may still end: trained to the cap, never stopped.
    at_chance = checks([3.47] * 21, accuracy=1 / 32)
    assert first_stop(at_chance) is None


def test_early_stopping_thresholds_are_no_looser_than_the_reports_convergence_rule(monkeypatch):
    report = load_rule()
    assert RULE.last_fraction == report.last_fraction and RULE.max_late_fraction <= report.max_late_fraction
    table = tomllib.loads((ROOT / "tmem_bench" / "report" / "claims.toml").read_text())
    looser = {**table, "early_stop": {**table["early_stop"], "max_late_fraction": 0.5}}
    monkeypatch.setattr(convergence_module, "_thresholds", lambda: looser)
    with pytest.raises(ValueError, match="no larger than"):
        load_early_stop()


TINY = """
[train]
steps = {steps}
batch_size = 16
lr = 3e-3
weight_decay = 0.01
grad_clip = 1.0
log_every = 10
eval_size = 64
seeds = [0]
early_stop = {early_stop}

[tasks.no_harm]
models = ["base"]
model = {{ d_model = 16, n_layers = 1, n_heads = 2, dropout = 0.1 }}
levels = {{}}
"""
EVERY = 10  # claims.toml's `every` is sized for real runs; these cells check more often


def tiny_cell(tmp_path, steps=300, early_stop=True):
    path = tmp_path / f"tiny-{steps}-{early_stop}.toml"
    path.write_text(TINY.format(steps=steps, early_stop=str(early_stop).lower()))
    (cell,) = make_plan("no_harm", str(path))
    if early_stop:
        cell = replace(cell, train={**cell.train, "early_stop": {**cell.train["early_stop"], "every": EVERY}})
    return cell


def numbers(result):
    return (result["steps_run"], result["stopped"], result["validation_checks"],
            [h["loss"] for h in result["history"]], [e["accuracy"] for e in result["eval"]],
            result["validation"])


def test_a_cell_killed_midway_and_resumed_stops_at_the_same_step_with_the_same_numbers(tmp_path, monkeypatch):
    cell = tiny_cell(tmp_path)
    reference = runner.run_plan([cell], tmp_path / "reference", device="cpu")[0]
    assert reference["stopped"] == "converged" and reference["steps_run"] < 300
    assert reference["steps_run"] % EVERY == 0 and reference["convergence"]["converged"] is True

    real = runner.train_cell

    def killed(cell, device, on_step=None):
        def die(step, steps):
            if step == reference["steps_run"] // 2:
                raise KeyboardInterrupt  # the process dies midway through training
        return real(cell, device, die)

    monkeypatch.setattr(runner, "train_cell", killed)
    with pytest.raises(KeyboardInterrupt):
        runner.run_plan([cell], tmp_path / "run", device="cpu")
    assert not RunDir(tmp_path / "run").cell_path(cell.id).exists()
    monkeypatch.setattr(runner, "train_cell", real)
    resumed = runner.run_plan([cell], tmp_path / "run", device="cpu")[0]
    assert numbers(resumed) == numbers(reference)
    table = pd.read_csv(tmp_path / "run" / "results.csv")
    assert list(table["steps_run"]) == [reference["steps_run"]] and list(table["stopped"]) == ["converged"]


def test_the_checks_leave_training_as_a_fixed_budget_of_the_same_steps_would(tmp_path):
    stopped = run_cell(tiny_cell(tmp_path), "cpu")
    fixed = run_cell(tiny_cell(tmp_path, steps=stopped["steps_run"], early_stop=False), "cpu")
    assert fixed["stopped"] == "cap" and fixed["validation_checks"] is None
    assert fixed["convergence"]["on"] == "train_loss" and stopped["convergence"]["on"] == "validation_loss"
    assert [h["loss"] for h in fixed["history"]] == [h["loss"] for h in stopped["history"]]
    assert [e["accuracy"] for e in fixed["eval"]] == [e["accuracy"] for e in stopped["eval"]]


class FixedCost:
    def cost(self, cell):
        return Cost(setup_s=1.0, step_s=0.01, eval_s=2.0, check_s=0.5)


def test_the_estimate_counts_an_early_stopping_cell_at_its_cap_and_every_check(tmp_path):
    cell = tiny_cell(tmp_path, steps=305)
    (row,) = plan_rows([cell])
    assert row.early_stop and row.steps == 305
    est = estimate([row], FixedCost(), workers=1)
    checks_run = 1 + 305 // EVERY + 1  # step 0, every EVERY steps, and the cap
    assert est.total_s == pytest.approx(1.0 + 305 * 0.01 + checks_run * 0.5 + 2.0)
    fixed = estimate(plan_rows([tiny_cell(tmp_path, steps=305, early_stop=False)]), FixedCost(), workers=1)
    assert fixed.total_s == pytest.approx(1.0 + 305 * 0.01 + 2.0)


def committed_entry(slug: str) -> dict:
    path = ROOT / "leaderboard" / "entries" / slug / "entry.json"
    if not path.is_file():
        pytest.skip(f"no committed entry {slug}")
    return json.loads(path.read_text())


@pytest.mark.parametrize("slug, run", [("tmem-bench-study-base", "docs/runs/study"),
                                       ("tmem-bench-capacity-base", "docs/runs/capacity")])
def test_a_fixed_steps_profile_plans_the_committed_runs_cell_ids(slug, run):
    """The profile text a committed run was made with (its leaderboard entry keeps it) plans,
    with this suite, exactly the cells that run holds (its finals at the lrs it chose): a fixed
    `steps` hashes as it always did."""
    entry = committed_entry(slug)
    profile = tomllib.loads(entry["profile"]["toml"])
    overrides = Overrides(**entry["run"]["overrides"])
    stored = {p.stem for p in (ROOT / run / "cells").glob("*.json")}
    planned = [plan_task_searches(name, profile, overrides) for name in profile["tasks"]]
    cells = [c for plan in planned for c in plan.cells]
    selection = ROOT / run / "selection.json"
    chosen = {(s["task"], s["label"], s["train_level"]): s["chosen_lr"]
              for s in (json.loads(selection.read_text())["searches"] if selection.exists() else [])}
    for search in (s for plan in planned for s in plan.searches):
        first = search.trials[0]
        cells += search.finals(chosen[(first.task, first.label, level_key(first.train_level))])
    assert {c.id for c in cells} == stored
    assert not any("early_stop" in c.train for c in cells)


def test_early_stop_false_plans_the_ids_of_a_profile_without_it(tmp_path):
    plain = tmp_path / "plain.toml"
    plain.write_text(TINY.format(steps=300, early_stop="true").replace("early_stop = true\n", ""))
    (without,) = make_plan("no_harm", str(plain))
    assert tiny_cell(tmp_path, early_stop=False).id == without.id
    assert tiny_cell(tmp_path).id != without.id


def test_profile_cost_prices_a_plan_from_a_runs_own_cell_times(tmp_path):
    """Priced from its own run, a fixed-steps plan costs what its cells took; with early stopping
    its cap is priced from the steps a cell ran, with every check."""
    path = tmp_path / "fixed.toml"
    path.write_text(TINY.format(steps=30, early_stop="false").replace('"base"', '"base", "lstm"'))
    results = runner.run_plan(make_plan("no_harm", str(path)), tmp_path / "run", device="cpu")
    script = ROOT / "benchmarks" / "profile_cost.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), str(path), "--workers", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"2 cells, {fmt_duration(sum(r['wall_time_s'] for r in results))} of cell time" in proc.stdout
    assert "at most" not in proc.stdout
    capped = tmp_path / "capped.toml"
    capped.write_text(path.read_text().replace("early_stop = false", "early_stop = true")
                      .replace("steps = 30", "steps = 300"))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), str(capped), "--workers", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "at most about" in proc.stdout, proc.stderr
