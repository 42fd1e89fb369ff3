"""`check --task`'s environment check: a task that declares an environment
(`contracts.environment.acts`) keeps the whole EnvironmentTask contract at a level, so that the
closed loop (harness/closed_loop.py) can score a model acting in it."""
from __future__ import annotations

import numpy as np
import torch

from ..contracts.environment import EnvironmentTask
from ..contracts.task import Task

WIDTH = 16  # d_model of the adapter built to read a whole episode


def environment_problem(task: Task, level: dict) -> str | None:
    """What breaks the contract at `level`, or None."""
    if not isinstance(task, EnvironmentTask):
        missing = [m for m in ("make_env", "closed_loop_seeds", "encode", "rollout") if not callable(getattr(task, m, None))]
        return f"it declares an environment but has no {', '.join(missing)}"
    env = task.make_env(level)
    length = getattr(env, "max_episode_length", None)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        return f"its environment's max_episode_length is {length!r}, expected an integer >= 1"
    seeds = task.closed_loop_seeds(level)
    if not seeds or not all(isinstance(s, int) for s in seeds) or task.closed_loop_seeds(level) != seeds:
        return f"closed_loop_seeds gives {seeds[:4]!r}..., expected the same non-empty list of ints on every call"
    first, again = (task.rollout(level, seeds[0], env=task.make_env(level))["obs"] for _ in range(2))
    if not (isinstance(first, np.ndarray) and first.dtype == np.int64 and first.ndim == 2):
        return f"rollout's obs is {type(first).__name__} {getattr(first, 'dtype', '')}, expected an int64 (T, F) array"
    if not 1 <= len(first) <= length + 1 or not np.array_equal(first, again):
        return f"rollout gives {len(first)} steps (at most {length + 1}), or other steps from the same seed"
    shown = task.encode(env.reset(seed=seeds[0])[0])
    if tuple(first[0]) != tuple(shown):
        return f"rollout's first observation {tuple(first[0])} is not the encoded reset observation {tuple(shown)}"
    # What the closed loop feeds the model: the whole episode, every step scored.
    seq = np.zeros((1, length + 1, first.shape[1]), dtype=np.int64)
    seq[0, :len(first)] = first
    batch = {"obs": torch.from_numpy(seq), "positions": torch.arange(length + 1)[None]}
    adapter = task.make_adapter(WIDTH)
    with torch.no_grad():
        logits = adapter.head(adapter(batch), batch)
    if tuple(logits.shape) != (1, length + 1, task.n_classes):
        return (f"the adapter reads a whole episode into logits {tuple(logits.shape)}, expected "
                f"{(1, length + 1, task.n_classes)} (one action per step)")
    return None
