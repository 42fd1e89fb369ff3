"""Every registered task, through the task conformance checks; then what is particular to each family.

The generic checks (conformance_tasks: declarations, batches, the oracle and the ceiling, chance,
fingerprints, blocked edges, attention blind under memory forcing, reach positions) run over every
registered task, every variant it names and every level of its own grid, so a new task (or
variant) is covered without new test code, and what these tests know of each task comes from its
own declarations; tests/diagnostics/test_conformance_tasks.py shows that each check can fail. A profile runs the
tasks it lists and no other: a new task need not be in any.
"""
from __future__ import annotations

import pytest
import torch

from tmem_bench.diagnostics.conformance_tasks import TASK_CHECKS, TaskSpec, task_check_name, task_levels, task_variants
from tmem_bench.harness.plan import Cell, plan_run
from tmem_bench.harness.profiles import load_profile, profile_names
from tmem_bench.harness.train import run_cell
from tmem_bench.registry import TASKS, task_names

NAMES = task_names()
VARIANTS = [(name, variant, task) for name in NAMES for variant, task in task_variants(TASKS.get(name), {})]


@pytest.mark.parametrize("profile", profile_names())
def test_a_profile_runs_the_tasks_it_lists_and_plans_any_other_it_is_given(profile):
    listed = set(load_profile(profile)["tasks"])
    assert {c.task for c in plan_run("all", profile).cells} == listed
    for name in NAMES:  # one it does not list is planned from the task's own levels and variants
        assert {c.task for c in plan_run(name, profile).cells} == {name}


@pytest.mark.parametrize("check", TASK_CHECKS, ids=task_check_name)
@pytest.mark.parametrize("name", NAMES)
def test_every_registered_task_passes_the_task_checks(name, check):
    result = check(TASKS.get(name), TaskSpec(name=name))
    assert result.passed, result.detail


@pytest.mark.parametrize("name,variant,task", VARIANTS, ids=[f"{n}-{v}" for n, v, _ in VARIANTS])
def test_tiny_end_to_end_run(name, variant, task):
    levels = tuple(task_levels(task))
    cell = Cell(
        task=name, task_options=task.options(), variant="test", train_level=levels[0], eval_levels=levels,
        model="base", label="base", model_options={"d_model": 16, "n_layers": 1, "n_heads": 2},
        seed=0, train={"steps": 2, "batch_size": 8, "lr": 1e-3, "weight_decay": 0.01, "grad_clip": 1.0,
                       "log_every": 1, "eval_size": 32},
    )
    result = run_cell(cell)
    assert result["causality"]["verdict"] == "causal"
    assert result["cell"]["task_options"] == task.options()
    assert len(result["history"]) == 2
    for entry, level in zip(result["eval"], levels, strict=True):
        batch, fp = task.eval_set(level, 32)
        assert entry["fingerprint"] == fp
        assert entry["chance"] == task.chance(level)
        assert entry["ceiling"] == task.ceiling(level, batch)
        assert 0.0 <= entry["accuracy"] <= 1.0 and entry["n"] == batch["target"].numel()


@pytest.mark.parametrize("name,variant,task", VARIANTS, ids=[f"{n}-{v}" for n, v, _ in VARIANTS])
def test_the_memory_forcing_variants_are_the_blocking_ones(name, variant, task):
    """A variant is declared memory-forcing exactly when its adapter blocks attention edges at some
    level of its grid, and stays so whatever other options a profile gives it (sizes, say)."""
    forcing = variant in task.memory_forcing
    blocks = any((b := task.make_adapter(16).blocked(task.sample(level, 1, torch.Generator().manual_seed(0))))
                 is not None and b.any() for level in task_levels(task))
    assert blocks == forcing
    assert TASKS.get(name).forces_memory(task.options()) == forcing
    assert TASKS.get(name).forces_memory({**task.options(), "an_option_no_variant_sets": 4}) == forcing
