"""`base_wide`: the base transformer with its MLP widened to the tensor model's parameter count.

The width is solved for, not typed in: the factory builds the `tensor` backbone with
the same size and memory options, counts its parameters, and picks the MLP hidden
width whose transformer comes closest. The parameter count of a transformer is affine
in the hidden width, so two probe widths give the exact line.
"""
from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn as nn

from tmem_bench.tensor_memory import tensor
from tmem_bench.transformer import Transformer, TransformerConfig

TOLERANCE = 0.05


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def matched_hidden(d_model: int, n_layers: int, n_heads: int, dropout: float, target: int) -> int:
    """MLP hidden width whose transformer has the parameter count closest to `target`."""
    def count(hidden: int) -> int:
        return n_params(Transformer(TransformerConfig(d_model, n_layers, n_heads, dropout, hidden / d_model)))

    with torch.device("meta"):
        lo, hi = count(d_model), count(2 * d_model)
    per_unit = (hi - lo) / d_model
    return max(1, round(d_model + (target - lo) / per_unit))


def base_wide(d_model: int, n_layers: int, n_heads: int, dropout: float = 0.1, **memory_options) -> Transformer:
    """`memory_options` are those of `tensor` (memory size, channels, ...): the match is made
    against the tensor model those options build."""
    shared = sorted(set(memory_options) & {f.name for f in fields(TransformerConfig)})
    if shared:
        raise TypeError(f"base_wide got transformer option(s) {shared}; it takes only the tensor model's memory options")
    # A private RNG stream: building the reference must not shift this model's initialisation.
    with torch.random.fork_rng(devices=[]):
        reference = tensor(d_model=d_model, n_layers=n_layers, n_heads=n_heads, dropout=dropout, **memory_options)
    target = n_params(reference)
    hidden = matched_hidden(d_model, n_layers, n_heads, dropout, target)
    model = Transformer(TransformerConfig(d_model, n_layers, n_heads, dropout, hidden / d_model))
    got = n_params(model)
    if abs(got - target) > TOLERANCE * target:
        raise ValueError(
            f"base_wide cannot match the tensor model's {target} parameters with a wider MLP "
            f"(best: hidden {hidden}, {got} parameters)"
        )
    model.matched_params = target
    return model
