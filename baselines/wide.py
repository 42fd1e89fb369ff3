"""`base_wide`: the base transformer with its MLP widened to the tensor model's parameter count.

The width is solved for, not typed in (`tmem_bench.tensor_memory.params`): the MLP
hidden width whose transformer comes closest to the `tensor` backbone of the same
size and memory options.
"""
from __future__ import annotations

from dataclasses import fields

from tmem_bench.contracts.transformer import Transformer, TransformerConfig
from tmem_bench.tensor_memory.params import match_tensor


def base_wide(d_model: int, n_layers: int, n_heads: int, dropout: float = 0.1, **memory_options) -> Transformer:
    """`memory_options` are those of `tensor` (memory size, channels, ...): the match is made
    against the tensor model those options build."""
    shared = sorted(set(memory_options) & {f.name for f in fields(TransformerConfig)})
    if shared:
        raise TypeError(f"base_wide got transformer option(s) {shared}; it takes only the tensor model's memory options")
    return Transformer(match_tensor(Transformer, TransformerConfig(d_model, n_layers, n_heads, dropout), **memory_options))
