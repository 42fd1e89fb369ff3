"""A task adapter and a backbone, joined into one trainable model.

A backbone that carries a recurrent state may expose it through one hook, which the state
probe (`tmem_bench.diagnostics.state_probe`) reads:

    backbone.memory_state(x (B, S, d), blocked=None) -> dict[str, Tensor]

the state the backbone holds after the last token of `x`, as named tensors with the batch
first (B, ...), computed by the same weights as `forward` and changing nothing it computes.
The names are the backbone's ("layer0.S", "h", ...); an empty dict, None or no such method
means there is no state to probe (attention alone: its cache grows with the sequence).
`memory.MemoryTransformer` gives it to every Memory whose state is tensors, and
`recurrent.RecurrentTransformer` to every recurrent mixer with a `final_state(x)`.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from .task import Adapter, Batch


class TaskModel(nn.Module):
    def __init__(self, adapter: Adapter, backbone: nn.Module):
        super().__init__()
        self.adapter = adapter
        self.backbone = backbone

    def forward(self, batch: Batch) -> torch.Tensor:  # (B, n_scored, n_classes)
        x = self.adapter(batch)  # (B, S, d)
        h = self.backbone(x, blocked=self.adapter.blocked(batch))
        return self.adapter.head(h, batch)

    @property
    def gated(self) -> bool:
        return hasattr(self.backbone, "gate_values")

    def gate_values(self) -> dict[str, float] | None:
        return self.backbone.gate_values() if self.gated else None

    def memory_state(self, batch: Batch, length: int | None = None) -> dict[str, torch.Tensor] | None:
        """The backbone's state after the first `length` tokens of `batch` (all without), through
        its `memory_state` hook; None where it has no state to probe."""
        hook = getattr(self.backbone, "memory_state", None)
        if hook is None:
            return None
        x, blocked = self.adapter(batch), self.adapter.blocked(batch)
        if length is not None:
            x = x[:, :length]
            blocked = None if blocked is None else blocked[:length, :length]
        return hook(x, blocked=blocked) or None

    def memory_disabled(self):
        """Context in which a gated backbone's memory path is switched off (gate forced to zero)."""
        if hasattr(self.backbone, "memory_disabled"):
            return self.backbone.memory_disabled()
        return contextlib.nullcontext()
