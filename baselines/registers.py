"""`registers`: learnable register tokens prepended to the sequence (Darcet et al., 2024).

The registers come before every token, so under causal attention each token can
use them as scratch space while they themselves see only each other: they cannot
carry later tokens' information back. Their outputs are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from tmem_bench.registry import BACKBONES

from .transformer import Block, attention_mask, require_positive


@dataclass
class RegistersConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1
    mlp_ratio: float = 4.0
    n_registers: int = 4

    def __post_init__(self):
        require_positive(self, "d_model", "n_layers", "n_heads", "n_registers")


class RegistersTransformer(nn.Module):
    def __init__(self, config: RegistersConfig):
        super().__init__()
        self.config = config
        self.registers = nn.Parameter(torch.randn(config.n_registers, config.d_model) * 0.02)
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, config.dropout, config.mlp_ratio)
            for _ in range(config.n_layers)
        )
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        B, S, D = x.shape
        R = self.config.n_registers
        if blocked is not None:
            # The task's mask speaks about its own tokens; edges to and from registers stay open.
            full = torch.zeros(R + S, R + S, dtype=torch.bool, device=x.device)
            full[R:, R:] = blocked.to(x.device)
            blocked = full
        mask = attention_mask(R + S, x.device, blocked)
        x = torch.cat([self.registers.expand(B, R, D), x], dim=1)  # (B, R + S, d)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x[:, R:])  # (B, S, d)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: the KV cache, registers included."""
        c = self.config
        return 2 * c.n_layers * (seq_len + c.n_registers) * c.d_model * bytes_per_element


@BACKBONES.register("registers")
def registers(d_model: int, n_layers: int, n_heads: int, **options) -> RegistersTransformer:
    return RegistersTransformer(RegistersConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options))
