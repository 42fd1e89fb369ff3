"""POPGym's memory environments as tasks: imitation of an oracle that sees only the observations.

POPGym (Morad et al., ICLR 2023, arXiv 2303.01859; `pip install -e ".[popgym]"`) is a collection
of partially observable environments. Four of its card games are tasks here, each at two of its
difficulties (the `difficulty` axis: 1 = Easy, 2 = Medium; Hard is left out for its length and
cost on the CPU):

  popgym_repeat_first     say the suit of the first card dealt, at every step
  popgym_repeat_previous  say the suit of the card dealt k - 1 steps before the last (k = 4, 32)
  popgym_autoencode       watch a deck go by, then recite its suits in reverse order
  popgym_count_recall     say how many cards of the queried colour (Easy) or suit (Medium) were dealt

An episode is rolled out from the environment itself, reset with a seed drawn from the task's
generator. At every step an oracle acts from the observations so far; the step's label is its
action, which is the best action given the environment's state (the oracle reads only what the
agent has seen, so a perfect memory earns the maximum return). Only the steps whose reward
depends on the action are scored (RepeatPrevious ignores its first k - 1 actions and Autoencode
every action while it deals); `sample` checks against the environment's own rewards that these
are exactly the rewarded steps and that the oracle earned every one of them.

Tokens: one per step, the sum of an embedding per observation field and a learned position
embedding (attention needs positions to find "k steps back"; every model gets the same tokens).
The head reads each scored step's output. Besides accuracy on the labels, a trained model is
scored acting in the environment itself (`tmem_bench.harness.closed_loop`): the mean episode
return over fixed seeds, which these environments already scale to [-1, 1] (the maximum is 1),
the normalised return POPGym reports.

The games' observations do not depend on the agent's actions, so the oracle's rollout gives every
policy's observations; `closed_loop` still steps the environments with the model's own actions.
Position-only CartPole is left out: its best action is not unique (many controllers keep the pole
up for the whole episode), so oracle-action accuracy would score imitation of one arbitrary
controller, and its episodes end early under a poor policy.
"""
from __future__ import annotations

import functools
import importlib

import numpy as np
import torch
import torch.nn as nn

from tmem_bench.contracts.task import MAX_TRAIN_SEED, Adapter, Batch, Level, Task
from tmem_bench.errors import UsageError, check_int
from tmem_bench.levels import level_key

DIFFICULTIES = {1: "Easy", 2: "Medium"}
INSTALL_HINT = "pip install -e \".[popgym]\" (from a clone) or pip install popgym"
# Episodes for the empirical chance level where the labels are not uniform (CountRecall).
CHANCE_EPISODES = 1024


class PopgymAdapter(Adapter):
    def __init__(self, d_model: int, vocab: tuple[int, ...], max_steps: int, n_classes: int, block_past: bool = False):
        super().__init__()
        self.block_past = block_past
        self.fields = nn.ModuleList(nn.Embedding(v, d_model) for v in vocab)
        self.position = nn.Embedding(max_steps, d_model)
        self.head_proj = nn.Linear(d_model, n_classes)

    def forward(self, batch: Batch) -> torch.Tensor:
        obs = batch["obs"]  # (B, T, F)
        x = sum(emb(obs[..., i]) for i, emb in enumerate(self.fields))  # (B, T, d)
        return x + self.position(torch.arange(obs.shape[1], device=obs.device))

    def blocked(self, batch: Batch) -> torch.Tensor | None:
        if not self.block_past:
            return None
        T = batch["obs"].shape[1]
        # Each step attends to its own observation only: every earlier one reaches it through a memory.
        return torch.ones(T, T, dtype=torch.bool).tril(-1)  # (T, T)

    def head(self, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        where = batch["positions"]  # (B, n_scored)
        picked = torch.gather(h, 1, where[..., None].expand(-1, -1, h.shape[-1]))  # (B, n_scored, d)
        return self.head_proj(picked)  # (B, n_scored, n_classes)


# Every closed-loop episode's seed is drawn at once and its rollout kept until scored: 10^12 episodes
# were accepted and the cell then failed allocating 8 TB for the seeds alone.
MAX_CLOSED_LOOP_EPISODES = 100_000


class PopgymTask(Task):
    """One POPGym environment family; subclasses name it and give its oracle."""

    module = ""  # popgym.envs.<module>
    family = ""  # class name prefix: <family>Easy, <family>Medium
    vocab: tuple[int, ...] = ()  # values of each observation field
    axes = ("difficulty",)
    levels = {"difficulty": (1, 2)}
    uniform_labels = True  # every class equally likely at every scored step: chance is 1 / n_classes
    # Memory forcing: the environment's observations as it gives them, but each step's attention
    # sees its own observation only, so attention alone is blind to every earlier one.
    variants = {"standard": {}, "memory_forcing": {"block_past": True}}
    memory_forcing = ("memory_forcing",)

    def __init__(self, closed_loop_episodes: int = 32, block_past: bool = False):
        self.closed_loop_episodes = check_int("closed_loop_episodes", closed_loop_episodes,
                                              maximum=MAX_CLOSED_LOOP_EPISODES)
        if not isinstance(block_past, bool):
            raise UsageError(f"{self.name}: block_past must be true or false, got {block_past!r}")
        self.block_past = block_past
        self._envs = {}

    def options(self) -> dict:
        # block_past only where set, so the cells of the standard variant keep the ids they had.
        return {"closed_loop_episodes": self.closed_loop_episodes, **({"block_past": True} if self.block_past else {})}

    def check_value(self, axis: str, value):
        if isinstance(value, bool) or value not in DIFFICULTIES:
            raise UsageError(f"{self.name}: difficulty must be one of {', '.join(f'{k} ({v})' for k, v in DIFFICULTIES.items())}, "
                             f"got {value!r}")
        return int(value)

    # The environment -------------------------------------------------------------------------

    def make_env(self, level: Level):
        """A fresh environment of the level's difficulty."""
        try:
            module = importlib.import_module(f"popgym.envs.{self.module}")
        except ImportError as e:
            raise UsageError(f"task {self.name!r} needs POPGym, which is not installed ({e}): {INSTALL_HINT}") from None
        return getattr(module, self.family + DIFFICULTIES[level["difficulty"]])()

    def _env(self, level: Level):
        key = level["difficulty"]
        if key not in self._envs:
            self._envs[key] = self.make_env(level)
        return self._envs[key]

    def encode(self, obs) -> tuple[int, ...]:
        """An observation as the integers of its fields."""
        return tuple(int(v) for v in np.atleast_1d(np.asarray(obs)))

    def act(self, history: np.ndarray, env) -> int:
        """The oracle: the best action after the observations `history` (t + 1, F); reads the
        environment only for its fixed settings (k, the number of cards), never its state."""
        raise NotImplementedError

    def scored(self, history: np.ndarray, env) -> bool:
        """Whether the action after `history` is rewarded (the reward depends on it)."""
        return True

    def rollout(self, level: Level, seed: int, env=None) -> dict[str, np.ndarray]:
        """One episode from `env.reset(seed=seed)` with the oracle acting: observations (T, F),
        actions (T,), rewards (T,) and which steps are scored (T,)."""
        env = env if env is not None else self._env(level)
        obs, _ = env.reset(seed=seed)
        history = np.zeros((env.max_episode_length + 1, len(self.vocab)), dtype=np.int64)
        actions, rewards, scored = [], [], []
        for t in range(len(history)):
            history[t] = self.encode(obs)
            seen = history[:t + 1]
            actions.append(self.act(seen, env))
            scored.append(self.scored(seen, env))
            obs, reward, terminated, truncated, _ = env.step(actions[-1])
            rewards.append(float(reward))
            if terminated or truncated:
                break
        else:
            raise RuntimeError(f"{self.name}: an episode ran past the environment's max_episode_length")
        return {"obs": history[:t + 1].copy(), "actions": np.asarray(actions, dtype=np.int64),
                "rewards": np.asarray(rewards), "scored": np.asarray(scored)}

    # The task contract ---------------------------------------------------------------------

    def sample(self, level: Level, batch_size: int, generator: torch.Generator) -> Batch:
        seeds = torch.randint(0, MAX_TRAIN_SEED, (batch_size,), generator=generator)
        episodes = [self.rollout(level, int(s)) for s in seeds]
        positions = np.flatnonzero(episodes[0]["scored"])
        for seed, ep in zip(seeds.tolist(), episodes):
            # The environment's own rewards say which steps count and that the oracle earned them.
            if not np.array_equal(np.flatnonzero(ep["rewards"] != 0), positions) or (ep["rewards"][positions] <= 0).any():
                raise RuntimeError(f"{self.name} at {level_key(level)}, episode seed {seed}: the oracle's labels do not "
                                   "match the environment's rewards (a POPGym version this task was not written for?)")
        obs = torch.from_numpy(np.stack([ep["obs"] for ep in episodes]))  # (B, T, F)
        actions = torch.from_numpy(np.stack([ep["actions"] for ep in episodes]))  # (B, T)
        where = torch.from_numpy(positions).expand(batch_size, -1).contiguous()  # (B, n_scored)
        return {"obs": obs, "positions": where, "target": torch.gather(actions, 1, where), "episode_seed": seeds}

    def oracle(self, level: Level, batch: Batch) -> torch.Tensor:
        env = self._env(level)
        obs = batch["obs"].numpy()
        return torch.tensor([[self.act(episode[:t + 1], env) for t in where]
                             for episode, where in zip(obs, batch["positions"].tolist())], dtype=torch.int64)

    def reach_positions(self, level: Level, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Under memory forcing: the observations before the first scored step after the first as the
        evidence, and the scored steps from there on as the answers (each reads earlier observations,
        which reach it only through a memory; a step scored at t=0 answers from its own observation
        and is no answer here)."""
        if not self.block_past:
            return None
        T = batch["obs"].shape[1]
        scored = batch["positions"][0]
        first = int(scored[scored > 0][0])
        evidence = torch.arange(T) < first
        answers = torch.zeros(T, dtype=torch.bool)
        answers[scored[scored >= first]] = True
        return evidence, answers

    def chance(self, level: Level) -> float:
        if self.uniform_labels:
            return 1.0 / self.n_classes
        return _best_constant(type(self), level["difficulty"])

    def max_steps(self) -> int:
        """The longest episode at any difficulty: the adapter's position table."""
        return max(self._env({"difficulty": d}).max_episode_length + 1 for d in DIFFICULTIES)

    def make_adapter(self, d_model: int) -> Adapter:
        return PopgymAdapter(d_model, self.vocab, self.max_steps(), self.n_classes, self.block_past)

    def closed_loop_seeds(self, level: Level) -> list[int]:
        """The fixed environment seeds the closed-loop score acts on, from their own reserved seed."""
        seed = self.reserved_seed("closed_loop", level)
        drawn = torch.randint(0, MAX_TRAIN_SEED, (self.closed_loop_episodes,), generator=torch.Generator().manual_seed(seed))
        return drawn.tolist()


@functools.cache
def _best_constant(cls: type, difficulty: int) -> float:
    """Accuracy of the best constant answer on reference episodes from their own seed (the labels
    do not depend on the task's options)."""
    task, level = cls(), {"difficulty": difficulty}
    seed = task.reserved_seed("chance", level)
    target = task.sample(level, CHANCE_EPISODES, torch.Generator().manual_seed(seed))["target"]
    return torch.bincount(target.flatten(), minlength=task.n_classes).max().item() / target.numel()


class RepeatFirst(PopgymTask):
    name = "popgym_repeat_first"
    module, family = "repeat_first", "RepeatFirst"
    vocab = (4,)
    n_classes = 4

    def act(self, history, env):
        return int(history[0, 0])


class RepeatPrevious(PopgymTask):
    name = "popgym_repeat_previous"
    module, family = "repeat_previous", "RepeatPrevious"
    vocab = (4,)
    n_classes = 4

    def scored(self, history, env):
        return len(history) >= env.k

    def act(self, history, env):
        # The environment rewards the suit of its k-th most recent card; before k cards, nothing.
        return int(history[-env.k, 0]) if len(history) >= env.k else 0


class Autoencode(PopgymTask):
    """Observations are (mode, suit) with mode 1 while dealing and 0 once the last card is shown;
    from then on the cards are recited from the last one back."""

    name = "popgym_autoencode"
    module, family = "autoencode", "Autoencode"
    vocab = (2, 4)
    n_classes = 4

    def scored(self, history, env):
        return history[-1, 0] == 0

    def act(self, history, env):
        playing = np.flatnonzero(history[:, 0] == 0)
        if not len(playing):
            return 0
        first = playing[0]  # the step that showed the last card
        return int(history[2 * first - (len(history) - 1), 1])


class CountRecall(PopgymTask):
    """Observations are (dealt card, queried card), as colours at Easy and suits at Medium; the
    answer is how many cards like the queried one have been dealt, this step's included."""

    name = "popgym_count_recall"
    module, family = "count_recall", "CountRecall"
    vocab = (4, 4)
    n_classes = 27  # counts 0..26: 26 cards of each colour in one deck, of each suit in two
    uniform_labels = False
    # Counts grow with the step, so a step's position alone tells much of its answer: with the past cut
    # from attention, attention still reads well above chance (the task checks' blind check says so),
    # so this task has no memory-forcing variant.
    variants = {"standard": {}}
    memory_forcing = ()

    def act(self, history, env):
        return int((history[:, 0] == history[-1, 1]).sum())


TASKS = (RepeatFirst, RepeatPrevious, Autoencode, CountRecall)
