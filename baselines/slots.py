"""`slots`: a causal transformer with learnable global slots read and written by cross-attention.

In the reference, after each block the tokens read the slots and then the slots
attend to every token of the sequence at once; the next layer's tokens read those
slots, so position t sees tokens after t. Two causal versions, chosen by `update`:

- "prefix" (default): every position t has its own version of the slots. Position
  t reads the version that attended to tokens <= t of the previous layer, and that
  version attends to tokens <= t of this layer to give the next layer's. This is
  the reference restricted to each prefix, computed in parallel (one masked
  cross-attention per layer with S * n_slots queries), and causal per token. The
  slots still compress the prefix into n_slots vectors, but at inference a version
  must re-attend to the prefix, so the state grows with the sequence.
- "recurrent": a fixed-size slot state updated chunk by chunk in the order a model
  runs at inference. Entering chunk k the slots are Z_k (a function of chunks < k);
  in every layer the chunk's tokens read Z_k after the block, then the slots attend
  to the chunk's tokens, layer after layer, giving Z_{k+1}. Self-attention runs over
  a per-layer key/value cache of earlier chunks. Tokens never read slots that saw
  their own chunk, so writes in the same chunk as a query are invisible to it
  through the slots; `chunk` 1 avoids that at the price of S sequential steps.

A task's `blocked` mask applies to the self-attention; the slots are a memory and
are never masked. Slot updates that nothing reads (after the last layer, after the
last chunk) are not computed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tmem_bench.contracts.transformer import Block, Transformer, TransformerConfig, attention_mask

UPDATES = ("prefix", "recurrent")


@dataclass
class SlotsConfig(TransformerConfig):
    n_slots: int = 8
    update: str = "prefix"  # or "recurrent" (see the module docstring)
    chunk: int = 8  # "recurrent" only: tokens per slot update

    def __post_init__(self):
        super().__post_init__()
        if self.update not in UPDATES:
            raise ValueError(f"update must be one of {', '.join(UPDATES)}, got {self.update!r}")


class CrossAttention(nn.Module):
    """Queries x (..., L, d) attend to context (..., M, d); any leading batch dimensions."""

    def __init__(self, config: SlotsConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.q = nn.Linear(config.d_model, config.d_model)
        self.kv = nn.Linear(config.d_model, 2 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h, hd = self.n_heads, x.shape[-1] // self.n_heads
        q = self.q(x).unflatten(-1, (h, hd)).transpose(-2, -3)  # (..., h, L, hd)
        k, v = self.kv(context).unflatten(-1, (2, h, hd)).movedim(-3, 0).transpose(-2, -3)  # (..., h, M, hd) each
        # No dropout on the attention weights: on CPU it forces the slow attention kernel.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.resid_dropout(self.proj(y.transpose(-2, -3).flatten(-2)))  # (..., L, d)


class SlotLayer(nn.Module):
    """What follows one transformer block: tokens read the slots, then (if anything reads
    the result) the slots attend to the tokens."""

    def __init__(self, config: SlotsConfig, write: bool):
        super().__init__()
        self.ln_read = nn.LayerNorm(config.d_model)
        self.read = CrossAttention(config)
        if write:
            self.ln_slots = nn.LayerNorm(config.d_model)
            self.ln_tokens = nn.LayerNorm(config.d_model)
            self.write = CrossAttention(config)


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


class SlotsTransformer(Transformer):
    config_class = SlotsConfig

    def __init__(self, config: SlotsConfig):
        slots = torch.randn(config.n_slots, config.d_model) * 0.02  # drawn before the blocks' weights
        super().__init__(config)
        self.slots = nn.Parameter(slots)
        # In "prefix" mode the last layer's slot update would have no reader.
        writes = [config.update == "recurrent" or i < config.n_layers - 1 for i in range(config.n_layers)]
        self.slot_layers = nn.ModuleList(SlotLayer(config, w) for w in writes)
        self.ln_f = self._modules.pop("ln_f")  # last, as in MemoryTransformer (same numbers per seed)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> torch.Tensor:
        if self.config.update == "prefix":
            return self._forward_prefix(x, blocked)
        return self._forward_recurrent(x, blocked)

    def memory_state(self, x: torch.Tensor, blocked: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The state hook (`tmem_bench.contracts.model`), the slots after the last token, (B, n_slots, d) each:
        "prefix", the version every writing layer leaves there ("layer<i>"); "recurrent", the slot
        state after the last chunk's update ("slots"), which no token of the sequence reads."""
        states = []
        if self.config.update == "prefix":
            self._forward_prefix(x, blocked, states)
            return {f"layer{i}": z for i, z in enumerate(states)}
        self._forward_recurrent(x, blocked, states)
        return {"slots": states[-1]}

    def _forward_prefix(self, x: torch.Tensor, blocked: torch.Tensor | None, states: list | None = None):
        B, S, D = x.shape
        n = self.config.n_slots
        mask = attention_mask(S, x.device, blocked)
        # Slot version t (n queries) may attend to tokens <= t.
        prefix = torch.ones(S, S, dtype=torch.bool, device=x.device).tril().repeat_interleave(n, dim=0)  # (S*n, S)
        z = self.slots.expand(B, S, n, D)  # (B, S, n, d): every version starts as the learned slots
        for block, slot in zip(self.blocks, self.slot_layers):
            x = block(x, mask)
            x = x + slot.read(slot.ln_read(x)[:, :, None], z)[:, :, 0]  # token t reads version t
            if hasattr(slot, "write"):
                z = z + slot.write(slot.ln_slots(z).reshape(B, S * n, D), slot.ln_tokens(x), prefix).view(B, S, n, D)
                if states is not None:
                    states.append(z[:, -1])
        return self.ln_f(x)

    def _forward_recurrent(self, x: torch.Tensor, blocked: torch.Tensor | None, states: list | None = None):
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
                if end < S or states is not None:
                    z = z + slot.write(slot.ln_slots(z), slot.ln_tokens(h))
            outs.append(h)
        if states is not None:
            states.append(z)
        return self.ln_f(torch.cat(outs, dim=1))  # (B, S, d)

    def state_size(self, seq_len: int, bytes_per_element: int = 4) -> int:
        """Bytes carried between tokens: the self-attention KV cache plus the slots ("recurrent":
        one fixed slot state; "prefix": the current version per layer and the key/value cache
        its update re-attends to)."""
        c = self.config
        if c.update == "recurrent":
            return (2 * c.n_layers * seq_len + c.n_slots) * c.d_model * bytes_per_element
        writes = c.n_layers - 1
        return (2 * c.n_layers * seq_len + 2 * writes * seq_len + c.n_layers * c.n_slots) * c.d_model * bytes_per_element


slots = SlotsTransformer.build
