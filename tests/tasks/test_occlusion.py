"""Occlusion: memory forcing's cut, the hidden frames, the ceiling, bad options."""
from __future__ import annotations

import pytest
import torch

from tests.tasks.helpers import cut
from tmem_bench.errors import UsageError
from tmem_bench.tasks import occlusion


@pytest.mark.parametrize("length", [0, 1, 2, 3])
def test_block_hidden_cuts_hidden_frames_from_visible_frames(length):
    T = 4
    task = occlusion.Occlusion(n_frames=T, hide="end", block_hidden=True)
    batch = task.sample({"occlusion_len": length}, 4, torch.Generator().manual_seed(0))
    assert batch["occlusion_len"].tolist() == [length] * 4
    blocked = task.make_adapter(16).blocked(batch)
    frame = torch.arange(T * occlusion.N_PATCHES) // occlusion.N_PATCHES  # the frame of each token
    if length == 0:
        assert blocked.shape == (T * 16, T * 16) and not blocked.any()
        return
    R, C = cut(blocked)
    assert torch.equal(R, frame >= T - length), "R is not the tokens of the last L frames"
    assert torch.equal(C, frame < T - length), "C is not the tokens of the visible frames"


def test_occlusion_without_block_hidden_has_no_mask_and_no_extra_key():
    task = occlusion.Occlusion(n_frames=4, hide="end")
    batch = task.sample({"occlusion_len": 2}, 4, torch.Generator().manual_seed(0))
    assert set(batch) == {"frames", "target"}  # the fingerprints of existing variants are unchanged
    assert task.make_adapter(16).blocked(batch) is None


@pytest.mark.parametrize("options", [
    {"block_hidden": True},  # hide defaults to "middle"
    {"hide": "middle", "block_hidden": True},
    {"hide": "end", "occluder": True, "block_hidden": True},
])
def test_block_hidden_needs_hide_end_and_no_occluder(options):
    with pytest.raises(UsageError, match="block_hidden"):
        occlusion.Occlusion(**options)


def test_block_hidden_is_an_option_only_when_true():
    plain = occlusion.Occlusion(hide="end").options()
    assert "block_hidden" not in plain and occlusion.Occlusion(hide="end", block_hidden=False).options() == plain
    assert occlusion.Occlusion(hide="end", block_hidden=True).options() == {**plain, "block_hidden": True}


def test_occlusion_quadrant_is_the_top_left_pixel_and_the_ball_wraps():
    task = occlusion.Occlusion(n_frames=2)
    frames = task.render(torch.tensor([[7, 15]]), torch.tensor([[1, 1]]), 0)  # (1, 2, 16, 16)
    lit = {tuple(p) for p in frames[0, 0].nonzero().tolist()}
    assert lit == {(7, 15), (7, 0), (8, 15), (8, 0)}
    assert occlusion.quadrant(torch.tensor([7, 15])) == 1  # straddles all four quadrants; its top-left is in 1
    assert {tuple(p) for p in frames[0, 1].nonzero().tolist()} == {(8, 0), (8, 1), (9, 0), (9, 1)}


@pytest.mark.parametrize("options", [{}, {"hide": "end"}, {"occluder": True}, {"occluder": True, "hide": "end"}])
def test_occlusion_hides_the_ball_exactly_in_the_hidden_frames(options):
    task = occlusion.Occlusion(**options)
    for length in range(task.n_frames + 1):
        batch = task.sample({"occlusion_len": length}, 64, torch.Generator().manual_seed(length))
        hidden = task.hidden_frames(length)
        assert int(hidden.sum()) == length
        ball = (batch["frames"] == 1).flatten(2).any(-1)  # (B, T)
        assert not ball[:, hidden].any()
        occluder = (batch["frames"] == occlusion.OCCLUDER_VALUE).flatten(2).any(-1)
        if task.occluder and 0 < length:
            assert occluder.all()  # static, visible in every frame
        else:
            assert not occluder.any() and ball[:, ~hidden].all()


def test_occlusion_ceiling_with_one_visible_frame_matches_enumeration():
    task = occlusion.Occlusion(hide="end")
    T = task.n_frames
    level = {"occlusion_len": T - 1}
    batch = task.sample(level, 64, torch.Generator().manual_seed(0))
    total = 0.0
    for frame in batch["frames"][:, 0]:
        lit = {tuple(p) for p in frame.nonzero().tolist()}
        (r, c), = [(r, c) for r, c in lit if ((r + 1) % 16, (c + 1) % 16) in lit]
        counts = [0] * 4
        for dr, dc in occlusion.VELOCITIES.tolist():
            counts[int(occlusion.quadrant(torch.tensor([(r + (T - 1) * dr) % 16, (c + (T - 1) * dc) % 16])))] += 1
        total += max(counts) / sum(counts)
    assert task.ceiling(level, batch) == pytest.approx(total / 64, abs=1e-12)
    assert task.ceiling(level, batch) < 1.0
    assert task.ceiling({"occlusion_len": 0}, task.sample({"occlusion_len": 0}, 64, torch.Generator())) == 1.0


def test_occlusion_rejects_bad_levels_and_options():
    with pytest.raises(UsageError, match="occlusion_len must be at most n_frames"):
        occlusion.Occlusion().validate_level({"occlusion_len": 9})
    with pytest.raises(UsageError, match="hide 'start'.*middle, end"):
        occlusion.Occlusion(hide="start")
