"""The reference states of known content (tmem_bench.diagnostics.probe_references): each state holds
what its format says, built from the writes alone, and its best possible read is what the format
allows, computed exactly. The probe reading them is tested in tests/diagnostics/test_state_probe.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tmem_bench.diagnostics.probe_references import BY_NAME, GRID, REFERENCES, reference_model, state_format
from tmem_bench.registry import get_backbone, get_task

TASK = get_task("coordinate_binding", block_queries=True)
LEVEL = TASK.validate_level({"n_writes": 10, "noise": 0.05})
BATCH = TASK.sample(LEVEL, 512, torch.Generator().manual_seed(3))
W, N = 10, TASK.n_classes


def state(name, batch=BATCH):
    return reference_model(name, TASK, LEVEL).memory_state(batch, W)


def best(name, batch=BATCH):
    return reference_model(name, TASK, LEVEL).backbone.best_read(TASK, batch)


def test_the_slot_table_holds_every_key_and_value_and_the_half_one_every_second():
    rows = state("slots")["slots"]  # (B, W, 3 + N)
    assert torch.equal(rows[..., :3], BATCH["keys"]) and torch.equal(rows[..., 3:].argmax(-1), BATCH["values"])
    half = state("slots_half")["slots"]
    assert torch.equal(half[:, ::2], rows[:, ::2]) and not half[:, 1::2].any()


def test_mixed_rows_are_the_rows_under_one_rotation_and_the_key_value_matrix_rotated_on_both_sides():
    rows, mixed = state("slots")["slots"], state("slots_mixed")["slots"]
    assert torch.allclose(rows.norm(dim=2).sort(1).values, mixed.norm(dim=2).sort(1).values, atol=1e-5)
    assert not torch.allclose(rows, mixed)
    S, turned = state("kv")["S"], state("kv_mixed")["S"]
    assert torch.allclose(torch.linalg.svdvals(S), torch.linalg.svdvals(turned), atol=1e-4)
    assert not torch.allclose(S, turned, atol=1e-2)


def test_a_rotation_keeps_everything_and_changes_every_coordinate():
    for plain, rotated, key in (("slots", "slots_rotated", "slots"), ("kv", "kv_rotated", "S")):
        a, b = state(plain)[key].flatten(1), state(rotated)["state"]
        assert torch.allclose(a.norm(dim=1), b.norm(dim=1), rtol=1e-4)  # orthogonal: nothing lost
        assert (a - b).abs().mean() > 0.1 * a.abs().mean()
    grid, turned = state("voxel")["grid"], state("voxel_mixed")["grid"]
    assert torch.allclose(grid.flatten(2).norm(dim=1).sort(1).values, turned.flatten(2).norm(dim=1).sort(1).values,
                          atol=1e-5)  # every cell kept, in another place
    assert not torch.allclose(grid, turned)


def test_the_key_value_matrix_returns_every_written_value_at_its_key():
    memory = reference_model("kv", TASK, LEVEL).backbone
    S = state("kv")["S"]  # (B, F, N)
    read = torch.einsum("bwf,bfn->bwn", memory.phi(BATCH["keys"]), S)
    assert torch.allclose(read, F.one_hot(BATCH["values"], N).float(), atol=1e-3)


def test_each_voxel_holds_the_value_of_the_write_nearest_its_centre():
    grid = state("voxel")["grid"]  # (B, N, G, G, G), channels first
    assert grid.shape[1:] == (N, GRID, GRID, GRID) and torch.equal(grid.sum(1), torch.ones_like(grid[:, 0]))
    centre = torch.tensor([-1 + 1 / GRID, 1 - 1 / GRID, -1 + 3 / GRID])  # cell (0, G - 1, 1)
    nearest = ((BATCH["keys"] - centre) ** 2).sum(-1).argmin(1)
    assert torch.equal(grid[:, :, 0, GRID - 1, 1].argmax(1), BATCH["values"].gather(1, nearest[:, None])[:, 0])


def test_the_dense_vector_tells_apart_sequences_that_differ_in_one_write():
    other = {**BATCH, "values": BATCH["values"].clone()}
    other["values"][:, 7] = (other["values"][:, 7] + 1) % N
    assert (state("dense")["h"] - state("dense", other)["h"]).abs().amax(1).min() > 1e-3
    assert torch.equal(state("dense_half")["h"], state("dense_half", {**other, "values": torch.where(
        torch.arange(W) == 7, BATCH["values"], other["values"])})["h"])


def test_the_best_possible_reads_are_what_each_format_allows():
    chance = 1 / N
    assert best("slots") == best("slots_rotated") == best("dense") == 1.0
    assert best("slots_mixed") == 1.0
    assert best("kv") == best("kv_rotated") == best("kv_mixed") > 0.95 and best("voxel") == best("voxel_mixed") > 0.9
    # Half the writes dropped: right where the nearest write was kept, chance where not.
    nearest = ((BATCH["queries"][:, :, None] - BATCH["keys"][:, None]) ** 2).sum(-1).argmin(-1)
    kept = (nearest % 2 == 0).float().mean().item()
    assert best("slots_half") == pytest.approx(kept + (1 - kept) * chance, abs=1e-6)
    for name in ("kv_half", "voxel_half"):
        assert chance < best(name) <= best("slots_half") + 1e-6
    assert best("constant") == best("noise") == chance


def test_constant_and_noise_hold_nothing_of_the_writes_and_noise_is_the_same_on_rerun():
    other = TASK.sample(LEVEL, 512, torch.Generator().manual_seed(4))
    assert torch.equal(state("constant")["state"], state("constant", other)["state"])
    assert torch.equal(state("noise")["state"], state("noise")["state"])
    assert not torch.equal(state("noise")["state"], state("noise", other)["state"])


def test_every_reference_is_named_once_and_the_suites_memories_have_a_format():
    assert len(BY_NAME) == len(REFERENCES)
    x = torch.randn(2, 5, 16)
    for name, fmt in (("slots", "slots"), ("delta", "kv"), ("lstm", "dense"), ("tensor", "voxel")):
        backbone = get_backbone(name, d_model=16, n_layers=1, n_heads=2)
        assert state_format(name, backbone, backbone.memory_state(x)) == fmt
    plugin = get_backbone("tensor", d_model=16, n_layers=1, n_heads=2)
    assert state_format("my_grid", plugin, plugin.memory_state(x)) == "voxel"  # by its tensors' shapes
