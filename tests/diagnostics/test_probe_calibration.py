"""The state probe calibrated on the reference states of known content (probe_references): what it
reads of each reference beside the reference's best possible read (within the 90% goal where it
meets it, its measured floor where it does not), constant and noise at chance, and the same numbers
on a rerun. The default suite reads three writes at a small budget, one member each; `pytest -m slow`
reads ten writes with the whole family at the probe's own budget (the table in docs/results.md)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tmem_bench.diagnostics.probe_references import BY_NAME, calibrate_reference
from tmem_bench.diagnostics.state_probe import ReadoutConfig
from tmem_bench.harness.probe_run import CALIBRATION_GOAL
from tmem_bench.registry import get_task

TASK = get_task("coordinate_binding", block_queries=True)
TRAIN = get_task("coordinate_binding", block_queries=True, n_queries=16)
CHANCE = 1 / TASK.n_classes
# 8,192 evaluation queries: four standard deviations of a binomial at chance are 0.008.
AT_CHANCE = 0.01


def calibrate(name, n_writes, config):
    return calibrate_reference(name, TASK, TASK.validate_level({"n_writes": n_writes, "noise": 0.05}), config, TRAIN)


FAST = ReadoutConfig(steps=200, validate_every=100, validation_size=256)


@pytest.mark.parametrize("name, readout", [
    ("slots_mixed", "attention"), ("kv_mixed", "rows_linear"), ("voxel_mixed", "rows_linear"),
])
def test_the_reference_of_each_rowed_format_is_read_within_its_goal_by_its_member(name, readout):
    result = calibrate(name, 3, replace(FAST, readouts=(readout,)))
    assert result["probe_accuracy"] >= CALIBRATION_GOAL * result["best"], result


@pytest.mark.parametrize("name", ["constant", "noise"])
def test_constant_and_noise_states_are_read_at_chance(name):
    result = calibrate(name, 3, replace(FAST, readouts=("gated", "rows_linear"), steps=60, validate_every=30))
    assert result["best"] == CHANCE
    assert all(abs(acc - CHANCE) < AT_CHANCE for acc in result["readouts"].values()), result


def test_a_calibration_is_the_same_on_a_rerun():
    config = replace(FAST, readouts=("gated", "attention"), steps=20, validate_every=10)
    assert calibrate("slots_half", 3, config) == calibrate("slots_half", 3, config)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_reference_is_calibrated_on_cuda_against_the_best_read_of_the_cpu():
    level = TASK.validate_level({"n_writes": 3, "noise": 0.05})
    config = replace(FAST, steps=20, validate_every=10)
    for name in BY_NAME:
        on_cuda = calibrate_reference(name, TASK, level, config, TRAIN, torch.device("cuda"))
        assert on_cuda["hardware"] == torch.cuda.get_device_name()
        assert on_cuda["best"] == calibrate_reference(name, TASK, level, replace(config, steps=1), TRAIN)["best"]
        assert set(on_cuda["readouts"]) == set(config.readouts)
        assert all(0.0 <= acc <= 1.0 for acc in on_cuda["readouts"].values())


# The whole family at the probe's own budget, ten writes: what `tmem-bench probe --calibrate` prints
# (docs/results.md, "State probe calibration"). A calibration is the family's: its best member's read
# as a fraction of the reference's best possible read, the goal where the probe meets it, a floor
# below it where it does not.
MEETS_GOAL = ["slots", "slots_mixed", "slots_half", "kv_mixed", "kv_half", "voxel", "voxel_mixed", "voxel_half"]
# Read, but below the goal at this budget (86% of its own read): the floor keeps it from sliding
# further unnoticed.
BELOW_GOAL = {"kv": 0.83}
# No member reads these: a rotation of the whole flattened state leaves no rows to find, and the
# dense vector is a random nonlinear mixing of every write (18-46% of the best). Should a probe
# come to read one, this fails, and the calibration table must be updated.
UNREAD = ["slots_rotated", "kv_rotated", "dense", "dense_half"]


def family_read(result) -> float:
    return max(result["readouts"].values())


@pytest.mark.slow
@pytest.mark.parametrize("name", MEETS_GOAL)
def test_the_references_the_probe_reads_are_read_within_their_goal(name):
    result = calibrate(name, 10, ReadoutConfig())
    assert family_read(result) >= CALIBRATION_GOAL * result["best"], result


@pytest.mark.slow
@pytest.mark.parametrize("name", BELOW_GOAL)
def test_the_references_read_below_their_goal_keep_their_floor(name):
    result = calibrate(name, 10, ReadoutConfig())
    assert BELOW_GOAL[name] * result["best"] <= family_read(result) < CALIBRATION_GOAL * result["best"], result


@pytest.mark.slow
@pytest.mark.parametrize("name", UNREAD)
def test_the_references_no_member_reads_stay_far_below_their_goal(name):
    result = calibrate(name, 10, ReadoutConfig())
    assert family_read(result) < 0.5 * result["best"], result


@pytest.mark.slow
@pytest.mark.parametrize("name", ["constant", "noise"])
def test_constant_and_noise_are_at_chance_at_the_probes_budget(name):
    result = calibrate(name, 10, ReadoutConfig())
    assert all(abs(acc - CHANCE) < AT_CHANCE for acc in result["readouts"].values()), result
