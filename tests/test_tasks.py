"""Every registered task, through the task contract; then what is particular to each family.

Generic tests are parametrised over `task_names()` and over the task variants the
built-in profiles list, so a new task (or variant) is covered without new test code.
"""
from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tmem_bench
from tmem_bench.errors import UsageError
from tmem_bench.plan import VARIANT_KEYS, Cell, load_profile
from tmem_bench.registry import get_backbone, get_task, task_names
from tmem_bench.task import MAX_TRAIN_SEED, fingerprint, level_key
from tmem_bench.tasks import map_building, occlusion
from tmem_bench.train import run_cell

TASKS = task_names()
PROFILES = ("quick", "paper")
EVAL_N = 2048


def profile_levels(name: str, profile: str = "quick") -> list[dict]:
    task = get_task(name)
    levels = load_profile(profile)["tasks"][name].get("levels", {})
    return [task.validate_level(dict(zip(task.axes, combo))) for combo in itertools.product(*(levels[a] for a in task.axes))]


def variants() -> list[tuple[str, dict]]:
    """(task, options) for every task's default and every variant a built-in profile lists."""
    out = {(name, "{}"): (name, {}) for name in TASKS}
    for profile in PROFILES:
        for name, section in load_profile(profile).get("tasks", {}).items():
            for variant in section.get("variants", []):
                options = {k: v for k, v in variant.items() if k not in VARIANT_KEYS}
                out[(name, json.dumps(options, sort_keys=True))] = (name, options)
    return list(out.values())


VARIANTS = variants()
VARIANT_IDS = [f"{n}-{','.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for n, o in VARIANTS]


def binomial_tolerance(n: int, p: float = 0.5) -> float:
    return 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("name", TASKS)
def test_every_task_is_in_every_profile(name):
    for profile in PROFILES:
        assert name in load_profile(profile)["tasks"], f"{name} has no [tasks.{name}] in {profile}.toml"


@pytest.mark.parametrize("name,options", VARIANTS, ids=VARIANT_IDS)
def test_shapes_and_dtypes(name, options):
    task = get_task(name, **options)
    for level in profile_levels(name):
        batch = task.sample(level, 5, torch.Generator().manual_seed(0))
        target = batch["target"]
        assert target.dtype == torch.int64 and target.ndim == 2 and target.shape[0] == 5
        assert 0 <= target.min() and target.max() < task.n_classes
        assert all(v.shape[0] == 5 for v in batch.values())
        adapter = task.make_adapter(16)
        x = adapter(batch)
        assert x.shape[0] == 5 and x.shape[2] == 16 and x.dtype == torch.float32
        logits = adapter.head(torch.randn_like(x), batch)
        assert logits.shape == (5, target.shape[1], task.n_classes)
        blocked = adapter.blocked(batch)
        assert blocked is None or (blocked.dtype == torch.bool and blocked.shape == (x.shape[1], x.shape[1]))


@pytest.mark.parametrize("name", TASKS)
def test_sampling_is_determined_by_the_generator(name):
    task = get_task(name)
    level = profile_levels(name)[-1]
    a = fingerprint(task.sample(level, 16, torch.Generator().manual_seed(3)))
    b = fingerprint(task.sample(level, 16, torch.Generator().manual_seed(3)))
    c = fingerprint(task.sample(level, 16, torch.Generator().manual_seed(4)))
    assert a == b != c


@pytest.mark.parametrize("name", TASKS)
def test_eval_seeds_are_disjoint_from_training_seeds(name):
    task = get_task(name)
    levels = profile_levels(name, "quick") + profile_levels(name, "paper")
    seeds = {level_key(level): task.eval_seed(level) for level in levels}
    assert all(seed >= MAX_TRAIN_SEED for seed in seeds.values())
    assert len(set(seeds.values())) == len(seeds), "two levels share an evaluation set seed"


FINGERPRINTS = """
import itertools, json, sys
from tmem_bench.plan import load_profile
from tmem_bench.registry import get_task, task_names
from tmem_bench.task import level_key
out = {}
for name in task_names():
    task = get_task(name)
    levels = load_profile("quick")["tasks"][name].get("levels", {})
    for combo in itertools.product(*(levels[a] for a in task.axes)):
        level = task.validate_level(dict(zip(task.axes, combo)))
        out[f"{name}|{level_key(level)}"] = task.eval_set(level, int(sys.argv[1]))[1]
print(json.dumps(out))
"""


def test_fingerprints_are_stable_across_processes():
    out = subprocess.run([sys.executable, "-c", FINGERPRINTS, "64"], capture_output=True, text=True, check=True)
    there = json.loads(out.stdout.strip().splitlines()[-1])
    here = {f"{name}|{level_key(level)}": get_task(name).eval_set(level, 64)[1]
            for name in TASKS for level in profile_levels(name)}
    assert there == here


@pytest.mark.parametrize("name,options", VARIANTS, ids=VARIANT_IDS)
def test_oracle_reaches_the_ceiling(name, options):
    task = get_task(name, **options)
    levels = profile_levels(name) + profile_levels(name, "paper")
    for level in [dict(k) for k in dict.fromkeys(tuple(level.items()) for level in levels)]:
        batch, _ = task.eval_set(level, EVAL_N)
        ceiling = task.ceiling(level, batch)
        accuracy = (task.oracle(level, batch) == batch["target"]).float().mean().item()
        if ceiling == 1.0:
            assert accuracy == 1.0, level
        else:
            # The ceiling is an expectation; the oracle's guesses on this set scatter around it.
            assert abs(accuracy - ceiling) < binomial_tolerance(batch["target"].numel()), (level, accuracy, ceiling)
        assert task.chance(level) <= ceiling <= 1.0


@pytest.mark.parametrize("name", TASKS)
def test_chance_is_the_best_constant_predictor(name):
    task = get_task(name)
    for level in profile_levels(name):
        batch, _ = task.eval_set(level, EVAL_N)
        target = batch["target"]
        best = max((target == c).float().mean().item() for c in range(task.n_classes))
        chance = task.chance(level)
        # Targets within one sample may be dependent, so the tolerance counts samples, not targets.
        assert abs(best - chance) < binomial_tolerance(target.shape[0], chance), (level, best, chance)


@pytest.mark.parametrize("name,options", VARIANTS, ids=VARIANT_IDS)
def test_tiny_end_to_end_run(name, options):
    task = get_task(name, **options)
    levels = tuple(profile_levels(name))
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


BLOCKING = [(n, o) for n, o in VARIANTS if o.get("block_queries")]


@pytest.mark.parametrize("name,options", BLOCKING, ids=[f"{n}" for n, _ in BLOCKING])
def test_block_queries_cuts_every_edge_from_queries_to_earlier_tokens(name, options):
    task = get_task(name, **options)
    level = profile_levels(name)[0]
    batch = task.sample(level, 4, torch.Generator().manual_seed(0))
    adapter = task.make_adapter(16)
    x = adapter(batch).detach()
    S, n = x.shape[1], batch["target"].shape[1]
    blocked = adapter.blocked(batch)
    assert blocked[S - n:, :S - n].all() and not blocked[:S - n].any()
    # Through attention alone (the plain transformer), queries cannot see what came before them.
    backbone = get_backbone("base", d_model=16, n_layers=2, n_heads=2, dropout=0.0).eval()
    x2 = x.clone()
    x2[:, :S - n] = torch.randn(4, S - n, 16)
    with torch.no_grad():
        assert torch.equal(backbone(x, blocked)[:, S - n:], backbone(x2, blocked)[:, S - n:])


ENV_IDS = [i for i in gymnasium.registry if i.startswith("tmem_bench/")]
MAP_ENV = "tmem_bench/MapBuilding-v0"


def test_map_building_env_is_registered():
    assert MAP_ENV in ENV_IDS
    tmem_bench.register_envs()  # a second registration is a no-op, not an error
    assert isinstance(gymnasium.make(MAP_ENV).unwrapped, map_building.MapBuildingEnv)


def test_importing_the_package_registers_the_env():
    code = f"import gymnasium, tmem_bench; print(type(gymnasium.make({MAP_ENV!r}).unwrapped).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "MapBuildingEnv"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_env_checker(env_id):
    check_env(gymnasium.make(env_id).unwrapped, skip_render_check=True)


@pytest.mark.parametrize("trajectory", map_building.TRAJECTORIES)
def test_map_building_env_checker_per_trajectory(trajectory):
    check_env(map_building.MapBuildingEnv(horizon=5, trajectory=trajectory), skip_render_check=True)


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
    env = map_building.MapBuildingEnv(horizon=2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(2)


def test_map_building_ceiling_counts_unseen_queries():
    task = map_building.MapBuilding(p_occupied=0.3)
    level = {"horizon": 3}
    batch = task.sample(level, 64, torch.Generator().manual_seed(0))
    seen = []
    for windows, (qr, qc) in zip(batch["windows"].tolist(), batch["query"].tolist()):
        seen.append(any(r <= qr <= r + 1 and c <= qc <= c + 1 for r, c in windows))
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
