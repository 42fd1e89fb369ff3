"""`xl`: Transformer-XL-style segment recurrence (Dai et al., 2019).

The sequence is cut into segments of `segment` tokens. In every layer a segment
attends causally to itself and to the cached hidden states of the previous segment
(the layer's input there), with a learned per-head bias for each relative distance.
No gradient flows into the cache: its keys and values are computed from a detached
copy of the hidden states, so only the projections that read it learn from it.
Stacking L layers lets information travel L segments back, as in the original.

All segments are computed in one pass: the cache of segment k at layer l is
segment k-1's input to layer l, which the same pass already holds. Keys are
[cache copy; live copy] with a mask that sends each query to the previous segment
in the first half and to its own causal prefix in the second.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tmem_bench.registry import BACKBONES

from .transformer import MLP, require_positive


def xl_masks(seq_len: int, segment: int, device: torch.device, blocked: torch.Tensor | None):
    """Boolean (S, 2S) mask of allowed (query, [cache; live] key) edges and the (S, S) relative distance."""
    i = torch.arange(seq_len, device=device)
    seg = i // segment
    cache = seg[None, :] == seg[:, None] - 1  # key in the previous segment
    live = (seg[None, :] == seg[:, None]) & (i[None, :] <= i[:, None])
    if blocked is not None:
        allowed = ~blocked.to(device) | torch.eye(seq_len, dtype=torch.bool, device=device)
        cache, live = cache & allowed, live & allowed
    distance = (i[:, None] - i[None, :]).clamp(0, 2 * segment - 1)
    return torch.cat([cache, live], dim=1), distance


class XLAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float, segment: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.rel_bias = nn.Parameter(torch.zeros(n_heads, 2 * segment))  # per head, per distance 0..2*segment-1
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: torch.Tensor, allowed: torch.Tensor, distance: torch.Tensor):
        B, S, D = x.shape
        h, hd = self.n_heads, D // self.n_heads
        q, k, v = self.qkv(x).view(B, S, 3, h, hd).permute(2, 0, 3, 1, 4)  # (B, h, S, hd)
        kv_cache = F.linear(cache, self.qkv.weight[D:], self.qkv.bias[D:])
        k_c, v_c = kv_cache.view(B, S, 2, h, hd).permute(2, 0, 3, 1, 4)
        bias = self.rel_bias[:, distance]  # (h, S, S)
        bias = torch.cat([bias, bias], dim=-1).masked_fill(~allowed, float("-inf"))  # (h, S, 2S)
        y = F.scaled_dot_product_attention(
            q, torch.cat([k_c, k], dim=2), torch.cat([v_c, v], dim=2),
            attn_mask=bias[None],
            dropout_p=self.dropout if self.training else 0.0,
        )
        y = y.transpose(1, 2).reshape(B, S, D)
        return self.resid_dropout(self.proj(y))


class XLBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float, mlp_ratio: float, segment: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = XLAttention(d_model, n_heads, dropout, segment)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio, dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), self.ln_1(x.detach()), allowed, distance)
        return x + self.mlp(self.ln_2(x))


@dataclass
class XLConfig:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.1
    mlp_ratio: float = 4.0
    segment: int = 8

    def __post_init__(self):
        require_positive(self, "d_model", "n_layers", "n_heads", "segment")


class TransformerXL(nn.Module):
    def __init__(self, config: XLConfig):
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(
            XLBlock(config.d_model, config.n_heads, config.dropout, config.mlp_ratio, config.segment)
            for _ in range(config.n_layers)
        )
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        allowed, distance = xl_masks(x.shape[1], self.config.segment, x.device, blocked)
        for block in self.blocks:
            x = block(x, allowed, distance)  # (B, S, d)
        return self.ln_f(x)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: keys and values of the cached segment plus the current one."""
        c = self.config
        return 2 * c.n_layers * min(seq_len, 2 * c.segment) * c.d_model * bytes_per_element


@BACKBONES.register("xl")
def xl(d_model: int, n_layers: int, n_heads: int, **options) -> TransformerXL:
    return TransformerXL(XLConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **options))
