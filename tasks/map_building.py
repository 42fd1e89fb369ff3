"""Map building: remember a hidden occupancy grid seen through a small window.

A hidden 8x8 grid has each cell occupied with probability `p_occupied` (0.5: then
neither answer is favoured and chance is exactly 50%). For T steps (the `horizon`)
the model sees a 2x2 patch of the grid at a window position; then `n_queries` (1,
as in the paper) query tokens each name a cell, and each target is its occupancy.

Tokens have 7 features:
  observation: the 4 patch values (row-major: (r,c), (r,c+1), (r+1,c), (r+1,c+1)),
               r/8, c/8, 0      with the window's top-left cell (r, c), r, c in 0..6
  query:       0, 0, 0, 0, qr/8, qc/8, 1      with the queried cell (qr, qc) in 0..7

Encodings (`encoding`), how the adapter turns an episode into tokens:
  "scalar"   T + Q tokens, one Linear of the 7 features above (the paper's): a
             position is two numbers, which attention can match to the queried cell
             only after learning a bump function of their difference, and little
             is learned at small budgets.
  "cells"    4T + Q tokens, one per observed cell: a learned embedding of its cell
             index (shared with the query tokens, which embed the queried cell) plus
             an embedding of its value and of the token type; attention can match a
             query to the cells with its index directly.

Positions (`positions`, P): 0 (the default) adds none, so a token's place in the
sequence is known only from causal attention's order; P > 0 adds a learned absolute
position embedding (P of them, initialised at zero) to the token at each place, as the
paper's reference does (it sizes the table for its longest horizon plus the query: 65).
A level whose sequence is longer than P is refused.

Window trajectories: "random" places every window uniformly at random (the
paper's setting); "walk" starts at a random position and moves one cell up, down,
left or right each step, turning back at the edges.

A query cell that no window covered can only be guessed, so the ceiling is
frac_seen + frac_unseen * max(p, 1 - p), the expected accuracy of a reader that
remembers every observation (computed exactly from each evaluation set's windows
and queries).

`block_queries=True` (memory forcing): the query may not attend to observation
tokens, so the map reaches it only through a memory the backbone carries.

The same episodes are offered as a gymnasium environment, `tmem_bench/MapBuilding-v0`
(MapBuildingEnv below); an episode drawn with `reset(seed=s)` equals the batch of one
that `MapBuilding.sample` draws from `torch.Generator().manual_seed(s)`.
"""
from __future__ import annotations

import gymnasium
import numpy as np
import torch
import torch.nn as nn
from gymnasium import spaces

from tmem_bench.contracts.task import Adapter, Batch, Level, Task
from tmem_bench.errors import UsageError, check_float, check_int

GRID = 8
WINDOW = 2
N_FEATURES = 7
TRAJECTORIES = ("random", "walk")
ENCODINGS = ("scalar", "cells")
# Offsets of the patch cells inside the window, in the order of the token features.
_PATCH_ROWS = torch.tensor([0, 0, 1, 1])
_PATCH_COLS = torch.tensor([0, 1, 0, 1])
_MOVES = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])


def tokens(batch: Batch) -> torch.Tensor:
    """The (B, T + Q, 7) token features of a batch: T observations, then the Q queries."""
    patches, windows, query = batch["patches"], batch["windows"], batch["query"]  # (B, T, 4), (B, T, 2), (B, Q, 2)
    B, T, _ = patches.shape
    Q = query.shape[1]
    obs = torch.cat([patches, windows.float() / GRID, patches.new_zeros(B, T, 1)], dim=-1)  # (B, T, 7)
    ask = torch.cat([patches.new_zeros(B, Q, 4), query.float() / GRID, patches.new_ones(B, Q, 1)], dim=-1)  # (B, Q, 7)
    return torch.cat([obs, ask], dim=1)


def observed_cells(windows: torch.Tensor) -> torch.Tensor:
    """(B, T, 4) cell indices r * 8 + c covered by each window, in the patch order."""
    return (windows[..., :1] + _PATCH_ROWS) * GRID + windows[..., 1:] + _PATCH_COLS


def query_seen(batch: Batch) -> torch.Tensor:
    """(B, Q) bool: whether any window covered each queried cell."""
    d = batch["query"][:, :, None] - batch["windows"][:, None]  # (B, Q, T, 2)
    return ((d >= 0) & (d < WINDOW)).all(-1).any(-1)


class MapBuildingAdapter(Adapter):
    def __init__(self, d_model: int, block_queries: bool, encoding: str = "scalar", positions: int = 0):
        super().__init__()
        self.block_queries = block_queries
        self.encoding = encoding
        # Zeros, as the paper's reference starts its table; absent at 0 so that a model without
        # positions keeps the parameters (and state dicts) it always had.
        self.pos = nn.Parameter(torch.zeros(positions, d_model)) if positions else None
        if encoding == "scalar":
            self.proj = nn.Linear(N_FEATURES, d_model)
        else:
            self.cell_emb = nn.Embedding(GRID * GRID, d_model)
            self.value_emb = nn.Embedding(2, d_model)
            self.type_emb = nn.Embedding(2, d_model)  # 0 = observation, 1 = query
        self.head_proj = nn.Linear(d_model, 2)

    def forward(self, batch: Batch) -> torch.Tensor:
        x = self._tokens(batch)  # (B, S, d)
        return x if self.pos is None else x + self.pos[:x.shape[1]]

    def _tokens(self, batch: Batch) -> torch.Tensor:
        if self.encoding == "scalar":
            return self.proj(tokens(batch))  # (B, T + Q, d)
        patches, windows, query = batch["patches"], batch["windows"], batch["query"]  # (B, T, 4), (B, T, 2), (B, Q, 2)
        types = self.type_emb.weight
        obs = types[0] + self.cell_emb(observed_cells(windows).flatten(1)) + self.value_emb(patches.flatten(1).long())
        ask = types[1] + self.cell_emb(query[..., 0] * GRID + query[..., 1])  # (B, Q, d)
        return torch.cat([obs, ask], dim=1)  # (B, 4T + Q, d)

    def blocked(self, batch: Batch) -> torch.Tensor | None:
        if not self.block_queries:
            return None
        Q = batch["query"].shape[1]
        S = Q + batch["windows"].shape[1] * (1 if self.encoding == "scalar" else WINDOW * WINDOW)
        blocked = torch.zeros(S, S, dtype=torch.bool)
        blocked[S - Q:, :S - Q] = True  # the queries reach the observations only through a memory
        return blocked

    def head(self, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.head_proj(h[:, -batch["query"].shape[1]:])  # (B, Q, 2)


class MapBuilding(Task):
    name = "map_building"
    axes = ("horizon",)
    n_classes = 2
    version = 2  # queries are (B, Q, 2) since n_queries
    levels = {"horizon": (4, 8, 16)}
    variants = {"standard": {}, "memory_forcing": {"block_queries": True},
                "cells": {"encoding": "cells", "n_queries": 8},
                "cells_memory_forcing": {"encoding": "cells", "n_queries": 8, "block_queries": True}}
    memory_forcing = ("memory_forcing", "cells_memory_forcing")

    def __init__(self, trajectory: str = "random", p_occupied: float = 0.5, block_queries: bool = False,
                 encoding: str = "scalar", n_queries: int = 1, positions: int = 0):
        if trajectory not in TRAJECTORIES:
            raise UsageError(f"trajectory {trajectory!r} is not one of {', '.join(TRAJECTORIES)}")
        if encoding not in ENCODINGS:
            raise UsageError(f"encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
        self.trajectory = trajectory
        self.p_occupied = check_float("p_occupied", p_occupied, maximum=1.0)
        self.block_queries = bool(block_queries)
        self.encoding = encoding
        self.n_queries = check_int("n_queries", n_queries)
        self.positions = check_int("positions", positions, minimum=0)

    def options(self) -> dict:
        options = {"trajectory": self.trajectory, "p_occupied": self.p_occupied, "block_queries": self.block_queries,
                   "encoding": self.encoding, "n_queries": self.n_queries}
        if self.positions:  # recorded only where set, so that cells without positions keep their ids
            options["positions"] = self.positions
        return options

    def seq_len(self, horizon: int) -> int:
        """Tokens of an episode: its observations' (one per view, or one per observed cell), then the queries."""
        return horizon * (1 if self.encoding == "scalar" else WINDOW * WINDOW) + self.n_queries

    def check_value(self, axis: str, value):
        value = check_int(axis, value)
        if self.positions and self.seq_len(value) > self.positions:
            raise UsageError(f"horizon {value} makes {self.seq_len(value)} tokens, more than positions "
                             f"({self.positions}); raise positions or lower the horizon")
        return value

    def _windows(self, batch_size: int, horizon: int, generator: torch.Generator) -> torch.Tensor:
        n = GRID - WINDOW + 1
        if self.trajectory == "random":
            return torch.randint(0, n, (batch_size, horizon, 2), generator=generator)
        start = torch.randint(0, n, (batch_size, 2), generator=generator)
        moves = _MOVES[torch.randint(0, 4, (batch_size, horizon - 1), generator=generator)]  # (B, T-1, 2)
        windows = [start]
        for t in range(horizon - 1):  # sequential in time only; each step is vectorised over the batch
            step = windows[-1] + moves[:, t]
            outside = ((step < 0) | (step >= n)).any(-1, keepdim=True)
            windows.append(torch.where(outside, windows[-1] - moves[:, t], step))
        return torch.stack(windows, dim=1)  # (B, T, 2)

    def sample(self, level: Level, batch_size: int, generator: torch.Generator) -> Batch:
        horizon = level["horizon"]
        grid = torch.rand(batch_size, GRID, GRID, generator=generator) < self.p_occupied  # (B, 8, 8)
        windows = self._windows(batch_size, horizon, generator)  # (B, T, 2)
        query = torch.randint(0, GRID, (batch_size, self.n_queries, 2), generator=generator)  # (B, Q, 2)
        flat = grid.flatten(1)  # (B, 64)
        patches = flat.gather(1, observed_cells(windows).flatten(1)).view(batch_size, horizon, 4).float()  # (B, T, 4)
        target = flat.gather(1, query[..., 0] * GRID + query[..., 1]).long()  # (B, Q)
        return {"patches": patches, "windows": windows, "query": query, "target": target}

    def reach_positions(self, level: Level, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        Q = batch["query"].shape[1]
        S = Q + batch["windows"].shape[1] * (1 if self.encoding == "scalar" else WINDOW * WINDOW)
        queries = torch.arange(S) >= S - Q
        return ~queries, queries

    def make_adapter(self, d_model: int) -> Adapter:
        return MapBuildingAdapter(d_model, self.block_queries, self.encoding, self.positions)

    def chance(self, level: Level) -> float:
        return max(self.p_occupied, 1 - self.p_occupied)

    def ceiling(self, level: Level, batch: Batch) -> float:
        seen = query_seen(batch).double()
        return float((seen + (1 - seen) * self.chance(level)).mean())

    def oracle(self, level: Level, batch: Batch) -> torch.Tensor:
        """(B, Q) answers of a reader that remembers every observation token and
        guesses the likelier value for cells it never saw. Reads only the tokens."""
        Q = batch["query"].shape[1]
        x = tokens(batch)  # (B, T + Q, 7)
        obs, ask = x[:, :-Q], x[:, -Q:]
        B = x.shape[0]
        cells = observed_cells((obs[..., 4:6] * GRID).round().long()).flatten(1)  # (B, T * 4)
        known = torch.zeros(B, GRID * GRID, dtype=torch.bool).scatter_(1, cells, True)
        value = torch.zeros(B, GRID * GRID).scatter_(1, cells, obs[..., :4].flatten(1))
        q = ((ask[..., 4] * GRID).round() * GRID + (ask[..., 5] * GRID).round()).long()  # (B, Q)
        guess = torch.full((B, Q), int(self.p_occupied > 0.5))
        return torch.where(known.gather(1, q), value.gather(1, q).long(), guess)


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
