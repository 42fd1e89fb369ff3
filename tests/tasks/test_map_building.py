"""Map building: memory forcing's cut, the gymnasium environment, the walk, queries and encodings."""
from __future__ import annotations

import subprocess
import sys

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tmem_bench
from tests.tasks.helpers import cut
from tmem_bench.contracts.task import fingerprint
from tmem_bench.errors import UsageError
from tmem_bench.tasks import map_building, map_building_env


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
