"""No-harm control: a counting sequence any model predicts perfectly.

Sequences of 32 tokens over a vocabulary of 16 with s_t = s_{t-1} + 1 mod 16 from
a uniformly random start; next-token prediction at every position but the last
(31 scored positions). Every model should reach 100%; the task shows that a memory
does no harm and, for gated models, where the gate goes when memory is not needed
(the harness records gate values for every gated model). No sweep axis.

The next token is a function of the current token alone, so the adapter is a token
embedding without positions by default, and the ceiling is 1. `positions = P` (at least
`seq_len`) adds a learned absolute position embedding, initialised at zero, as the
paper's reference does (P = 32, its sequence length).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from tmem_bench.contracts.task import Adapter, Batch, Level, Task
from tmem_bench.errors import UsageError, check_int


class NoHarmAdapter(Adapter):
    def __init__(self, d_model: int, vocab: int, positions: int = 0):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.head_proj = nn.Linear(d_model, vocab)
        # Absent at 0, so that a model without positions keeps its parameters as they were.
        self.pos = nn.Parameter(torch.zeros(positions, d_model)) if positions else None

    def forward(self, batch: Batch) -> torch.Tensor:
        x = self.emb(batch["tokens"])  # (B, S, d)
        return x if self.pos is None else x + self.pos[:x.shape[1]]

    def head(self, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.head_proj(h[:, :-1])  # (B, S - 1, vocab)


class NoHarm(Task):
    name = "no_harm"
    axes = ()

    def __init__(self, seq_len: int = 32, vocab: int = 16, positions: int = 0):
        self.seq_len = check_int("seq_len", seq_len, minimum=2)
        self.n_classes = check_int("vocab", vocab, minimum=2)
        self.positions = check_int("positions", positions, minimum=0)
        if 0 < self.positions < self.seq_len:
            raise UsageError(f"positions ({self.positions}) must be 0 or at least seq_len ({self.seq_len})")

    def options(self) -> dict:
        options = {"seq_len": self.seq_len, "vocab": self.n_classes}
        if self.positions:  # recorded only where set, so that cells without positions keep their ids
            options["positions"] = self.positions
        return options

    def sample(self, level: Level, batch_size: int, generator: torch.Generator) -> Batch:
        start = torch.randint(0, self.n_classes, (batch_size, 1), generator=generator)
        tokens = (start + torch.arange(self.seq_len)) % self.n_classes  # (B, S)
        return {"tokens": tokens, "target": tokens[:, 1:]}

    def make_adapter(self, d_model: int) -> Adapter:
        return NoHarmAdapter(d_model, self.n_classes, self.positions)

    def oracle(self, level: Level, batch: Batch) -> torch.Tensor:
        return (batch["tokens"][:, :-1] + 1) % self.n_classes  # (B, S - 1)
