"""Map building as a gymnasium environment, `tmem_bench/MapBuilding-v0` (registered by `import
tmem_bench`): apart from the task so that only what makes the environment imports gymnasium."""
from __future__ import annotations

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from .map_building import N_FEATURES, MapBuilding, tokens


class MapBuildingEnv(gymnasium.Env):
    """Map building as a gymnasium environment (`tmem_bench/MapBuilding-v0`).

    Episode: `reset` returns observation 0; each of the next `horizon` steps returns
    the next observation (reward 0, the action is ignored), the last of them being
    the query; the step after the query is the answer: reward 1.0 when the action
    equals the queried cell's occupancy, else 0.0, and the episode terminates
    (`info["answer"]` holds the right answer). An episode is `horizon + 1` steps.

    observation_space: Box(0, 1, shape=(7,), float32), the task's token features:
        observation step: 4 patch values (0 free, 1 occupied; row-major), r/8, c/8, 0
        query step:       0, 0, 0, 0, qr/8, qc/8, 1
    action_space: Discrete(2): 0 = free, 1 = occupied (only the answer step counts).

    Seeding: `reset(seed=s)` draws the episode from `torch.Generator().manual_seed(s)`
    exactly as `MapBuilding.sample(level, 1, generator)` does; later `reset()` calls
    continue that generator. Unseeded, the first episode seed comes from `np_random`.
    """

    metadata = {"render_modes": []}

    def __init__(self, horizon: int = 16, trajectory: str = "random", p_occupied: float = 0.5):
        self.task = MapBuilding(trajectory=trajectory, p_occupied=p_occupied)
        self.level = self.task.validate_level({"horizon": horizon})
        self.observation_space = spaces.Box(0.0, 1.0, shape=(N_FEATURES,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self._generator: torch.Generator | None = None
        self._tokens: np.ndarray | None = None
        self._answer = 0
        self._t: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._generator = torch.Generator().manual_seed(seed)
        elif self._generator is None:
            self._generator = torch.Generator().manual_seed(int(self.np_random.integers(2**62)))
        batch = self.task.sample(self.level, 1, self._generator)
        self._tokens = tokens(batch)[0].numpy()  # (T + 1, 7): the env asks one query
        self._answer = int(batch["target"][0, 0])
        self._t = 0
        return self._tokens[0].copy(), {}

    def step(self, action):
        if self._t is None:
            raise RuntimeError("call reset() before step() (the episode has ended or never started)")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space} (0 = free, 1 = occupied)")
        horizon = self.level["horizon"]
        if self._t < horizon:
            self._t += 1
            return self._tokens[self._t].copy(), 0.0, False, False, {}
        self._t = None
        reward = 1.0 if int(action) == self._answer else 0.0
        return self._tokens[horizon].copy(), reward, True, False, {"answer": self._answer}
