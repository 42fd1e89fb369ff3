"""One cell's training: the same numbers from the same seed, what a result records, divergence stopped
and reported, early stopping that stops at the same step however often a cell is run or killed and
trains as the same fixed budget would, and weights that reproduce the cell's accuracy."""
import json

import pandas as pd
import pytest
import torch

from tests.harness.helpers import EVERY, selection_profile, tiny_cell, tiny_cells, write_profile
from tests.helpers import run_cli, write_one_cell
from tmem_bench.harness import runner
from tmem_bench.harness.plan import Overrides, make_plan, plan_task_searches
from tmem_bench.harness.profiles import load_profile
from tmem_bench.harness.results import load_weights, rows
from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.runner import run_plan
from tmem_bench.harness.train import build_model, evaluate, run_cell
from tmem_bench.registry import get_task


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


# Finite at initialisation; Adam's first step moves `g` by the lr whatever its gradient, and cosh(1e5 g)
# then overflows: the loss of step 2 is not finite (an lr out of range is refused before training).
DIVERGING = '''
import torch
import torch.nn as nn


class Diverging(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.tensor(1e-9))

    def forward(self, x, blocked=None):
        return x * torch.cosh(1e5 * self.g)


def diverging(d_model, n_layers, n_heads, **options):
    return Diverging()
'''


def test_divergence_stops_the_cell_and_is_reported(tmp_path):
    profile = write_one_cell(tmp_path, steps=20)
    (tmp_path / "hardening_diverging.py").write_text(DIVERGING)
    proc = run_cli(["run", "coordinate_binding", "--profile", profile, "--out", "run",
                    "--models", "hardening_diverging:diverging"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "DIVERGED at step" in proc.stderr
    result = json.loads(next((tmp_path / "run" / "cells").glob("*.json")).read_text())
    assert result["status"] == "diverged" and 1 < result["diverged_at_step"] <= 20
    assert all(h["step"] < result["diverged_at_step"] for h in result["history"])
    table = pd.read_csv(tmp_path / "run" / "results.csv")
    assert set(table["status"]) == {"diverged"} and table["final_loss"].notna().all()
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Diverged training" in report and f"step {result['diverged_at_step']} of 20" in report
    assert "diverged at step" in proc.stdout  # the console summary's status column


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


def test_every_cell_saves_weights_that_reproduce_its_accuracy(tmp_path):
    cell = make_plan("coordinate_binding", write_profile(tmp_path, selection_profile("1e-3")),
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


@pytest.mark.parametrize("bad", [1, 5, 13])
def test_a_non_finite_loss_found_at_the_next_read_leaves_the_weights_of_the_step_before_it(monkeypatch, bad):
    """The loss is read only at a log (every 5 steps here): a loss that turns non-finite at step
    `bad` is found there, and training is replayed from the read before it, so the cell ends as if
    it had stopped right before `bad`: the same weights and logged losses as a cell trained to bad - 1."""
    from tmem_bench.harness import train as train_module

    (cell,) = tiny_cells(steps=15)[:1]
    cell = cell.__class__(**{**cell.__dict__, "train": {**cell.train, "log_every": 5}})
    real, calls = train_module.loss_and_accuracy, []

    def poisoned(model, batch):
        loss, acc = real(model, batch)
        if model.training:
            calls.append(len(calls) + 1)
            if calls[-1] == bad:
                loss = loss * float("nan")
        return loss, acc

    monkeypatch.setattr(train_module, "loss_and_accuracy", poisoned)
    result, model = train_module.train_cell(cell, "cpu")
    monkeypatch.setattr(train_module, "loss_and_accuracy", real)
    assert (result["status"], result["diverged_at_step"], result["steps_run"]) == ("diverged", bad, bad - 1)
    assert len(calls) > bad  # found at a later read, not at the step itself
    weights = model.state_dict()
    assert all(torch.isfinite(w).all() for w in weights.values())
    if bad == 1:
        assert result["history"] == []
        return
    reference, ref_model = train_module.train_cell(
        cell.__class__(**{**cell.__dict__, "train": {**cell.train, "steps": bad - 1}}), "cpu")
    assert [h["loss"] for h in result["history"]] == [h["loss"] for h in reference["history"]]
    assert all(torch.equal(w, ref_model.state_dict()[k]) for k, w in weights.items())
    assert [e["accuracy"] for e in result["eval"]] == [e["accuracy"] for e in reference["eval"]]


def test_tf32_is_recorded_in_each_cell_only_when_asked_and_refused_without_a_gpu(tmp_path, capsys):
    from tests.helpers import cli
    from tmem_bench.contracts.device import matmul_precision

    plain, fast = tiny_cells(), tiny_cells(tf32=True)
    assert all("tf32" not in c.train for c in plain) and all(c.train["tf32"] is True for c in fast)
    assert not {c.id for c in plain} & {c.id for c in fast}  # never read as the same cell
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with matmul_precision(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with matmul_precision(False):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    if not torch.cuda.is_available():
        code, _, err = cli(["run", "coordinate_binding", "--tf32", "--out", tmp_path / "run"], capsys)
        assert code != 0 and err.strip().count("\n") == 0 and "--tf32" in err and "has none" in err
        assert not (tmp_path / "run").exists()
