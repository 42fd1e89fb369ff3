"""A task adapter and a backbone, joined into one trainable model."""
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

    def memory_disabled(self):
        """Context in which a gated backbone's memory path is switched off (gate forced to zero)."""
        if hasattr(self.backbone, "memory_disabled"):
            return self.backbone.memory_disabled()
        return contextlib.nullcontext()
