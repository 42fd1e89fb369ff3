"""The contract of a task that acts: a Task (contracts/task.py) that also owns an environment, in
which a trained model is scored by the return it earns acting (harness/closed_loop.py), beside its
accuracy on the task's labels. POPGym's games (tasks/popgym.py) are the built-in ones;
docs/bring-a-task.md ("A task that acts") writes a small one from scratch, and
`tmem-bench check --task` checks any task that declares an environment against this contract.
The task's own rollout of an episode is the closed loop's guess of what the model will see, so
that one forward pass scores a batch of episodes (harness/closed_loop.py says why that is exact).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..levels import Level


class Environment(Protocol):
    """A gymnasium-style episodic environment with discrete actions (the task's classes)."""

    max_episode_length: int  # steps; an episode ends (terminated or truncated) within it

    def reset(self, *, seed: int) -> tuple[Any, dict]:
        """(first observation, info), the episode fixed by `seed`."""

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        """(observation, reward, terminated, truncated, info)."""


@runtime_checkable
class EnvironmentTask(Protocol):
    """What a Task adds to act. Its batches are {"obs": (B, T, F) int64, "positions": (B, n) int64,
    "target": (B, n)}: one token per step, F integer fields per observation, and the steps scored;
    its adapter must also read a batch whose "positions" are every step, 0..max_episode_length,
    giving logits (B, max_episode_length + 1, n_classes): the closed loop acts on the arg-max at each."""

    def make_env(self, level: Level) -> Environment:
        """A fresh environment of the level (each episode of the closed loop gets its own)."""

    def closed_loop_seeds(self, level: Level) -> list[int]:
        """The fixed episode seeds the model is scored on, the same in every process: drawn from the
        task's `reserved_seed("closed_loop", level)`, apart from its training and evaluation seeds."""

    def encode(self, obs) -> tuple[int, ...]:
        """An observation as its F integer fields."""

    def rollout(self, level: Level, seed: int, env: Environment | None = None) -> dict[str, np.ndarray]:
        """One episode from `env.reset(seed=seed)` (the task's own environment where `env` is None) with the
        task's own policy acting: {"obs": (T, F) int64, ...}, T <= max_episode_length + 1, row t the
        encoded observation the agent acts on at step t."""


def acts(task) -> bool:
    """Whether a task declares an environment (its make_env and closed_loop_seeds): such a task is
    scored acting in it and checked against the whole of EnvironmentTask."""
    return callable(getattr(task, "make_env", None)) and callable(getattr(task, "closed_loop_seeds", None))
