"""The task contract (tmem_bench.contracts.task): validation seeds apart from every training and
evaluation seed, and stable fingerprints."""
import zlib

import pytest
import torch

from tests.helpers import middle_level
from tmem_bench.contracts.task import MAX_TRAIN_SEED, SEED_BITS
from tmem_bench.diagnostics.conformance_tasks import task_levels, task_variants
from tmem_bench.harness.plan import make_plan
from tmem_bench.harness.profiles import profile_names
from tmem_bench.levels import level_key
from tmem_bench.registry import TASKS, get_task, task_names


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


# The four copies of the reserved-seed formula before Task.reserved_seed (validation sets, POPGym's
# closed-loop episodes and its chance episodes, the state probe's data), kept here as they were
# written: cell ids and the committed results depend on their values.
def _old_seed(name: str, level: dict, purpose: str) -> int:
    return MAX_TRAIN_SEED + zlib.crc32(f"{purpose}|{name}|{level_key(level)}".encode()) % MAX_TRAIN_SEED


@pytest.mark.parametrize("name", task_names())
def test_the_reserved_seeds_are_those_of_the_four_copies_they_replace(name):
    for _, task in task_variants(TASKS.get(name), {}):
        for level in task_levels(task):
            assert task.validation_seed(level) == _old_seed(name, level, "validation")
            for purpose in ("closed_loop", "chance", *(f"state_probe|{p}" for p in ("train", "calibration", "validation"))):
                assert task.reserved_seed(purpose, level) == _old_seed(name, level, purpose)


def test_the_reserved_seeds_keep_their_values():
    # Frozen from the formula's last copies, so that a change to the formula and to _old_seed together still fails.
    task, level = get_task("coordinate_binding"), {"n_writes": 10, "noise": 0.05}
    assert (task.validation_seed(level), task.reserved_seed("state_probe|train", level)) == (3054917328, 4033435973)
    if "popgym_repeat_first" in TASKS:  # the closed-loop episodes drawn from their reserved seed
        episodes = get_task("popgym_repeat_first").closed_loop_seeds({"difficulty": 1})
        assert episodes[:3] == [706343132, 376172401, 1241273773]
