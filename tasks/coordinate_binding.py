"""Coordinate binding: bind values to 3D keys, then recall them from noisy queries.

W write tokens carry a key uniform in [-1, 1]^3 and a value in 0..31; Q query
tokens carry a written key plus Gaussian noise (clamped to the cube). The target
of a query is the value of the written key nearest to the noisy query, so the
nearest-key oracle is always right and the ceiling is 1.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from tmem_bench.contracts.task import Adapter, Batch, Level, Task
from tmem_bench.errors import check_float, check_int


class CoordinateBindingAdapter(Adapter):
    def __init__(self, d_model: int, n_values: int, n_queries: int, block_queries: bool):
        super().__init__()
        self.n_queries = n_queries
        self.block_queries = block_queries
        self.type_emb = nn.Embedding(2, d_model)  # 0 = write, 1 = query
        self.key_proj = nn.Linear(3, d_model)
        self.value_emb = nn.Embedding(n_values, d_model)
        self.head_proj = nn.Linear(d_model, n_values)

    def forward(self, batch: Batch) -> torch.Tensor:
        keys, values, queries = batch["keys"], batch["values"], batch["queries"]  # (B, W, 3), (B, W), (B, Q, 3)
        types = self.type_emb.weight
        writes = types[0] + self.key_proj(keys) + self.value_emb(values)  # (B, W, d)
        asks = types[1] + self.key_proj(queries)  # (B, Q, d)
        return torch.cat([writes, asks], dim=1)  # (B, W + Q, d)

    def blocked(self, batch: Batch) -> torch.Tensor | None:
        if not self.block_queries:
            return None
        W, Q = batch["keys"].shape[1], batch["queries"].shape[1]
        blocked = torch.zeros(W + Q, W + Q, dtype=torch.bool)
        blocked[W:, :W] = True  # queries reach the writes only through a memory
        return blocked

    def head(self, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.head_proj(h[:, -self.n_queries:])  # (B, Q, n_values)


class CoordinateBinding(Task):
    name = "coordinate_binding"
    axes = ("n_writes", "noise")
    levels = {"n_writes": (5, 10, 20, 50), "noise": (0.05,)}
    variants = {"standard": {}, "memory_forcing": {"block_queries": True}}
    memory_forcing = ("memory_forcing",)

    def __init__(self, n_queries: int = 4, n_values: int = 32, block_queries: bool = False):
        self.n_queries = check_int("n_queries", n_queries)
        self.n_classes = check_int("n_values", n_values, minimum=2)
        self.block_queries = bool(block_queries)

    def options(self) -> dict:
        return {"n_queries": self.n_queries, "n_values": self.n_classes, "block_queries": self.block_queries}

    def check_value(self, axis: str, value):
        if axis == "n_writes":
            return check_int(axis, value)
        return check_float(axis, value, maximum=2.0)

    def sample(self, level: Level, batch_size: int, generator: torch.Generator) -> Batch:
        W, Q, sigma = level["n_writes"], self.n_queries, level["noise"]
        keys = torch.rand(batch_size, W, 3, generator=generator) * 2 - 1
        values = torch.randint(0, self.n_classes, (batch_size, W), generator=generator)
        picked = torch.randint(0, W, (batch_size, Q), generator=generator)
        noise = torch.randn(batch_size, Q, 3, generator=generator) * sigma
        queries = (torch.gather(keys, 1, picked[..., None].expand(-1, -1, 3)) + noise).clamp(-1, 1)
        target = torch.gather(values, 1, nearest_key(keys, queries))
        return {"keys": keys, "values": values, "queries": queries, "target": target}

    def oracle(self, level: Level, batch: Batch) -> torch.Tensor:
        """(B, Q) values of the written keys nearest to the queries."""
        return torch.gather(batch["values"], 1, nearest_key(batch["keys"], batch["queries"]))

    def reach_positions(self, level: Level, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        W, Q = batch["keys"].shape[1], batch["queries"].shape[1]
        writes = torch.arange(W + Q) < W
        return writes, ~writes

    def make_adapter(self, d_model: int) -> Adapter:
        return CoordinateBindingAdapter(d_model, self.n_classes, self.n_queries, self.block_queries)


def nearest_key(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Index (B, Q) of the written key nearest to each query; the task's oracle."""
    # Explicit differences, not cdist: its matmul shortcut can flip near ties.
    return ((queries[:, :, None] - keys[:, None]) ** 2).sum(-1).argmin(dim=-1)
