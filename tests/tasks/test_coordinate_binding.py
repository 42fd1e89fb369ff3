import subprocess
import sys

import numpy as np
import pytest
import torch

from tmem_bench.contracts.task import MAX_TRAIN_SEED, fingerprint
from tmem_bench.errors import UsageError
from tmem_bench.registry import get_task

LEVEL = {"n_writes": 20, "noise": 0.05}


def sample(seed, level=LEVEL, batch_size=16, **options):
    return get_task("coordinate_binding", **options).sample(level, batch_size, torch.Generator().manual_seed(seed))


def test_shapes_and_ranges():
    b = sample(0, {"n_writes": 7, "noise": 0.1}, batch_size=5)
    assert b["keys"].shape == (5, 7, 3) and b["keys"].dtype == torch.float32
    assert b["values"].shape == (5, 7) and b["values"].dtype == torch.int64
    assert b["queries"].shape == (5, 4, 3)
    assert b["target"].shape == (5, 4)
    assert b["keys"].abs().max() <= 1 and b["queries"].abs().max() <= 1
    assert 0 <= b["values"].min() and b["values"].max() < 32


def test_same_seed_same_batch_and_no_global_rng():
    torch.manual_seed(1)
    a = sample(3)
    torch.manual_seed(2)
    b = sample(3)
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(sample(4))


def test_noise_free_queries_hit_written_keys():
    b = sample(0, {"n_writes": 10, "noise": 0.0})
    d = torch.cdist(b["queries"], b["keys"]).min(-1).values
    assert d.max() < 1e-6


def test_nearest_key_oracle_scores_100_percent_on_eval_set():
    task = get_task("coordinate_binding")
    for level in ({"n_writes": 5, "noise": 0.0}, {"n_writes": 50, "noise": 0.1}):
        batch, _ = task.eval_set(level, 512)
        keys, values, queries = (batch[k].double().numpy() for k in ("keys", "values", "queries"))
        dist = ((queries[:, :, None, :] - keys[:, None, :, :]) ** 2).sum(-1)  # (B, Q, W)
        oracle = np.take_along_axis(values, dist.argmin(-1), axis=1)
        assert (oracle == batch["target"].numpy()).mean() == 1.0
        assert task.ceiling(level, batch) == 1.0
        assert task.chance(level) == pytest.approx(1 / 32)


def test_eval_seed_is_reserved_and_per_level():
    task = get_task("coordinate_binding")
    seeds = {task.eval_seed({"n_writes": w, "noise": s}) for w in (5, 10, 20, 50) for s in (0.0, 0.05, 0.1)}
    assert len(seeds) == 12
    assert min(seeds) >= MAX_TRAIN_SEED


def test_fingerprint_is_stable_across_processes():
    task = get_task("coordinate_binding")
    _, here = task.eval_set(LEVEL, 256)
    code = (
        "from tmem_bench.registry import get_task;"
        f"print(get_task('coordinate_binding').eval_set({LEVEL!r}, 256)[1])"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert here == there


def test_memory_forcing_mask_blocks_every_query_to_write_edge():
    task = get_task("coordinate_binding", block_queries=True)
    b = sample(0, {"n_writes": 6, "noise": 0.0}, batch_size=2)
    blocked = task.make_adapter(16).blocked(b)
    assert blocked.shape == (10, 10)
    assert blocked[6:, :6].all() and not blocked[:6].any() and not blocked[6:, 6:].any()
    assert get_task("coordinate_binding").make_adapter(16).blocked(b) is None


@pytest.mark.parametrize("level", [{"n_writes": 0, "noise": 0.0}, {"n_writes": 2.5, "noise": 0.0},
                                   {"n_writes": 5, "noise": -1.0}, {"n_writes": 5}])
def test_bad_levels_are_rejected(level):
    with pytest.raises(UsageError):
        get_task("coordinate_binding").validate_level(level)
