"""POPGym's environments as tasks (tasks/popgym.py) and closed-loop scoring (harness/closed_loop.py):
the batches are the environment's own episodes, the oracle earns the maximum return, a model acting in
the environment is scored the same on every run and as a step-by-step loop would score it, and a run
of the external profile records both scores and resumes."""
import importlib

import pytest
import torch
import torch.nn as nn

popgym = pytest.importorskip("popgym")

from tmem_bench.contracts.model import TaskModel  # noqa: E402
from tmem_bench.harness.closed_loop import closed_loop_score, episode_returns  # noqa: E402
from tmem_bench.registry import get_backbone, get_task  # noqa: E402
from tmem_bench.tasks.popgym import DIFFICULTIES, TASKS  # noqa: E402

CASES = [(cls.name, d) for cls in TASKS for d in DIFFICULTIES]


def fresh_env(task, difficulty):
    """The environment straight from POPGym, not through the task."""
    module = importlib.import_module(f"popgym.envs.{task.module}")
    return getattr(module, task.family + DIFFICULTIES[difficulty])()


@pytest.mark.parametrize("name,difficulty", CASES)
def test_batches_are_the_environments_own_steps_and_the_labels_earn_its_maximum_return(name, difficulty):
    task, level = get_task(name), {"difficulty": difficulty}
    batch = task.sample(level, 2, torch.Generator().manual_seed(7))
    for i, seed in enumerate(batch["episode_seed"].tolist()):
        env = fresh_env(task, difficulty)
        obs, _ = env.reset(seed=seed)
        labels = dict(zip(batch["positions"][i].tolist(), batch["target"][i].tolist()))
        total, t, done = 0.0, 0, False
        while not done:
            assert task.encode(obs) == tuple(batch["obs"][i, t].tolist()), f"step {t}"
            if name == "popgym_repeat_first":  # the label is the first card, which the state holds
                assert labels[t] == int(env.get_state()[0])
            obs, reward, terminated, truncated, _ = env.step(labels.get(t, 0))
            assert (reward > 0) if t in labels else reward == 0, f"step {t}: reward {reward}"
            total += reward
            t, done = t + 1, terminated or truncated
        assert t == batch["obs"].shape[1]
        assert total == pytest.approx(1.0)  # POPGym scales every episode's return to at most 1


@pytest.mark.parametrize("name,difficulty", [c for c in CASES if c[1] == 1])
def test_the_oracle_reading_a_batchs_observations_gives_its_labels(name, difficulty):
    task, level = get_task(name), {"difficulty": difficulty}
    batch = task.sample(level, 3, torch.Generator().manual_seed(1))
    assert torch.equal(task.oracle(level, batch), batch["target"])
    shuffled = {**batch, "obs": batch["obs"].roll(1, 0)}  # another episode's observations: other labels
    assert not torch.equal(task.oracle(level, shuffled), batch["target"])


def test_a_wrong_label_is_caught_against_the_environments_rewards(monkeypatch):
    task = get_task("popgym_repeat_first")
    monkeypatch.setattr(type(task), "act", lambda self, history, env: (int(history[0, 0]) + 1) % 4)
    with pytest.raises(RuntimeError, match="do not match the environment's rewards"):
        task.sample({"difficulty": 1}, 1, torch.Generator().manual_seed(0))


class OracleModel(nn.Module):
    """Logits that put all their weight on `act` (the oracle, or its opposite) at every position."""

    def __init__(self, task, level, act):
        super().__init__()
        self.task, self.env, self.act = task, task.make_env(level), act

    def forward(self, batch):
        obs = batch["obs"].numpy()
        out = torch.zeros(*batch["positions"].shape, self.task.n_classes)
        for i, where in enumerate(batch["positions"].tolist()):
            for j, t in enumerate(where):
                # % n_classes: closed_loop's buffer runs a step past the episode, on padding never acted on
                out[i, j, self.act(obs[i, :t + 1], self.env) % self.task.n_classes] = 1.0
        return out


@pytest.mark.parametrize("name", [cls.name for cls in TASKS])
def test_acting_by_the_oracle_earns_the_maximum_return_and_its_opposite_the_minimum(name):
    task, level = get_task(name, closed_loop_episodes=3), {"difficulty": 1}
    best = closed_loop_score(task, OracleModel(task, level, task.act), level, "cpu")["closed_loop"]
    assert best["returns"] == pytest.approx([1.0] * 3) and best["mean_return"] == pytest.approx(1.0)
    if name == "popgym_repeat_first":  # every action but the first card is wrong: the minimum
        worst = OracleModel(task, level, lambda h, env: (task.act(h, env) + 1) % 4)
        assert closed_loop_score(task, worst, level, "cpu")["closed_loop"]["mean_return"] == pytest.approx(-1.0)


def tiny_model(task, name="base", seed=0):
    torch.manual_seed(seed)
    return TaskModel(task.make_adapter(16), get_backbone(name, d_model=16, n_layers=1, n_heads=2, dropout=0.1))


def step_by_step_returns(task, model, level, seeds):
    """The closed loop done the slow way: each step, the model reads the observations so far."""
    model.eval()
    returns = []
    for seed in seeds:
        env = task.make_env(level)
        obs, _ = env.reset(seed=seed)
        seen, total, done = [task.encode(obs)], 0.0, False
        while not done:
            x = torch.tensor([seen])
            with torch.no_grad():
                action = model({"obs": x, "positions": torch.tensor([[len(seen) - 1]])}).argmax(-1).item()
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            done = terminated or truncated
            seen.append(task.encode(obs))
        returns.append(total)
    return returns


@pytest.mark.parametrize("name,backbone", [("popgym_repeat_previous", "base"), ("popgym_count_recall", "lstm"),
                                           ("popgym_autoencode", "linear")])
def test_closed_loop_scoring_is_deterministic_and_what_a_step_by_step_loop_scores(name, backbone):
    task, level = get_task(name, closed_loop_episodes=2), {"difficulty": 1}
    model = tiny_model(task, backbone).train()
    first = closed_loop_score(task, model, level, "cpu")["closed_loop"]
    assert model.training  # put back as it was
    again = closed_loop_score(task, tiny_model(task, backbone), level, "cpu")["closed_loop"]
    assert first == again and first["n_episodes"] == 2
    assert first["returns"] == pytest.approx(step_by_step_returns(task, model, level, task.closed_loop_seeds(level)))
    assert -1.0 <= first["mean_return"] <= 1.0
    assert task.closed_loop_seeds(level) != get_task(name, closed_loop_episodes=2).closed_loop_seeds({"difficulty": 2})


def test_a_guess_that_the_environment_contradicts_is_replaced_and_the_pass_run_again(monkeypatch):
    task, level = get_task("popgym_repeat_first", closed_loop_episodes=2), {"difficulty": 1}
    model = tiny_model(task)
    real = type(task).rollout

    def wrong_guess(self, level, seed, env=None):
        episode = real(self, level, seed, env)
        episode["obs"][5:] = (episode["obs"][5:] + 1) % 4  # the guess is wrong from step 5 on
        return episode

    monkeypatch.setattr(type(task), "rollout", wrong_guess)
    seeds = task.closed_loop_seeds(level)
    returns, passes = episode_returns(task, model, level, seeds, "cpu")
    assert passes > 1
    assert returns == pytest.approx(step_by_step_returns(task, model, level, seeds))


def test_levels_are_checked_and_chance_is_the_best_constant_answer():
    from tmem_bench.errors import UsageError

    task = get_task("popgym_count_recall")
    with pytest.raises(UsageError, match="difficulty must be one of 1 \\(Easy\\), 2 \\(Medium\\)"):
        task.validate_level({"difficulty": 3})
    for level in ({"difficulty": 1}, {"difficulty": 2}):
        target = task.sample(level, 64, torch.Generator().manual_seed(3))["target"]
        best = torch.bincount(target.flatten()).max().item() / target.numel()
        assert abs(task.chance(level) - best) < 0.03 and task.chance(level) < 0.25
    assert get_task("popgym_autoencode").chance({"difficulty": 2}) == 0.25


def test_closed_loop_episodes_is_bounded():
    """10^12 episodes were accepted and the cell failed allocating 8 TB: refused in one line naming the bound."""
    from tmem_bench.errors import UsageError
    from tmem_bench.tasks.popgym import MAX_CLOSED_LOOP_EPISODES

    assert get_task("popgym_repeat_first", closed_loop_episodes=MAX_CLOSED_LOOP_EPISODES).closed_loop_episodes \
        == MAX_CLOSED_LOOP_EPISODES
    with pytest.raises(UsageError) as err:
        get_task("popgym_repeat_first", closed_loop_episodes=1_000_000_000_000)
    assert f"from 1 to {MAX_CLOSED_LOOP_EPISODES}" in str(err.value) and "\n" not in str(err.value)
