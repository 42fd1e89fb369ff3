"""The task contract (tmem_bench.contracts.task): validation seeds apart from every training and
evaluation seed, and stable fingerprints."""
import pytest
import torch

from tests.helpers import middle_level
from tmem_bench.contracts.task import MAX_TRAIN_SEED, SEED_BITS
from tmem_bench.harness.plan import make_plan, profile_names
from tmem_bench.registry import get_task, task_names


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
