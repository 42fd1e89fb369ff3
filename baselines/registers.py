"""`registers`: learnable register tokens prepended to the sequence (Darcet et al., 2024).

The registers come before every token, so under causal attention each token can
use them as scratch space while they themselves see only each other: they cannot
carry later tokens' information back. Their outputs are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from tmem_bench.contracts.transformer import Transformer, TransformerConfig, attention_mask


@dataclass
class RegistersConfig(TransformerConfig):
    n_registers: int = 4


class RegistersTransformer(Transformer):
    config_class = RegistersConfig

    def __init__(self, config: RegistersConfig):
        registers = torch.randn(config.n_registers, config.d_model) * 0.02  # drawn before the blocks' weights
        super().__init__(config)
        self.registers = nn.Parameter(registers)

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
        return self.kv_cache_size(seq_len + self.config.n_registers, bytes_per_element)


registers = RegistersTransformer.build
