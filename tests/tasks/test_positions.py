"""Learned absolute positions (`positions`), the reference's, as an option of map building and the
no-harm control: off by default (options, parameters and data as before), added exactly where set,
starting at zero, refused for sequences longer than the table, and through every task check."""
from __future__ import annotations

import pytest
import torch

from tests.helpers import cli, one_line_error
from tmem_bench.contracts.task import fingerprint
from tmem_bench.diagnostics.conformance_tasks import TaskSpec, run_task_checks
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import Cell
from tmem_bench.harness.train import run_cell
from tmem_bench.registry import TASKS, get_task

# (task, a level, positions enough for it)
CASES = [("map_building", {"horizon": 16}, 65), ("no_harm", {}, 32)]


def batch(task, level, seed=0, size=4):
    return task.sample(level, size, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name, level, positions", CASES)
def test_off_by_default_so_options_parameters_and_data_are_as_before(name, level, positions):
    plain, with_positions = get_task(name), get_task(name, positions=positions)
    assert "positions" not in plain.options()
    assert with_positions.options() == {**plain.options(), "positions": positions}
    assert not any("pos" in key for key in plain.make_adapter(8).state_dict())
    # The data do not depend on the option: the same evaluation set either way.
    assert plain.eval_set(level, 64)[1] == with_positions.eval_set(level, 64)[1]


@pytest.mark.parametrize("name, level, positions", CASES)
def test_positions_start_at_zero_and_are_added_at_each_place(name, level, positions):
    plain, task = get_task(name), get_task(name, positions=positions)
    b = batch(task, level)
    torch.manual_seed(0)
    without = plain.make_adapter(8)
    torch.manual_seed(0)
    adapter = task.make_adapter(8)
    assert adapter.pos.shape == (positions, 8) and not adapter.pos.any()
    assert torch.equal(adapter(b), without(b))  # at zero: the reference's start
    with torch.no_grad():
        adapter.pos.copy_(torch.randn(positions, 8))
    S = without(b).shape[1]
    assert torch.allclose(adapter(b) - without(b), adapter.pos[:S].expand(b["target"].shape[0], -1, -1), atol=1e-6)


def test_the_paper_setting_fills_the_table_at_its_longest_horizon():
    task = get_task("map_building", positions=65)
    assert task.validate_level({"horizon": 64}) == {"horizon": 64}
    assert task.make_adapter(8)(batch(task, {"horizon": 64})).shape == (4, 65, 8)


@pytest.mark.parametrize("options, level, message", [
    ({"positions": 16}, {"horizon": 16}, "horizon 16 makes 17 tokens, more than positions (16)"),
    ({"positions": 65, "encoding": "cells", "n_queries": 8}, {"horizon": 16},
     "horizon 16 makes 72 tokens, more than positions (65)"),
])
def test_a_sequence_longer_than_the_table_is_refused(options, level, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_task("map_building", **options).validate_level(level)


@pytest.mark.parametrize("name, options, message", [
    ("map_building", {"positions": -1}, "positions must be an integer >= 0, got -1"),
    ("map_building", {"positions": 2.5}, "positions must be an integer >= 0, got 2.5"),
    ("no_harm", {"positions": 31}, "positions (31) must be 0 or at least seq_len (32)"),
])
def test_bad_values_are_refused_by_name(name, options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_task(name, **options)


def test_the_command_line_refuses_a_bad_value_in_one_line(capsys):
    code, _, err = cli(["check", "--task", "no_harm", "--option", "positions=8"], capsys)
    one_line_error(code, err, "positions (8) must be 0 or at least seq_len (32)")


@pytest.mark.parametrize("name, positions", [("map_building", 72), ("no_harm", 32)])
def test_every_task_check_passes_with_positions(name, positions):
    """72: cells-encoding variants at the grid's longest horizon, 16, make 4 x 16 + 8 tokens."""
    results = run_task_checks(TASKS.get(name), TaskSpec(options={"positions": positions}, eval_size=256))
    assert all(r.passed for r in results), [(r.name, r.detail) for r in results if not r.passed]


@pytest.mark.parametrize("name, level, positions", [("map_building", {"horizon": 4}, 5), ("no_harm", {}, 32)])
def test_a_cell_with_positions_trains_causally_and_deterministically(name, level, positions):
    task = get_task(name, positions=positions)
    cell = Cell(task=name, task_options=task.options(), variant=f"positions={positions}", train_level=level,
                eval_levels=(level,), model="base", label="base",
                model_options={"d_model": 16, "n_layers": 1, "n_heads": 2}, seed=0,
                train={"steps": 3, "batch_size": 8, "lr": 1e-2, "weight_decay": 0.01, "grad_clip": 1.0,
                       "log_every": 1, "eval_size": 32})
    first, again = run_cell(cell), run_cell(cell)
    assert first["causality"]["verdict"] == "causal"
    assert first["cell"]["task_options"]["positions"] == positions
    assert [h["loss"] for h in first["history"]] == [h["loss"] for h in again["history"]]
    assert first["eval"][0]["fingerprint"] == fingerprint(task.eval_set(level, 32)[0])
