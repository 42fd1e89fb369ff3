"""Recurrent token mixers: the base model they share and the pieces they have in common.

A recurrent mixer (linear attention, the gated delta rule, a state space layer, a
slot memory) replaces attention with a state carried from token to token. Such a
model derives from `RecurrentTransformer` and gives its mixer (`make_mixer`) and
its state's bytes (`state_size`); the rest is said here once:

- its state does not grow with the sequence (`fixed_state`, which `tmem-bench
  check` holds it to);
- it has no sliding window (`Transformer.windowed` is already False);
- its mixer receives no mask: the state is a memory, not a softmax, so a task's
  `blocked` attention edges have nothing to remove, and under the memory-forcing
  variants information reaches the queries only through the state, as intended;
- the state hook (`memory_state`, `tmem_bench.contracts.model`) for a mixer with a
  `final_state(x) -> dict[str, Tensor]`, its state after the last token of its input.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .transformer import Transformer


class RecurrentTransformer(Transformer):
    fixed_state = True

    def mask(self, seq_len, device, blocked):
        return None

    def memory_state(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> dict[str, torch.Tensor] | None:
        """Every layer's mixer state after the last token, named "layer<i>.<name>"; None where
        the mixer has no `final_state`."""
        if not all(hasattr(block.attn, "final_state") for block in self.blocks):
            return None
        states = {}
        for layer, block in enumerate(self.blocks):
            states.update({f"layer{layer}.{k}": v for k, v in block.attn.final_state(block.ln_1(x)).items()})
            x = block(x, None)
        return states


class ShortConv(nn.Module):
    """Depthwise causal convolution over time: output t of x (B, S, c) mixes inputs t-kernel+1 .. t.

    Weights as nn.Conv1d lays them out (the last tap on the current token), computed as a
    few shifted products: the generic depthwise kernel is several times slower on CPU.
    """

    def __init__(self, channels: int, kernel: int, bias: bool):
        super().__init__()
        bound = kernel ** -0.5  # nn.Conv1d's default init for a depthwise kernel
        self.weight = nn.Parameter(torch.empty(channels, kernel).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(channels).uniform_(-bound, bound)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        S, kernel = x.shape[1], self.weight.shape[1]
        y = x * self.weight[:, -1]
        for lag in range(1, min(kernel, S)):
            y = y + F.pad(x[:, : S - lag] * self.weight[:, -1 - lag], (0, 0, lag, 0))
        return y if self.bias is None else y + self.bias


def balanced_chunk(seq_len: int, chunk: int) -> int:
    """The smallest chunk that covers `seq_len` in as many chunks of at most `chunk` tokens: least padding."""
    n = -(-seq_len // chunk)
    return -(-seq_len // n)


def inverse_softplus_dt(n: int, dt_min: float = 1e-3, dt_max: float = 0.1) -> torch.Tensor:
    """Biases whose softplus is a step size drawn log-uniformly in [dt_min, dt_max] (Mamba's init)."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return dt + torch.log(-torch.expm1(-dt))
