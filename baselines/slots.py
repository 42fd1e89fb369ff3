"""`slots`: a causal transformer with learnable global slots read and written by cross-attention.

In the reference, after each block the tokens read the slots and then the slots
attend to every token of the sequence at once; the next layer's tokens read those
slots, so position t sees tokens after t. Here the slots are a recurrent state
updated chunk by chunk, in the order a model would run at inference:

- entering chunk k the slots are Z_k, a function of chunks < k only;
- in every layer, after the block, the chunk's tokens read Z_k by cross-attention;
- then the slots attend to the chunk's tokens at that layer, layer after layer,
  so the update persists across layers as in the reference; the result is Z_{k+1}.

Tokens therefore never read slots that saw their own chunk, and self-attention runs
causally over a per-layer key/value cache of earlier chunks. A task's `blocked`
mask applies to the self-attention; the slot state is a memory and is never masked.
The last chunk's slot update is never read, so it is not computed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tmem_bench.registry import BACKBONES

from .transformer import Block, attention_mask


class CrossAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        h, hd = self.n_heads, D // self.n_heads
        q = self.q(x).view(B, S, h, hd).transpose(1, 2)  # (B, h, S, hd)
        k, v = self.kv(context).view(B, context.shape[1], 2, h, hd).permute(2, 0, 3, 1, 4)  # (B, h, M, hd)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, S, D)))


class SlotLayer(nn.Module):
    """What follows one transformer block: tokens read the slots, then the slots attend to the tokens."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.ln_read = nn.LayerNorm(d_model)
        self.read = CrossAttention(d_model, n_heads, dropout)
        self.ln_slots = nn.LayerNorm(d_model)
        self.ln_tokens = nn.LayerNorm(d_model)
        self.write = CrossAttention(d_model, n_heads, dropout)


def cached_block(block: Block, x: torch.Tensor, cache: list, mask: torch.Tensor) -> torch.Tensor:
    """`block` on a chunk x (B, c, d) whose keys extend the layer's cache of earlier chunks."""
    attn = block.attn
    B, c, D = x.shape
    h, hd = attn.n_heads, D // attn.n_heads
    q, k, v = attn.qkv(block.ln_1(x)).view(B, c, 3, h, hd).permute(2, 0, 3, 1, 4)  # (B, h, c, hd)
    cache.append((k, v))
    keys = torch.cat([kv[0] for kv in cache], dim=2)  # (B, h, end, hd)
    values = torch.cat([kv[1] for kv in cache], dim=2)
    y = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, dropout_p=attn.dropout if attn.training else 0.0
    )
    x = x + attn.resid_dropout(attn.proj(y.transpose(1, 2).reshape(B, c, D)))
    return x + block.mlp(block.ln_2(x))


@dataclass
class SlotsConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1
    mlp_ratio: float = 4.0
    n_slots: int = 8
    chunk: int = 8  # tokens per slot update; tokens read slots that saw earlier chunks only

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads", "n_slots", "chunk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class SlotsTransformer(nn.Module):
    def __init__(self, config: SlotsConfig):
        super().__init__()
        self.config = config
        self.slots = nn.Parameter(torch.randn(config.n_slots, config.d_model) * 0.02)
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, config.dropout, config.mlp_ratio)
            for _ in range(config.n_layers)
        )
        self.slot_layers = nn.ModuleList(
            SlotLayer(config.d_model, config.n_heads, config.dropout) for _ in range(config.n_layers)
        )
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        B, S, D = x.shape
        allowed = attention_mask(S, x.device, blocked)
        if allowed is None:
            allowed = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        caches = [[] for _ in self.blocks]
        z = self.slots.expand(B, -1, -1)  # (B, n_slots, d): Z_0
        outs = []
        for start in range(0, S, self.config.chunk):
            end = min(S, start + self.config.chunk)
            h = x[:, start:end]  # (B, c, d)
            z_read = z
            for block, slot, cache in zip(self.blocks, self.slot_layers, caches):
                h = cached_block(block, h, cache, allowed[start:end, :end])
                h = h + slot.read(slot.ln_read(h), z_read)
                if end < S:
                    z = z + slot.write(slot.ln_slots(z), slot.ln_tokens(h))
            outs.append(h)
        return self.ln_f(torch.cat(outs, dim=1))  # (B, S, d)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: the self-attention KV cache plus the fixed slot state."""
        c = self.config
        return (2 * c.n_layers * seq_len + c.n_slots) * c.d_model * bytes_per_element


@BACKBONES.register("slots")
def slots(d_model: int, n_layers: int, n_heads: int, **options) -> SlotsTransformer:
    return SlotsTransformer(SlotsConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options))
