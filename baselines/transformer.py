"""The pre-norm causal transformer every model in the suite is built from.

Backbones carry no positional embedding: causal attention orders the tokens,
and tasks that need positions add them in their adapters.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tmem_bench.registry import BACKBONES


def attention_mask(
    seq_len: int,
    device: torch.device,
    blocked: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor | None:
    """Boolean (S, S) mask, True where query i may attend to key j; None means plain causal.

    `blocked` (S, S), True on edges a task forbids, is removed on top of causality;
    a position may always attend to itself.
    """
    if blocked is None and window is None:
        return None
    i = torch.arange(seq_len, device=device)
    allowed = i[None, :] <= i[:, None]
    if window is not None:
        allowed &= i[:, None] - i[None, :] < window
    if blocked is not None:
        allowed &= ~blocked.to(device)
        allowed |= torch.eye(seq_len, dtype=torch.bool, device=device)
    return allowed


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, h, S, hd) each
        y = F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=mask,
            is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        y = y.transpose(1, 2).reshape(B, S, D)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, d_model: int, mlp_ratio: float, dropout: float):
        super().__init__()
        hidden = int(round(mlp_ratio * d_model))
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, mlp_ratio: float = 4.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio, dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


def require_positive(config, *names: str) -> None:
    """Configs reject non-positive sizes with the name of the bad field."""
    for name in names:
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)}")


@dataclass
class TransformerConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1
    mlp_ratio: float = 4.0
    window: int | None = None  # sliding-window attention when set

    def __post_init__(self):
        require_positive(self, "d_model", "n_layers", "n_heads")
        if self.window is not None and self.window <= 0:
            raise ValueError(f"window must be positive, got {self.window}")


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, config.dropout, config.mlp_ratio)
            for _ in range(config.n_layers)
        )
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        mask = attention_mask(x.shape[1], x.device, blocked, self.config.window)
        for block in self.blocks:
            x = block(x, mask)  # (B, S, d)
        return self.ln_f(x)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens at inference: the KV cache (the window for local attention)."""
        kept = seq_len if self.config.window is None else min(seq_len, self.config.window)
        return 2 * self.config.n_layers * kept * self.config.d_model * bytes_per_element


@BACKBONES.register("base")
def base(d_model: int, n_layers: int, n_heads: int, **options) -> Transformer:
    return Transformer(TransformerConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options))


@BACKBONES.register("local")
def local(d_model: int, n_layers: int, n_heads: int, window: int = 8, **options) -> Transformer:
    """Causal sliding-window attention: each token sees itself and the window - 1 tokens before it."""
    return Transformer(TransformerConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, window=window, **options))
