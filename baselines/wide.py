"""`base_wide`: the base transformer with its MLP widened to the tensor model's parameter count.

The width is solved for, not typed in: the factory builds the `tensor` backbone with
the same size and memory options, counts its parameters, and picks the MLP hidden
width whose transformer comes closest. The parameter count of a transformer is affine
in the hidden width, so two probe widths give the exact line.
"""
from __future__ import annotations

from dataclasses import fields, replace

import torch
import torch.nn as nn

from tmem_bench.tensor_memory import tensor
from tmem_bench.transformer import Transformer, TransformerConfig

TOLERANCE = 0.05


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def matched_hidden(target: int, config: TransformerConfig, model_class: type[Transformer] = Transformer) -> int:
    """MLP hidden width at which `model_class(config)` has the parameter count closest to `target`.

    Any model built on the transformer skeleton qualifies: its MLPs are its only part
    whose size follows `config.mlp_ratio`, so its count is affine in the hidden width.
    """
    d = config.d_model

    def count(hidden: int) -> int:
        return n_params(model_class(replace(config, mlp_ratio=hidden / d)))

    with torch.device("meta"):
        lo, hi = count(d), count(2 * d)
    per_unit = (hi - lo) / d
    return max(1, round(d + (target - lo) / per_unit))


def tensor_params(d_model: int, n_layers: int, n_heads: int, **memory_options) -> int:
    """Parameters of the `tensor` backbone at these sizes, counted without initialising (or drawing) a weight."""
    with torch.device("meta"):
        return n_params(tensor(d_model=d_model, n_layers=n_layers, n_heads=n_heads, **memory_options))


def match_tensor(model_class: type[Transformer], config: TransformerConfig) -> TransformerConfig:
    """`config` with the MLP width at which `model_class` has the parameter count of `tensor`
    (default memory, same d_model, n_layers, n_heads); ValueError when no width comes within 5%."""
    target = tensor_params(config.d_model, config.n_layers, config.n_heads)
    hidden = matched_hidden(target, config, model_class)
    matched = replace(config, mlp_ratio=hidden / config.d_model)
    with torch.device("meta"):
        got = n_params(model_class(matched))
    if abs(got - target) > TOLERANCE * target:
        raise ValueError(
            f"{model_class.__name__} cannot match the tensor model's {target} parameters through its MLP width "
            f"(best: hidden {hidden}, {got} parameters)"
        )
    return matched


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
    hidden = matched_hidden(target, TransformerConfig(d_model, n_layers, n_heads, dropout))
    model = Transformer(TransformerConfig(d_model, n_layers, n_heads, dropout, hidden / d_model))
    got = n_params(model)
    if abs(got - target) > TOLERANCE * target:
        raise ValueError(
            f"base_wide cannot match the tensor model's {target} parameters with a wider MLP "
            f"(best: hidden {hidden}, {got} parameters)"
        )
    model.matched_params = target
    return model
