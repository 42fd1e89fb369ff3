"""`recall`: remember a list of symbols, then name the one at a queried place; a worked tmem-bench task plug-in.

N symbols (`n_items`, each in 0..15) come one token each, then one query token names a place k
in 0..N-1; the target is the symbol at place k. The oracle reads it off, so the ceiling is 1;
every symbol is equally likely, so chance is 1/16. In the variant `memory_forcing`
(`block_query = true`) the query may not attend to the symbols: attention alone is at chance by
construction, and only a state the backbone carries can bring the symbol to the query.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from tmem_bench.contracts.task import Adapter, Batch, Level, Task
from tmem_bench.errors import UsageError, check_int

N_SYMBOLS = 16
MAX_ITEMS = 64  # places the adapter has embeddings for


class RecallAdapter(Adapter):
    def __init__(self, d_model: int, block_query: bool):
        super().__init__()
        self.block_query = block_query
        self.symbol = nn.Embedding(N_SYMBOLS, d_model)
        self.place = nn.Embedding(MAX_ITEMS, d_model)  # shared: a query matches the item at its place
        self.query = nn.Parameter(torch.randn(d_model) * 0.02)
        self.head_proj = nn.Linear(d_model, N_SYMBOLS)

    def forward(self, batch: Batch) -> torch.Tensor:
        symbols = batch["symbols"]  # (B, N)
        items = self.symbol(symbols) + self.place.weight[: symbols.shape[1]]
        return torch.cat([items, self.query + self.place(batch["place"])], dim=1)  # (B, N + 1, d)

    def blocked(self, batch: Batch) -> torch.Tensor | None:
        if not self.block_query:
            return None
        n = batch["symbols"].shape[1]
        blocked = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        blocked[n, :n] = True  # the query reaches the symbols only through a memory
        return blocked

    def head(self, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.head_proj(h[:, -1:])  # (B, 1, 16)


class Recall(Task):
    name = "recall"
    axes = ("n_items",)
    n_classes = N_SYMBOLS
    levels = {"n_items": (4, 8, 16)}
    variants = {"standard": {}, "memory_forcing": {"block_query": True}}
    memory_forcing = ("memory_forcing",)

    def __init__(self, block_query: bool = False):
        self.block_query = bool(block_query)

    def options(self) -> dict:
        return {"block_query": self.block_query}

    def check_value(self, axis: str, value):
        value = check_int(axis, value)
        if value > MAX_ITEMS:
            raise UsageError(f"n_items must be at most {MAX_ITEMS}, got {value}")
        return value

    def sample(self, level: Level, batch_size: int, generator: torch.Generator) -> Batch:
        symbols = torch.randint(0, N_SYMBOLS, (batch_size, level["n_items"]), generator=generator)
        place = torch.randint(0, level["n_items"], (batch_size, 1), generator=generator)
        return {"symbols": symbols, "place": place, "target": symbols.gather(1, place)}

    def oracle(self, level: Level, batch: Batch) -> torch.Tensor:
        return batch["symbols"].gather(1, batch["place"])  # (B, 1)

    def reach_positions(self, level: Level, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        n = batch["symbols"].shape[1]
        symbols = torch.arange(n + 1) < n
        return symbols, ~symbols  # the evidence, and the query whose output the head reads

    def make_adapter(self, d_model: int) -> Adapter:
        return RecallAdapter(d_model, self.block_query)
