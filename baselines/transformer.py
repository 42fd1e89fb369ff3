"""`base` and `local`: the plain causal transformer, with full or sliding-window attention."""
from __future__ import annotations

from tmem_bench.contracts.transformer import Transformer

base = Transformer.build


class LocalTransformer(Transformer):
    windowed = True


def local(d_model: int, n_layers: int, n_heads: int, window: int = 8, **options) -> Transformer:
    """Causal sliding-window attention: each token sees itself and the window - 1 tokens before it."""
    return LocalTransformer.build(d_model, n_layers, n_heads, window=window, **options)
