"""The pre-norm causal transformer every model in the suite is built from.

One config and one skeleton: a model derived from `Transformer` adds its own
config fields (a dataclass deriving from `TransformerConfig`) and its own token
mixer (`make_mixer`), and overrides `mask` when its mixer needs something other
than a boolean attention mask; state around the blocks (registers, slots, a
memory) is added by overriding `forward`. A model whose mixer honours
`config.window` (sliding-window attention) says so with `windowed = True`; a
recurrent mixer derives from `recurrent.RecurrentTransformer`, a memory beside
attention uses `memory.MemoryTransformer`. Every mixer has one signature:
`Mixer(config)`, `mixer(x (B, S, d), mask) -> (B, S, d)`. A model that carries a
recurrent state exposes it through one hook, `memory_state` (`tmem_bench.contracts.model`).

Backbones carry no positional embedding: causal attention orders the tokens,
and tasks that need positions add them in their adapters.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import check_int


@dataclass
class TransformerConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1
    mlp_ratio: float = 4.0
    window: int | None = None  # sliding-window attention when set

    def __post_init__(self):
        # Every integer field of this config and of the configs derived from it is a size.
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in (int, "int", "int | None") and value is not None:
                setattr(self, f.name, check_int(f.name, value))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


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
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

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
    def __init__(self, config: TransformerConfig):
        super().__init__()
        hidden = int(round(config.mlp_ratio * config.d_model))
        self.fc = nn.Linear(config.d_model, hidden)
        self.proj = nn.Linear(hidden, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm block: x + mixer(LN(x), mask), then x + mlp(LN(x))."""

    def __init__(self, config: TransformerConfig, mixer: nn.Module):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = mixer
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    config_class = TransformerConfig
    block_class = Block
    # Whether `config.window` means anything to this model's mixer. Off unless a model
    # opts in, so that a model whose mixer ignores the mask cannot take a window silently.
    windowed = False
    fixed_state = False  # True: state_size(S) is the same at every S (`tmem-bench check` holds it to that)

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.window is not None and not self.windowed:
            raise ValueError(f"{type(self).__name__} has no sliding window; drop the window option")
        self.config = config
        self.blocks = nn.ModuleList(self.block_class(config, self.make_mixer(config)) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)

    @classmethod
    def build(cls, d_model: int, n_layers: int, n_heads: int, **options):
        """The registered factory: the suite's common size arguments plus this model's config fields."""
        return cls(cls.config_class(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options))

    def make_mixer(self, config: TransformerConfig) -> nn.Module:
        return CausalSelfAttention(config)

    def mask(self, seq_len: int, device: torch.device, blocked: torch.Tensor | None):
        """What every block's mixer receives as `mask`."""
        return attention_mask(seq_len, device, blocked, self.config.window)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        mask = self.mask(x.shape[1], x.device, blocked)
        for block in self.blocks:
            x = block(x, mask)  # (B, S, d)
        return self.ln_f(x)

    def kv_cache_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes of the keys and values kept for `seq_len` tokens (the window for local attention)."""
        kept = seq_len if self.config.window is None else min(seq_len, self.config.window)
        return 2 * self.config.n_layers * kept * self.config.d_model * bytes_per_element

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens at inference."""
        return self.kv_cache_size(seq_len, bytes_per_element)
