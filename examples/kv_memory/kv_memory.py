"""`kv_memory`: a key-value slot memory in place of attention, a worked tmem-bench plug-in.

Every layer keeps N value slots, each addressed by a learned key. Token t first
writes: it addresses the slots by content (softmax of its write key against the
slot keys) and moves the addressed slots towards its value by a learned gate in
[0, 1]. It then reads: its query addresses the slots the same way and takes the
weighted sum of their values. The memory is updated token by token, so the output
at t depends only on tokens <= t (causal), and it is the only path between tokens:
a task's `blocked` attention edges have nothing to cut. The state carried at
inference is the slot values, N x d per layer, whatever the sequence length.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from tmem_bench.contracts.recurrent import RecurrentTransformer
from tmem_bench.contracts.transformer import TransformerConfig


@dataclass
class KVMemoryConfig(TransformerConfig):
    n_slots: int = 16


class KVMemory(nn.Module):
    """The token mixer: mixer(x (B, S, d), mask) -> (B, S, d), the suite's one mixer signature."""

    def __init__(self, config: KVMemoryConfig):
        super().__init__()
        d = config.d_model
        self.slot_keys = nn.Parameter(torch.randn(config.n_slots, d) / math.sqrt(d))
        self.qkv = nn.Linear(d, 3 * d)
        self.gate = nn.Linear(d, 1)
        self.proj = nn.Linear(d, d)
        self.dropout = nn.Dropout(config.dropout)
        self.scale = 1.0 / math.sqrt(d)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        B, S, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, S, d) each
        write = torch.softmax(k @ self.slot_keys.T * self.scale, dim=-1)  # (B, S, N)
        read = torch.softmax(q @ self.slot_keys.T * self.scale, dim=-1)  # (B, S, N)
        write = write * torch.sigmoid(self.gate(x))  # gated: a token may leave the memory untouched
        values = x.new_zeros(B, self.slot_keys.shape[0], d)  # (B, N, d): the state
        outs = []
        for t in range(S):
            w = write[:, t, :, None]  # (B, N, 1)
            values = values + w * (v[:, t, None, :] - values)
            outs.append((read[:, t, None, :] @ values).squeeze(1))  # (B, d)
        return self.dropout(self.proj(torch.stack(outs, dim=1)))


class KVMemoryTransformer(RecurrentTransformer):
    """A recurrent mixer: a fixed state (the conformance check holds state_size to it), no
    window, and no mask, since blocked attention edges never cut a memory."""

    config_class = KVMemoryConfig

    def make_mixer(self, config: KVMemoryConfig) -> nn.Module:
        return KVMemory(config)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: every layer's slot values."""
        c = self.config
        return c.n_layers * c.n_slots * c.d_model * bytes_per_element


kv_memory = KVMemoryTransformer.build
