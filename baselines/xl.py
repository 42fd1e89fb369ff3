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

from tmem_bench.contracts.transformer import Block, CausalSelfAttention, Transformer, TransformerConfig


@dataclass
class XLConfig(TransformerConfig):
    segment: int = 8


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


class XLAttention(CausalSelfAttention):
    def __init__(self, config: XLConfig):
        super().__init__(config)
        # per head, per distance 0..2*segment-1
        self.rel_bias = nn.Parameter(torch.zeros(config.n_heads, 2 * config.segment))

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


class XLBlock(Block):
    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        allowed, distance = mask
        # The cache is the block's normalised input with no gradient into x.
        x = x + self.attn(self.ln_1(x), self.ln_1(x.detach()), allowed, distance)
        return x + self.mlp(self.ln_2(x))


class TransformerXL(Transformer):
    config_class = XLConfig
    block_class = XLBlock

    def make_mixer(self, config: XLConfig) -> nn.Module:
        return XLAttention(config)

    def mask(self, seq_len, device, blocked):
        return xl_masks(seq_len, self.config.segment, device, blocked)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: keys and values of the cached segment plus the current one."""
        return self.kv_cache_size(min(seq_len, 2 * self.config.segment), bytes_per_element)


xl = TransformerXL.build
