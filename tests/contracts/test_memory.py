"""A memory beside attention (tmem_bench.contracts.memory): any Memory with the two-argument forward plugs
into MemoryTransformer, with its state threaded per layer or (the reference) from layer to layer."""
from __future__ import annotations

import pytest
import torch

from tmem_bench.contracts.memory import MemoryTransformer, MemoryTransformerConfig


class CountingMemory(torch.nn.Module):
    """A Memory with the two-argument forward of DESIGN.md: its state counts the tokens seen."""

    def __init__(self):
        super().__init__()
        self.starts = []

    def init_state(self, batch: int):
        return torch.zeros(batch)

    def forward(self, x, state):
        self.starts.append(float(state[0]))
        return torch.zeros_like(x), state + x.shape[1]


@pytest.mark.parametrize("threading", ["per_layer", "reference"])
def test_a_memory_without_output_final_state_plugs_in(threading):
    memory = CountingMemory()
    config = MemoryTransformerConfig(d_model=16, n_layers=3, n_heads=2, threading=threading)
    model = MemoryTransformer(config, memory)
    model(torch.randn(2, 5, 16))
    assert memory.starts == ([0.0, 5.0, 10.0] if threading == "reference" else [0.0, 0.0, 0.0])
    assert model.scan_kernel() is None  # a memory without a choice of kernel records none
