"""Every registered task, through the task conformance checks; then what is particular to each family.

The generic checks (conformance_tasks: declarations, batches, the oracle and the ceiling, chance,
fingerprints, blocked edges, attention blind under memory forcing, reach positions) run over every
registered task, every variant it names and every level of its own grid, so a new task (or
variant) is covered without new test code, and what these tests know of each task comes from its
own declarations; tests/diagnostics/test_conformance_tasks.py shows that each check can fail. A profile runs the
tasks it lists and no other: a new task need not be in any.
"""
from __future__ import annotations

import subprocess
import sys

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tmem_bench
from tmem_bench.contracts.task import fingerprint
from tmem_bench.diagnostics.conformance_tasks import TASK_CHECKS, TaskSpec, task_check_name, task_levels, task_variants
from tmem_bench.errors import UsageError
from tmem_bench.harness.plan import Cell, load_profile, plan_run, profile_names
from tmem_bench.harness.train import run_cell
from tmem_bench.registry import TASKS, get_task, task_names
from tmem_bench.tasks import map_building, map_building_env, occlusion

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


def cut(blocked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) of an (S, S) mask: the rows with a blocked edge, and the columns blocked for any of them."""
    return blocked.any(1), blocked.any(0)


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


@pytest.mark.parametrize("n_queries", [1, 3])
@pytest.mark.parametrize("encoding", map_building.ENCODINGS)
def test_block_queries_cuts_every_query_from_every_observation(encoding, n_queries):
    T = 5
    task = map_building.MapBuilding(encoding=encoding, n_queries=n_queries, block_queries=True)
    batch = task.sample({"horizon": T}, 4, torch.Generator().manual_seed(0))
    adapter = task.make_adapter(16)
    n_obs = T if encoding == "scalar" else 4 * T
    S = n_obs + n_queries
    assert adapter(batch).shape[1] == S
    R, C = cut(adapter.blocked(batch))
    assert torch.equal(R, torch.arange(S) >= n_obs), "R is not the last Q tokens"
    assert torch.equal(C, torch.arange(S) < n_obs), "C is not every observation token"


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


ENV_IDS = [i for i in gymnasium.registry if i.startswith("tmem_bench/")]
MAP_ENV = "tmem_bench/MapBuilding-v0"


def test_map_building_env_is_registered():
    assert MAP_ENV in ENV_IDS
    tmem_bench.register_envs()  # a second registration is a no-op, not an error
    assert isinstance(gymnasium.make(MAP_ENV).unwrapped, map_building_env.MapBuildingEnv)


def test_importing_the_package_registers_the_env():
    code = f"import gymnasium, tmem_bench; print(type(gymnasium.make({MAP_ENV!r}).unwrapped).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "MapBuildingEnv"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_env_checker(env_id):
    check_env(gymnasium.make(env_id).unwrapped, skip_render_check=True)


@pytest.mark.parametrize("trajectory", map_building.TRAJECTORIES)
def test_map_building_env_checker_per_trajectory(trajectory):
    check_env(map_building_env.MapBuildingEnv(horizon=5, trajectory=trajectory), skip_render_check=True)


@pytest.mark.parametrize("trajectory", map_building.TRAJECTORIES)
def test_map_building_env_agrees_with_the_generator(trajectory):
    horizon = 6
    env = gymnasium.make(MAP_ENV, horizon=horizon, trajectory=trajectory)
    task = map_building.MapBuilding(trajectory=trajectory)
    level = {"horizon": horizon}
    for seed in range(4):
        generator = torch.Generator().manual_seed(seed)
        for episode in range(2):  # a seeded reset, then an unseeded one continuing the same generator
            batch = task.sample(level, 1, generator)
            expected = map_building.tokens(batch)[0].numpy()
            obs, _ = env.reset(seed=seed) if episode == 0 else env.reset()
            seen = [obs]
            for _ in range(horizon):
                obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                assert reward == 0.0 and not terminated and not truncated
                seen.append(obs)
            assert (np.stack(seen) == expected).all()
            answer = int(batch["target"][0, 0])
            _, reward, terminated, _, info = env.step(answer)
            assert terminated and reward == 1.0 and info["answer"] == answer
    env.reset(seed=0)
    for _ in range(horizon):
        env.step(0)
    wrong = 1 - int(task.sample(level, 1, torch.Generator().manual_seed(0))["target"][0, 0])
    assert env.step(wrong)[1] == 0.0


def test_map_building_env_rejects_steps_out_of_an_episode():
    env = map_building_env.MapBuildingEnv(horizon=2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(2)


@pytest.mark.parametrize("n_queries", [1, 3])
def test_map_building_ceiling_counts_unseen_queries(n_queries):
    task = map_building.MapBuilding(p_occupied=0.3, n_queries=n_queries)
    level = {"horizon": 3}
    batch = task.sample(level, 64, torch.Generator().manual_seed(0))
    seen = []
    for windows, queries in zip(batch["windows"].tolist(), batch["query"].tolist()):
        for qr, qc in queries:
            seen.append(any(r <= qr <= r + 1 and c <= qc <= c + 1 for r, c in windows))
    assert len(seen) == batch["target"].numel() == 64 * n_queries
    expected = sum(1.0 if s else 0.7 for s in seen) / len(seen)
    assert 0 < sum(seen) < len(seen)
    assert task.ceiling(level, batch) == pytest.approx(expected, abs=1e-12)
    assert task.chance(level) == pytest.approx(0.7)


def test_map_building_walk_moves_one_cell_at_a_time():
    batch = map_building.MapBuilding(trajectory="walk").sample({"horizon": 40}, 32, torch.Generator().manual_seed(0))
    steps = (batch["windows"][:, 1:] - batch["windows"][:, :-1]).abs().sum(-1)
    assert (steps == 1).all()
    assert batch["windows"].min() >= 0 and batch["windows"].max() <= map_building.GRID - map_building.WINDOW


def test_map_building_rejects_bad_options():
    with pytest.raises(UsageError, match="trajectory 'spiral'.*random, walk"):
        map_building.MapBuilding(trajectory="spiral")
    with pytest.raises(UsageError, match="horizon"):
        map_building.MapBuilding().validate_level({"horizon": 0})
    with pytest.raises(UsageError, match="encoding 'bogus'.*scalar, cells"):
        map_building.MapBuilding(encoding="bogus")
    with pytest.raises(UsageError, match="n_queries"):
        map_building.MapBuilding(n_queries=0)


@pytest.mark.parametrize("encoding", map_building.ENCODINGS)
def test_map_building_asks_n_queries(encoding):
    B, T, Q = 5, 6, 3
    task = map_building.MapBuilding(encoding=encoding, n_queries=Q)
    batch = task.sample({"horizon": T}, B, torch.Generator().manual_seed(0))
    assert batch["query"].shape == (B, Q, 2) and batch["target"].shape == (B, Q)
    adapter = task.make_adapter(16)
    x = adapter(batch)
    assert x.shape == (B, (T if encoding == "scalar" else 4 * T) + Q, 16)
    assert adapter.head(x, batch).shape == (B, Q, 2)
    # A query whose cell a window covered has that cell's observed value as its target.
    offsets = [(0, 0), (0, 1), (1, 0), (1, 1)]  # the patch order
    n_checked = 0
    for b in range(B):
        observed = {}
        for (r, c), patch in zip(batch["windows"][b].tolist(), batch["patches"][b].tolist()):
            observed.update({(r + i, c + j): v for (i, j), v in zip(offsets, patch)})
        for (qr, qc), target in zip(batch["query"][b].tolist(), batch["target"][b].tolist()):
            if (qr, qc) in observed:
                assert observed[qr, qc] == target, (b, qr, qc)
                n_checked += 1
    assert n_checked > 0


def test_map_building_cells_encoding_embeds_each_observed_cell():
    B, T, Q = 4, 5, 3
    task = map_building.MapBuilding(encoding="cells", n_queries=Q)
    batch = task.sample({"horizon": T}, B, torch.Generator().manual_seed(0))
    adapter = task.make_adapter(16)
    with torch.no_grad():
        x = adapter(batch)
        types, values = adapter.type_emb.weight, adapter.value_emb.weight
        # One token per observed cell, in patch order: (r, c), (r, c + 1), (r + 1, c), (r + 1, c + 1).
        r, c = batch["windows"][..., :1], batch["windows"][..., 1:]  # (B, T, 1)
        cells = torch.stack([r * 8 + c, r * 8 + c + 1, (r + 1) * 8 + c, (r + 1) * 8 + c + 1], -1).flatten(1)
        expected_obs = types[0] + adapter.cell_emb(cells) + values[batch["patches"].flatten(1).long()]
        query = batch["query"]
        expected_ask = types[1] + adapter.cell_emb(query[..., 0] * 8 + query[..., 1])
    assert torch.allclose(x[:, :4 * T], expected_obs) and torch.allclose(x[:, 4 * T:], expected_ask)


def test_map_building_with_one_query_samples_the_episodes_it_sampled_before_n_queries():
    def before(batch_size, horizon, generator):
        """The sampler as it was before n_queries (p_occupied 0.5, random windows)."""
        grid = torch.rand(batch_size, 8, 8, generator=generator) < 0.5
        windows = torch.randint(0, 7, (batch_size, horizon, 2), generator=generator)
        query = torch.randint(0, 8, (batch_size, 2), generator=generator)
        b = torch.arange(batch_size)
        rows, cols = windows[..., :1] + torch.tensor([0, 0, 1, 1]), windows[..., 1:] + torch.tensor([0, 1, 0, 1])
        patches = grid[b[:, None, None], rows, cols].float()
        return patches, windows, query, grid[b, query[:, 0], query[:, 1]].long()[:, None]

    for seed in range(3):
        batch = map_building.MapBuilding().sample({"horizon": 10}, 16, torch.Generator().manual_seed(seed))
        patches, windows, query, target = before(16, 10, torch.Generator().manual_seed(seed))
        assert torch.equal(batch["patches"], patches) and torch.equal(batch["windows"], windows)
        assert batch["query"].shape == (16, 1, 2) and torch.equal(batch["query"][:, 0], query)
        assert torch.equal(batch["target"], target)
        # The encoding changes the tokens, not the episodes.
        cells = map_building.MapBuilding(encoding="cells").sample({"horizon": 10}, 16, torch.Generator().manual_seed(seed))
        assert fingerprint(cells) == fingerprint(batch)


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


def test_no_harm_has_no_axis():
    task = get_task("no_harm")
    assert task.validate_level({}) == {}
    with pytest.raises(UsageError, match="none"):
        task.validate_level({"n_writes": 5})
